"""``preflight``: measure all-reduce bus bandwidth across an allocation; PASS/FAIL against the site's figure."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "preflight",
        help="measure all-reduce bandwidth on N nodes and judge it",
        description="Submit a short job measuring all-reduce bus bandwidth (1 MB up) and "
        "every node pair; compare with the site's preflight figures.",
    )
    parser.add_argument("--site", help="site name or path (default: detected)")
    parser.add_argument("--nodes", "-N", type=int, default=2, help="nodes (default: 2)")
    parser.add_argument("--partition", "-p")
    parser.add_argument("--nccl-profile", help="NCCL profile (default: the partition's)")
    parser.add_argument("--nccl-debug", action="store_true", help="add the debug overlay (NCCL_DEBUG=INFO ...)")
    parser.add_argument("--max-size", help="largest message, e.g. 8G (default: the site's preflight.max_size)")
    parser.add_argument("--iters", type=int, default=5, help="timed all-reduces per size (default: 5)")
    parser.add_argument("--expect", type=float, metavar="GBS", help="expected bus bandwidth, overriding the site's")
    parser.add_argument("--job-root", help="folder for the job's folder (default: the site's job_root)")
    parser.add_argument("--json", action="store_true", help="print the raw results and verdict as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.errors import SchedulerError
    from hpc_train.fabric.preflight import PreflightJob, evaluate, format_table, read_result, submit_preflight

    profile = (args.nccl_profile or "") + "+debug" if args.nccl_debug else args.nccl_profile
    handle, expect = submit_preflight(
        PreflightJob(
            site=args.site,
            nodes=args.nodes,
            partition=args.partition,
            nccl_profile=profile,
            max_size=args.max_size,
            iters=args.iters,
            job_root=args.job_root,
        )
    )
    print(f"preflight: job {handle.job_id} on {args.nodes} node(s); waiting", file=sys.stderr)
    state = handle.wait()
    result = read_result(handle.folder)
    if result is None:
        raise SchedulerError(
            f"preflight job {handle.job_id}",
            f"ended {state} without results",
            f"python -m hpc_train logs {handle.job_id} (every rank: --rank N)",
        )
    if args.expect is not None:
        expect = dataclasses.replace(expect, busbw_gbs=args.expect)
    verdict = evaluate(result, expect)
    if args.json:
        print(
            json.dumps(
                {
                    "job_id": handle.job_id,
                    "passed": verdict.passed,
                    "findings": verdict.lines,
                    "suspects": verdict.suspects,
                    "result": result,
                },
                indent=1,
            )
        )
    else:
        sys.stdout.write(format_table(result, verdict))
    return 0 if verdict.passed else 1
