"""``status JOB [--watch]``: the scheduler's state, where it runs, where its logs are; or its life as it goes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpc_train.cli.remote_option import add_remote_option


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("status", help="state of a submitted job or sweep")
    parser.add_argument("job_id")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--watch", "-w", action="store_true", help="follow the job until it ends: pending reason, nodes, requeues, step and loss"
    )
    add_remote_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.jobs.handle import JobHandle
    from hpc_train.sweeps.handle import SweepRecord

    if SweepRecord.exists(args.job_id):  # a sweep: counts per state and its failed tasks
        from hpc_train.cli.resubmit_cmd import print_status

        return print_status(args.job_id, args.json)
    handle = JobHandle.from_id(args.job_id)
    if args.watch:
        from hpc_train.jobs.progress import watch

        watch(handle)
        return 0
    record = handle.record
    info = handle.accounting() if record.scheduler == "slurm" else {}
    state = handle.state
    data = {
        "job_id": handle.job_id,
        "state": state,
        "site": record.site,
        "backend": record.backend,
        "kind": record.kind,
        "nodes": record.nodes,
        "procs_per_node": record.procs_per_node,
        "node_list": info.get("NodeList", ""),
        "elapsed": info.get("Elapsed", ""),
        "exit_code": info.get("ExitCode", ""),
        "runs": handle.runs,
        "folder": str(handle.folder),
        "log": str(handle.log_path(0)),
        "cause": _cause(handle.folder) if state == "FAILED" else None,
        "code": code_line(record.code),
        **handle.story(state).as_dict(),  # why: retried how often and from where, or why not; retries; not_retried
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    runs = handle.runs
    print(f"job {handle.job_id}: {state}" + (f" (run {runs}, {runs - 1} restart{'s' if runs != 2 else ''})" if runs > 1 else ""))
    for key in (
        "site",
        "backend",
        "kind",
        "nodes",
        "procs_per_node",
        "node_list",
        "elapsed",
        "exit_code",
        "why",
        "cause",
        "code",
        "folder",
        "log",
    ):
        if data[key] not in ("", None):
            print(f"  {key.replace('_', ' ')}: {data[key]}")
    return 0


def code_line(code: dict | None) -> str | None:
    """What the job runs: "commit 1a2b3c4d (main, with uncommitted changes), snapshot 9f8e..." or None."""
    if not code:
        return None
    prov = code.get("provenance") or {}
    parts = []
    if prov.get("commit"):
        where = ", ".join(filter(None, [prov.get("branch"), "with uncommitted changes" if prov.get("dirty") else None]))
        parts.append(f"commit {prov['commit'][:12]}" + (f" ({where})" if where else ""))
    parts.append(f"snapshot {str(code.get('digest', ''))[:12]} of {code.get('project', '?')}")
    return ", ".join(parts)


def _cause(folder: Path) -> str | None:
    from hpc_train.jobs.cause import failure_cause

    return failure_cause(folder)
