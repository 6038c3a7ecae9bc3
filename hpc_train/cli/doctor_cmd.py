"""``doctor``: check this node, or (``--submit``) every node of an allocation, for what jobs need."""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "doctor",
        help="check GPUs, fabric, versions, Slurm and packages; say what to fix",
        description="Check this node (or, with --submit, the compute nodes) for what the site's jobs need.",
    )
    parser.add_argument("--site", help="site name or path (default: detected)")
    parser.add_argument("--partition", "-p", help="partition whose GPUs and NCCL profile to check against")
    parser.add_argument("--nccl-profile", help="NCCL profile to check (default: the partition's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--submit", action="store_true", help="run the doctor on the compute nodes as a short job")
    parser.add_argument("--nodes", "-N", type=int, default=1, help="nodes to check with --submit (default: 1)")
    parser.add_argument("--job-root", help="folder for the job's folder (default: the site's job_root)")
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.fabric.doctor import (
        FAIL,
        Report,
        context_for,
        diagnose,
        format_report,
    )

    if args.submit:
        reports = _submit(args)
    else:
        from hpc_train.api import resolve_site
        from hpc_train.plugin.manager import default_plugins

        plugins = default_plugins()
        resolved = resolve_site(args.site, plugins)
        ctx = context_for(resolved, args.partition, args.nccl_profile, os.environ)
        reports = [diagnose(ctx, backends=plugins.backends)]
    if args.json:
        print(json.dumps([r.to_dict() for r in reports] if args.submit else reports[0].to_dict(), indent=1))
    else:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        sys.stdout.write("\n".join(format_report(r, color) for r in reports))
    return 1 if any(isinstance(r, Report) and r.status == FAIL for r in reports) else 0


def _submit(args: argparse.Namespace) -> list:
    """One task per node runs hpc_train.fabric.doctor.node_report; each writes its report into the job folder."""
    from hpc_train.api import submit
    from hpc_train.errors import SchedulerError
    from hpc_train.fabric.doctor import Report, node_report

    options = {
        "site": args.site,
        "nodes": args.nodes,
        "procs_per_node": 1,
        "time": "00:05:00",
        "partition": args.partition,
        "job_name": "hpc_train-doctor",
        "job_root": args.job_root,
    }
    handle = submit(
        node_report, args.site, args.partition, args.nccl_profile, **{k: v for k, v in options.items() if v is not None}
    )
    print(f"doctor: job {handle.job_id} on {args.nodes} node(s); waiting", file=sys.stderr)
    state = handle.wait()
    folder = handle.folder / "doctor"
    reports = [Report.from_dict(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    if not reports and state == "COMPLETED":  # the local site has no shared job folder: task 0's return value
        reports = [Report.from_dict(handle.result())]
    if not reports:
        raise SchedulerError(
            f"doctor job {handle.job_id}", f"ended {state} without reports", f"python -m hpc_train logs {handle.job_id}"
        )
    return reports
