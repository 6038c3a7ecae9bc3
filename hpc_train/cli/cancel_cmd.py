"""``cancel JOB|SWEEP``."""

from __future__ import annotations

import argparse

from hpc_train.cli.remote_option import add_remote_option


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("cancel", help="cancel a job, or every task of a sweep")
    parser.add_argument("job_id", help="a job id, or a sweep id (its first array's job id)")
    add_remote_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.jobs.handle import JobHandle
    from hpc_train.sweeps.handle import SweepHandle, SweepRecord

    if SweepRecord.exists(args.job_id):
        sweep = SweepHandle.from_id(args.job_id)
        sweep.cancel()
        print(f"cancelled sweep {args.job_id} (arrays {', '.join(sweep.array_ids)})")
        return 0
    handle = JobHandle.from_id(args.job_id)
    handle.cancel()
    print(f"cancelled job {handle.job_id}")
    return 0
