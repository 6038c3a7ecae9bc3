"""What happened to a job's runs, where the user looks: why it was not retried, or how often it was and from where.

The decisions are made on the compute side, by the batch script and rank 0, and recorded in the job
folder's ``retries.jsonl`` (hpc_train.runtime.supervise.retries); before that record, only rank 0's stderr log
said why a crash loop stopped after 2 runs of a budget of 10. ``status`` (text and ``--json``), the end
of ``submit --wait`` and ``JobHandle.why`` all read it here. A job with requeue off writes no record: the
login side knows that from the job's own record. Torch-free, like all of the login side.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.jobs.poll import runs_started
from hpc_train.jobs.states import ACTIVE_STATES, FINAL_OK

# why a run was not retried, in the user's words; the record's detail follows where there is one
_NOT_RETRIED = {
    "no_progress": "the no-progress rule stopped a crash loop",
    "no_retry": "the failure would repeat on a retry",
    "restart_budget": "the restart budget is spent",
    "on_failure": "--on-failure is fail: a failed run is not retried (--on-failure requeue retries it)",
    "requeue_failed": "the requeue did not go through",
    "requeue_off": "requeue is off for this job (--no-requeue, or the site's default)",
}
_CAME = {"requeued": "requeued", "restarted": "restarted inside the allocation"}
_AFTER = {"failed": "a failure", "stopped": "a stop"}


@dataclass(frozen=True)
class Retry:
    """One run after the first: how it came (requeued, restarted inside the allocation), after what, from where."""

    run: int
    how: str  # requeued, restarted
    after: str | None  # failed, stopped (the time limit); None: no record says (a preemption, Slurm's own requeue)
    from_step: int | None  # the newest committed step when it began; -1: none (from the start); None: unknown


@dataclass(frozen=True)
class NotRetried:
    """The job's last run, which was not retried, and why."""

    run: int
    reason: str  # a contract.RETRY_REASONS key, or "requeue_off"
    detail: str | None = None
    max_restarts: int | None = None


@dataclass(frozen=True)
class Story:
    retries: list[Retry] = field(default_factory=list)
    not_retried: NotRetried | None = None

    @property
    def why(self) -> str | None:
        """One line: how often the job was retried and from which steps, then why it was not retried again."""
        parts = [p for p in (retried_line(self.retries), not_retried_line(self.not_retried)) if p]
        return "; ".join(parts) or None

    def as_dict(self) -> dict[str, Any]:
        return {
            "why": self.why,
            "retries": [asdict(r) for r in self.retries],
            "not_retried": asdict(self.not_retried) if self.not_retried else None,
        }


def read_records(folder: Path) -> dict[int, dict[str, Any]]:
    """Each run's decision; a later line for a run replaces an earlier one (the script records a requeue
    before asking for it, and the failure of the requeue after). Garbled lines are skipped."""
    try:
        text = (folder / contract.RETRIES).read_text(errors="replace")
    except OSError:
        return {}
    found: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and isinstance(item.get("run"), int):
            found[item["run"]] = item
    return found


def current_start_step(folder: Path) -> tuple[int, int] | None:
    """(run, step) from contract.RUN_START_STEP: where the newest run began, before it has ended."""
    try:
        run, step = (folder / contract.RUN_START_STEP).read_text().split()
        return int(run), int(step)
    except (OSError, ValueError):
        return None


def retries(folder: Path, records: dict[int, dict[str, Any]]) -> list[Retry]:
    """Every run after the first: the run before it decided the retry, the run itself recorded its start."""
    started = current_start_step(folder)
    found = []
    for run in range(2, runs_started(folder) + 1):
        before, own = records.get(run - 1, {}), records.get(run, {})
        if own.get("action") == "not_started":
            continue  # counted, then refused by the restart budget at its start: it never ran
        step = own.get("start_step")
        if step is None and started and started[0] == run:
            step = started[1]
        retried = before.get("action") in _CAME  # else something outside the job requeued it
        found.append(
            Retry(run, str(before["action"]) if retried else "requeued", before.get("reason") if retried else None, step)
        )
    return found


def not_retried(records: dict[int, dict[str, Any]], runs: int, state: str, requeue: bool) -> NotRetried | None:
    """Why the job's last run was not retried; None while it runs, once it completed, or with no word of why."""
    if state in ACTIVE_STATES or state in FINAL_OK:
        return None
    last = records.get(runs)
    if last and last.get("action") in ("not_retried", "not_started"):
        budget = last.get("max_restarts")
        return NotRetried(runs, str(last.get("reason")), last.get("detail"), budget if isinstance(budget, int) else None)
    if not requeue and state == "FAILED":
        return NotRetried(max(runs, 1), "requeue_off")
    return None  # cancelled, killed at the time limit, or a script from before this record


def story(folder: Path, state: str, requeue: bool) -> Story:
    """The job's retries and why it was not retried again, from its folder (``state``: the scheduler's)."""
    records = read_records(folder)
    return Story(retries(folder, records), not_retried(records, runs_started(folder), state, requeue))


def _from(step: int | None) -> str:
    return "from an unknown step" if step is None else "from the start" if step < 0 else f"from step {step}"


def _came(retry: Retry) -> str:
    how = _CAME.get(retry.how, retry.how)
    return f"{how} after {_AFTER.get(retry.after, retry.after)}" if retry.after else how


def retried_line(found: list[Retry]) -> str | None:
    if not found:
        return None
    runs = ", ".join(f"run {r.run} {_from(r.from_step)} ({_came(r)})" for r in found)
    return f"retried {len(found)} time{'s' if len(found) != 1 else ''}: {runs}"


def not_retried_line(last: NotRetried | None) -> str | None:
    if last is None:
        return None
    said = _NOT_RETRIED.get(last.reason, last.reason)
    if last.reason == "restart_budget" and last.max_restarts is not None:
        said += f" (--max-restarts {last.max_restarts})"
    return f"not retried after run {last.run}: {said}" + (f": {last.detail}" if last.detail else "")
