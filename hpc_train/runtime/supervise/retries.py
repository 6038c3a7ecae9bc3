"""The job folder's record of each retry decision: whether a run that failed or stopped is retried, and why.

Two places decide: the batch script after a failed run (templates/sbatch/base.sh.j2, through
``python -m hpc_train.runtime.supervise.between_runs decided``) and rank 0 after a run stopped for the time limit
(hpc_train.runtime.checkpoint.stop). Their log lines said why; the login side (``status``, the end of
``submit --wait``, ``JobHandle.why``: hpc_train.jobs.retry_decision) reads this record instead of logs.

One JSON line per decision in ``retries.jsonl`` (contract.RETRIES)::

    {"run": 2, "status": 1, "action": "not_retried", "reason": "no_progress", "detail": "...",
     "start_step": -1, "max_restarts": 10, "time": 1700000000.0}

``start_step`` is the newest committed step when the run began (contract.RUN_START_STEP, -1: none), so a
retried job's record says which step each run continued from. Torch-free: the batch node runs it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_train import contract

ACTIONS = ("requeued", "restarted", "not_retried", "not_started")  # not_started: the budget refused a run at its start


def _start_step(job_folder: Path, run: int) -> int | None:
    try:
        recorded_run, step = (job_folder / contract.RUN_START_STEP).read_text().split()
        return int(step) if int(recorded_run) == run else None
    except (OSError, ValueError):
        return None  # no record of this run's start (health start did not run, or a full disk)


def no_retry_text(environ: Mapping[str, str]) -> str | None:
    """What the no-retry file says (hpc_train.runtime.lifecycle.no_retry); None: no file, or an empty one."""
    path = environ.get(contract.ENV_NO_RETRY_FILE)
    if not path:
        return None
    try:
        return Path(path).read_text(errors="replace").strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Decision:
    """What was decided after run ``run`` (which ended with ``status``): ``action`` (ACTIONS), ``reason``
    (contract.RETRY_REASONS) and, for a run not retried, ``detail`` (default: the no-retry file's text)."""

    run: int
    status: int
    action: str
    reason: str
    detail: str | None = None


def record(job_folder: Path, decision: Decision, environ: Mapping[str, str] | None = None) -> None:
    """Append one decision (``environ``: where the no-retry file and the restart budget are named)."""
    if decision.action not in ACTIONS or decision.reason not in contract.RETRY_REASONS:
        raise ValueError(f"not a retry decision: {decision.action} {decision.reason}")
    env = os.environ if environ is None else environ
    budget = env.get(contract.ENV_MAX_RESTARTS)
    detail = decision.detail
    if detail is None and decision.action.startswith("not_"):
        detail = no_retry_text(env)
    line = {
        "run": decision.run,
        "status": decision.status,
        "action": decision.action,
        "reason": decision.reason,
        "detail": detail,
        "start_step": _start_step(job_folder, decision.run),
        "max_restarts": int(budget) if budget and budget.isdigit() else None,
        "time": round(time.time(), 3),
    }
    with open(job_folder / contract.RETRIES, "a") as out:  # one write: lines of two writers never interleave
        out.write(json.dumps(line) + "\n")


def record_here(status: int, action: str, reason: str, detail: str | None = None) -> None:
    """:func:`record` for the run this process belongs to; a job without a folder or without requeue has
    nothing to decide, and a full disk must not fail the run (its log line says the same)."""
    env = os.environ
    if not env.get(contract.ENV_JOB_FOLDER) or not env.get(contract.ENV_REQUEUED_FILE):
        return
    try:
        run = int(env.get(contract.ENV_RUN) or 1)
        record(Path(env[contract.ENV_JOB_FOLDER]), Decision(run, status, action, reason, detail))
    except OSError as exc:
        print(f"hpc_train: could not record the retry decision ({exc})", file=sys.stderr, flush=True)
