"""``diagnose JOB``: how each run of a job ended and why, and where its allocation went (goodput).

Works without metrics: the batch log, the watchdog's and the failure path's files and Slurm's
accounting say how the runs ended even for a script that never reached a step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "diagnose",
        help="how each run ended (hangs, failures, requeues) and the job's goodput",
        description="Per run: hosts, steps, how it ended (completed, requeued, failed with its "
        "exit status, hung: the rank, host, last step and top of its stack), suspect "
        "nodes and stragglers; then the allocation's goodput and lost time by cause.",
    )
    parser.add_argument("job_id", metavar="JOB", help="job id, or a job folder")
    parser.add_argument("--json", action="store_true", help="as JSON")
    parser.add_argument(
        "--no-sacct",
        dest="sacct",
        action="store_false",
        help="do not ask Slurm's accounting; estimate the allocations from the job's own files",
    )
    return parser


def job_folder(job: str) -> Path:
    """A job's folder from its id (the record this machine keeps) or the folder itself."""
    folder = Path(job)
    if folder.is_dir():
        return folder
    if "/" in job:
        from hpc_train.errors import UsageError

        raise UsageError(f"no folder {job}", hint="give a job id or a job's folder")
    from hpc_train.jobs.handle import JobHandle

    return JobHandle.from_id(job).folder


def run(args: argparse.Namespace) -> int:
    from hpc_train.jobs import goodput

    folder = job_folder(args.job_id)
    summary = goodput.as_dict(goodput.load(folder, sacct=args.sacct))
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"job {summary['job_id'] or folder.name} ({folder})")
    print("\n".join(goodput.format_lines(summary)))
    return 0
