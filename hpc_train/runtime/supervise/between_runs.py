"""What the batch script asks between runs: where the run began, and what to do after it failed.

``python -m hpc_train.runtime.supervise.between_runs start`` records the newest committed checkpoint as the run
begins; ``... nodes`` picks the nodes of the allocation the run uses (with spare nodes: the first
ones that are not suspect); ``... failed`` decides after a failed run:

- a crash with a culprit (the ranks of one node failed first, hpc_train.runtime.supervise.hang_report) names
  the node as a suspect, like a hang the watchdog ended;
- the no-progress rule: a restart that ends without a checkpoint newer than the one it began from
  would only repeat itself; it writes the no-retry file with the reason, so the loop ends now, not
  when the restart budget is gone;
- the suspect nodes the next run must avoid, when the partition has enough nodes without them
  (written to the exclude file; the script applies it once it has requeued the job).

``... decided ACTION REASON --status N`` records what the script then did, and why, for the login side
(hpc_train.runtime.supervise.retries).

Torch-free and quick: it runs on the batch node between the runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from hpc_train import contract, scontrol
from hpc_train.runtime.log import log
from hpc_train.runtime.supervise import retries
from hpc_train.runtime.supervise.hang_report import first_failures
from hpc_train.runtime.supervise.suspects import NODE_CHECK_REASON, read_suspects, record_suspect
from hpc_train.runtime.supervise.watchdog import read_beats


def newest_step(job_folder: Path) -> int:
    return contract.newest_step(job_folder / contract.CHECKPOINTS)


def record_start(job_folder: Path, run: int) -> None:
    (job_folder / contract.RUN_START_STEP).write_text(f"{run} {newest_step(job_folder)}\n")


def start_step(job_folder: Path, run: int) -> int | None:
    try:
        recorded_run, step = (job_folder / contract.RUN_START_STEP).read_text().split()
    except (OSError, ValueError):
        return None
    return int(step) if int(recorded_run) == run else None


def no_progress(job_folder: Path, run: int) -> str | None:
    """Why retrying is pointless, or None: a restart that committed nothing past where it began."""
    began = start_step(job_folder, run)
    if run < 2 or began is None or newest_step(job_folder) > began:
        return None
    where = f"step {began}" if began >= 0 else "the start (no checkpoint)"
    return (
        f"run {run} was a restart and failed without getting past {where}, as the run before it did; "
        "a crash loop would only use up the restart budget and queue time"
    )


def node_check_failed(job_folder: Path, run: int) -> set[str]:
    """The nodes that failed this run's node check (hpc_train.runtime.supervise.node_check): the run never trains on them."""
    return {
        str(s["node"])
        for s in read_suspects(job_folder)
        if s.get("run") == run and str(s.get("reason", "")).startswith(NODE_CHECK_REASON)
    }


def name_crash_culprit(job_folder: Path, heartbeats: Path | None, run: int, environ: Mapping[str, str]) -> None:
    if heartbeats is None or any(s.get("run") == run for s in read_suspects(job_folder)):
        return  # the watchdog (or the node check) named this run's suspect already
    culprits = first_failures(read_beats(heartbeats, run))
    for host in sorted({c.host for c in culprits}):
        log(f"run {run}: the ranks on {host} failed first ({', '.join(str(c.rank) for c in culprits)})")
        record_suspect(job_folder, host, run, "failed first", environ)


def partition_nodes(job_id: str) -> tuple[int, int, set[str]] | None:
    """(nodes the job needs, nodes in its partition, nodes it already excludes) from the controller."""
    info = scontrol.show("job", job_id)
    part = scontrol.show("partition", info.get("Partition", "")) if info else {}
    try:
        needed, total = int(info["NumNodes"].split("-")[0]), int(part["TotalNodes"])
    except (KeyError, ValueError):
        return None
    excluded = {n for n in (info.get("ExcNodeList") or "").split(",") if n and n != "(null)"}
    return needed, total, excluded


def plan_exclusion(job_folder: Path, job_id: str | None) -> str | None:
    """The ExcNodeList for the next run: every suspect so far, if the partition can still place the job."""
    nodes = {str(s["node"]) for s in read_suspects(job_folder)}
    if not nodes or not job_id:
        return None
    known = partition_nodes(job_id)
    if known is None:
        return None
    needed, total, excluded = known
    wanted = excluded | nodes
    if total - len(wanted) < needed:
        log(f"not excluding {', '.join(sorted(nodes))}: the partition has {total} nodes and the job needs {needed}")
        return None
    log(f"the next run avoids {', '.join(sorted(nodes))} (suspect nodes: {contract.SUSPECT_NODES} in the job folder)")
    return ",".join(sorted(wanted))


def step_nodes(job_folder: Path, environ: Mapping[str, str], anyway: bool = False) -> list[str] | None:
    """The nodes of the allocation the next step runs on: the first N not suspect; None if too few are
    left, unless ``anyway`` (a run's first step: the allocation is what Slurm gave, suspects and all --
    but never a node that failed this run's node check)."""
    needed = int(environ.get(contract.ENV_NODES) or 1)
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", environ.get("SLURM_JOB_NODELIST", "")],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, **environ},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    allocated = out.stdout.split()
    avoid = {str(s["node"]) for s in read_suspects(job_folder)}
    healthy = [node for node in allocated if node not in avoid]
    if len(healthy) < needed:
        log(f"{len(healthy)} of the allocation's {len(allocated)} nodes are not suspect; the run needs {needed}")
        run = int(environ.get(contract.ENV_RUN) or 1)
        usable = healthy + [n for n in allocated if n in avoid and n not in node_check_failed(job_folder, run)]
        if not anyway or len(usable) < needed:
            return None
        return usable[:needed]
    return healthy[:needed]


def after_failure(job_folder: Path, run: int, environ: Mapping[str, str]) -> None:
    heartbeats = Path(environ[contract.ENV_HEARTBEATS]) if environ.get(contract.ENV_HEARTBEATS) else None
    name_crash_culprit(job_folder, heartbeats, run, environ)
    # a run stopped by its node check never trained: it says nothing about progress
    reason = None if node_check_failed(job_folder, run) else no_progress(job_folder, run)
    no_retry = environ.get(contract.ENV_NO_RETRY_FILE)
    if reason and no_retry and not os.path.exists(no_retry):
        Path(no_retry).write_text(reason + "\n")
    exclude = job_folder / contract.EXCLUDE_NODES
    exclude.unlink(missing_ok=True)
    if environ.get(contract.ENV_EXCLUDE_SUSPECTS) == "1":
        wanted = plan_exclusion(job_folder, environ.get("SLURM_JOB_ID"))
        if wanted:
            exclude.write_text(wanted + "\n")


def decided(job_folder: Path, run: int, environ: Mapping[str, str], action: str, reason: str, status: int) -> None:
    """Record the script's decision after run ``run``. The script sees only that the no-retry file exists;
    the file holds this module's no-progress reason when that rule wrote it, and a rank's fault otherwise.
    A fault that would repeat is named over --on-failure fail: a retry would not have helped either."""
    said = retries.no_retry_text(environ)
    if reason in ("no_retry", "on_failure") and said:
        reason = "no_progress" if said == no_progress(job_folder, run) else "no_retry"
    retries.record(job_folder, retries.Decision(run, status, action, reason), environ=environ)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.runtime.supervise.between_runs")
    parser.add_argument("what", choices=["start", "failed", "nodes", "decided"])
    parser.add_argument("action", nargs="?", choices=retries.ACTIONS, help="decided: what the script did")
    parser.add_argument("reason", nargs="?", choices=contract.RETRY_REASONS, help="decided: why")
    parser.add_argument("--status", type=int, default=1, help="decided: the run's exit status")
    parser.add_argument("--anyway", action="store_true", help="nodes: suspects too, when the healthy ones are too few")
    args = parser.parse_args(argv)
    if not os.environ.get(contract.ENV_JOB_FOLDER):
        log(f"health {args.what}: {contract.ENV_JOB_FOLDER} is not set: not inside an hpc_train batch script")
        return 1 if args.what == "nodes" else 0
    job_folder, run = Path(os.environ[contract.ENV_JOB_FOLDER]), int(os.environ.get(contract.ENV_RUN) or 1)
    try:
        if args.what == "nodes":  # prints the step's nodes; exit 1 when the healthy ones are too few
            nodes = step_nodes(job_folder, os.environ, anyway=args.anyway)
            if nodes is None:
                return 1
            print(",".join(nodes))
        elif args.what == "start":
            record_start(job_folder, run)
        elif args.what == "decided":
            decided(job_folder, run, os.environ, args.action or "not_retried", args.reason or "failed", args.status)
        else:
            after_failure(job_folder, run, os.environ)
    except OSError as exc:  # a full disk: the script's own rules (budget, no-retry file) still hold
        log(f"health {args.what}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
