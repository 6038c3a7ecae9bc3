"""``logs JOB [--rank N | --all] [--follow]``: a rank's output (rank 0 by default), or every rank's, prefixed."""

from __future__ import annotations

import argparse
import sys

from hpc_train.cli.remote_option import add_remote_option


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("logs", help="print a job's output")
    parser.add_argument("job_id")
    parser.add_argument("--rank", type=int, default=0, help="whose output (default: rank 0)")
    parser.add_argument("--stderr", action="store_true", help="the error stream instead of the output")
    parser.add_argument("--all", action="store_true", help="every rank's output, each line prefixed with its ranks")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends (through requeues)")
    add_remote_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.jobs.handle import JobHandle

    handle = JobHandle.from_id(args.job_id)
    stream = "stderr" if args.stderr else "stdout"
    if args.follow:
        from hpc_train.jobs.follow import follow

        follow(handle, rank=args.rank, stream=stream, all_ranks=args.all)
        return 0
    if args.all:
        from hpc_train.jobs.follow import print_logs

        if not print_logs(handle, stream):
            print(f"no {stream} yet for job {handle.job_id}; state: {handle.state}", file=sys.stderr)
            return 1
        return 0
    path = handle.log_path(args.rank, stream)
    if not path.exists():
        print(f"no {stream} yet for job {handle.job_id} rank {args.rank} ({path}); state: {handle.state}", file=sys.stderr)
        return 1
    sys.stdout.write(path.read_text(errors="replace"))
    return 0
