"""``submit``: send the job; print its id and where its logs are (or only the id with --parsable)."""

from __future__ import annotations

import argparse
import sys

from hpc_train.cli.options import add_job_options, add_sweep_options, job_options
from hpc_train.cli.remote_option import add_remote_option


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "submit", help="submit a training script", description="Submit a training script; arguments after -- go to the script."
    )
    add_job_options(parser)
    add_sweep_options(parser)
    w = parser.add_argument_group("after submitting")
    w.add_argument("--wait", action="store_true", help="show the job's progress and return when it ends, with its exit status")
    w.add_argument("--follow", "-f", action="store_true", help="stream rank 0's output until the job ends (implies --wait)")
    w.add_argument("--parsable", action="store_true", help="print only the job id, as sbatch --parsable does")
    add_remote_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.api import submit

    options = job_options(args)
    script = options.pop("script")
    script_args = options.pop("script_args")
    if args.sweep or args.max_concurrent is not None:
        from hpc_train.cli.resubmit_cmd import submit_sweep

        return submit_sweep(args, script, script_args, options)
    handle = submit(script, *script_args, **options)
    if args.parsable:
        print(handle.job_id)
    else:
        record = handle.record
        print(
            f"Submitted job {handle.job_id} to site {record.site} "
            f"({record.nodes} node(s) x {record.procs_per_node} process(es), backend {record.backend})"
        )
        print(f"  folder: {handle.folder}")
        print(f"  logs:   {handle.log_path(0)}")
        print(f"  status: python -m hpc_train status {handle.job_id}")
    sys.stdout.flush()
    if not (args.wait or args.follow):
        return 0
    if args.follow:
        from hpc_train.jobs.follow import follow

        state = follow(handle)
    elif args.parsable:
        state = handle.wait()
    else:
        from hpc_train.jobs.progress import watch

        state = watch(handle, sys.stderr)  # stderr: stdout stays the submission's few lines
    code = handle.exit_code()
    if not args.parsable:
        print(f"job {handle.job_id} {state} (exit {code})", file=sys.stderr)
        why = handle.story(state).why  # retried, or why not: decided on the compute side, said here
        if why:
            print(f"  why: {why}", file=sys.stderr)
        if state == "FAILED":
            from hpc_train.jobs.cause import failure_cause

            cause = failure_cause(handle.folder)
            if cause:
                print(f"  cause: {cause}\n  all of it: python -m hpc_train logs {handle.job_id} --stderr", file=sys.stderr)
    return code
