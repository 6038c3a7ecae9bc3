"""``resubmit SWEEP --failed``: run a sweep's failed tasks again, in their own folders.

Also home to the sweep halves of ``submit --sweep`` and ``status SWEEP``, so those commands each
need one line to reach them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "resubmit",
        help="submit a sweep's failed tasks again",
        description="Submit again the tasks of a sweep that ended other than COMPLETED "
        "(or the tasks given); each resumes in its own folder.",
    )
    parser.add_argument("sweep_id", metavar="SWEEP", help="the sweep's id (its first array's job id)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--failed", action="store_true", help="the tasks that failed, timed out or were cancelled")
    which.add_argument("--task", type=int, action="append", metavar="N", help="this task (repeatable)")
    parser.add_argument("--parsable", action="store_true", help="print only the new arrays' job ids")
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.sweeps.handle import SweepHandle

    handle = SweepHandle.from_id(args.sweep_id)
    tasks = None if args.failed else args.task
    chosen = handle.failed() if tasks is None else sorted(set(tasks))
    arrays = handle.resubmit(chosen)
    if args.parsable:
        print(",".join(arrays))
        return 0
    print(f"Resubmitted {len(chosen)} task(s) of sweep {handle.sweep_id} as array(s) {', '.join(arrays)}: {_task_list(chosen)}")
    print(f"  status: python -m hpc_train status {handle.sweep_id}")
    return 0


def _task_list(tasks: list[int], limit: int = 20) -> str:
    text = ", ".join(str(t) for t in tasks[:limit])
    return text + (f", ... ({len(tasks)} in all)" if len(tasks) > limit else "")


def submit_sweep(args: argparse.Namespace, script: str, script_args: list[str], options: dict[str, Any]) -> int:
    """``submit --sweep NAME=V1,V2 ...``: the sweep's id, folder and how to follow it."""
    from hpc_train.errors import UsageError
    from hpc_train.sweeps.arrays import parse_cli
    from hpc_train.sweeps.submit import sweep

    if not args.sweep:
        raise UsageError("--max-concurrent limits a sweep: add --sweep NAME=V1,V2")
    if args.follow:
        raise UsageError("--follow streams one job's output; a sweep has many: use --wait, then `logs`/`status`")
    handle = sweep(script, *script_args, over=parse_cli(args.sweep), max_concurrent=args.max_concurrent, **options)
    if args.parsable:
        print(handle.sweep_id)
    else:
        arrays = handle.array_ids
        print(
            f"Submitted sweep {handle.sweep_id}: {len(handle)} task(s) in {len(arrays)} array(s) "
            f"({', '.join(arrays)}) to site {handle.record.site}"
        )
        print(f"  folder: {handle.folder}  (task N works in {handle.folder}/N)")
        print(f"  status: python -m hpc_train status {handle.sweep_id}")
    sys.stdout.flush()
    if not args.wait:
        return 0
    counts = handle.wait()
    failed = handle.failed(poll=False)
    if not args.parsable:
        print(f"sweep {handle.sweep_id}: " + ", ".join(f"{n} {state}" for state, n in counts.items()), file=sys.stderr)
    return 1 if failed else 0


def print_status(sweep_id: str, as_json: bool) -> int:
    """``status SWEEP``: counts per state and the tasks that failed."""
    from hpc_train.sweeps.handle import SweepHandle

    handle = SweepHandle.from_id(sweep_id)
    counts = handle.counts()
    states = handle.states()
    failed = handle.failed(poll=False, confirm=False)
    data: dict[str, Any] = {
        "sweep_id": handle.sweep_id,
        "tasks": len(handle),
        "arrays": handle.array_ids,
        "counts": counts,
        "failed": [
            {"task": t, "state": states[t], "overrides": handle.overrides(t), "log": str(handle.log_path(t))} for t in failed
        ],
        "folder": str(handle.folder),
        "site": handle.record.site,
        "backend": handle.record.backend,
    }
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"sweep {handle.sweep_id}: {len(handle)} task(s) in array(s) {', '.join(handle.array_ids)}")
    print("  " + "  ".join(f"{state} {n}" for state, n in counts.items()))
    print(f"  folder: {handle.folder}")
    if failed:
        print(f"  failed ({len(failed)}; `python -m hpc_train resubmit {handle.sweep_id} --failed` runs them again):")
        for item in data["failed"][:50]:
            values = " ".join(f"{k}={v}" for k, v in item["overrides"].items())
            print(f"    task {item['task']} {item['state']}: {values}  log: {item['log']}")
        if len(failed) > 50:
            print(f"    ... and {len(failed) - 50} more (--json lists them all)")
    return 0
