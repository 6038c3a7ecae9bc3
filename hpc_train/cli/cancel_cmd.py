"""``cancel JOB``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("cancel", help="cancel a job")
    parser.add_argument("job_id")
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.handle import JobHandle

    handle = JobHandle.from_id(args.job_id)
    handle.cancel()
    print(f"cancelled job {handle.job_id}")
    return 0
