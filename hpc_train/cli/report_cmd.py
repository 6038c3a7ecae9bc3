"""``report JOB``: what the run did (duration, restarts, steps, throughput, communication, loss, goodput) and plots of it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpc_train.cli.remote_option import add_remote_option


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "report",
        help="summary and plots of a job's metrics",
        description="Summarise a job's metrics and write PNG plots of loss, throughput and communication share over steps.",
    )
    parser.add_argument("job_id", metavar="JOB", help="job id, or a job / metrics folder")
    parser.add_argument("--out", "-o", metavar="DIR", help="where the PNGs go (default: <job folder>/report)")
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="the summary only")
    parser.add_argument("--json", action="store_true", help="the summary as JSON")
    parser.add_argument(
        "--no-goodput",
        dest="goodput",
        action="store_false",
        help="leave out the goodput section (lost time by cause, GPU-hours, how each run ended)",
    )
    parser.add_argument(
        "--no-sacct",
        dest="sacct",
        action="store_false",
        help="do not ask Slurm's accounting; estimate the allocations from the job's own files",
    )
    add_remote_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.jobs import goodput, report, traces

    folder = Path(args.job_id)
    title = None
    if not folder.is_dir():
        if "/" in args.job_id:
            from hpc_train.errors import UsageError

            raise UsageError(f"no folder {args.job_id}", hint="give a job id or a job's folder")
        from hpc_train.jobs.handle import JobHandle

        handle = JobHandle.from_id(args.job_id)
        folder, title = handle.folder, f"job {handle.job_id}"
    metrics = report.load(folder)
    summary = report.summarize(metrics)
    job_folder = metrics.path.parent.parent if metrics.path.parent.name == "metrics" else metrics.path.parent
    summary["profile"] = traces.summary(job_folder)  # None without --profile
    if args.goodput:
        summary["goodput"] = goodput.as_dict(goodput.load(job_folder, sacct=args.sacct))
    plots: list[Path] = []
    if args.plots and metrics.rows:
        out = Path(args.out) if args.out else metrics.path.parent.parent / "report"
        plots = report.plot(metrics, out, title=title)
    summary["plots"] = [str(p) for p in plots]
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(report.format_summary(summary))
    for path in plots:
        print(f"  plot            {path}")
    return 0
