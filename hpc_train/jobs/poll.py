"""Whether a job has ended for good, and how often to ask: the one rule every poll follows.

``wait()``, the live progress (``submit --wait``, ``status --watch``), ``logs --follow`` and sweeps
all look at jobs through this module. A job that may requeue (``--requeue``) passes through states
that look final while it requeues itself: its run ends, the controller briefly reports an end, then
the job is PENDING again. A single look cannot tell that from the job's real end, and a poll that
believed it reported FAILED or COMPLETED for a job still on its way (a CI flake).

So the batch script records how each run ended, in the job folder (``last_run``: run, exit status,
``requeued`` or ``ended``), before the controller can report the end. An ended-looking state is
final at once when the current run's own record says it ended without a requeue. Otherwise (the
run said it requeued, or it was killed before it could say: a time limit, a cancel, a node failure)
the state is believed only once it has looked ended on every look for a while.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hpc_train import contract
from hpc_train.jobs.states import ACTIVE_STATES


class _Requeue(Protocol):
    @property
    def requeue(self) -> bool: ...


class Polled(Protocol):
    """What the poller reads of a job (a JobHandle is one): declared here, so the poller does not import the
    handle that uses it."""

    @property
    def record(self) -> _Requeue: ...

    @property
    def state(self) -> str: ...

    @property
    def folder(self) -> Path: ...

    def scheduler_info(self) -> dict[str, str]: ...

    def release_if_held(self, info: dict[str, str] | None = None) -> bool: ...


LAST_RUN_FILE = contract.LAST_RUN  # written by templates/sbatch/base.sh.j2 at the end of every run
RUNS_FILE = contract.RUNS  # the run counter, incremented by the batch script at the start of every run
CONFIRM_S = 4.0  # an end with no word from the run (killed): believed after looking ended this long
REQUEUED_CONFIRM_S = 30.0  # the run said it requeued: the job comes back unless the requeue was lost
MAX_POLL_S = 10.0  # the slowest poll while nothing changes


@dataclass(frozen=True)
class RunOutcome:
    """How one run of a job ended, in the batch script's words."""

    run: int
    status: int
    requeued: bool

    @classmethod
    def read(cls, folder: Path) -> RunOutcome | None:
        try:
            run, status, how = (folder / LAST_RUN_FILE).read_text().split()
            return cls(int(run), int(status), how == "requeued")
        except (OSError, ValueError):
            return None  # no run has ended yet, or a record from before this rule


def runs_started(folder: Path) -> int:
    """How many times the job has started (1 + its requeues), counted by the job itself."""
    try:
        return int((folder / RUNS_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


class EndRule:
    """Decides, look after look, whether one job's ended-looking state is its final one.

    ``now`` is a monotonic clock reading (``time.monotonic()`` when omitted).
    """

    def __init__(self, requeue: bool) -> None:
        self.requeue = requeue
        self._ended_since: float | None = None
        self._wait_s = 0.0

    def final(self, state: str, folder: Path, now: float | None = None) -> bool:
        if state in ACTIVE_STATES or state == "UNKNOWN":
            self._ended_since = None
            return False
        if not self.requeue:
            return True
        outcome = RunOutcome.read(folder)
        current = outcome is not None and outcome.run >= runs_started(folder)
        if current and outcome is not None and not outcome.requeued:
            return True  # the last run said so itself
        now = time.monotonic() if now is None else now
        if self._ended_since is None:
            self._ended_since = now
        self._wait_s = REQUEUED_CONFIRM_S if current else CONFIRM_S
        return now - self._ended_since >= self._wait_s

    def confirm_in(self, now: float | None = None) -> float | None:
        """Seconds until an end seen but not yet believed could be; None when none is pending."""
        if self._ended_since is None:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, self._ended_since + self._wait_s - now)


class Backoff:
    """The wait between polls: ``poll_s`` after a change, growing by half while nothing changes, so
    a job that runs for hours does not cost the controller a query a second."""

    def __init__(self, poll_s: float = 1.0, max_s: float = MAX_POLL_S) -> None:
        self.poll_s = poll_s
        self.max_s = max(poll_s, max_s)
        self.delay = poll_s

    def next(self, changed: bool, confirm_in: float | None = None) -> float:
        self.delay = self.poll_s if changed else min(self.delay * 1.5, self.max_s)
        if confirm_in is not None:  # an end waiting to be believed: look again when it can be
            return max(min(self.delay, confirm_in), min(self.poll_s, 0.5))
        return self.delay


@dataclass(frozen=True)
class Look:
    """One poll of one job: its state, the controller's fields ({} when it no longer knows the job),
    and whether the state is the job's final one."""

    state: str
    info: dict[str, str]
    final: bool


class JobPoller:
    """What one job is doing now: one controller query per look, the end rule, the requeue-hold
    release, and the back-off between looks. ``wait()``, the live progress and ``logs --follow``."""

    def __init__(self, handle: Polled, poll_s: float = 1.0, max_poll_s: float = MAX_POLL_S) -> None:
        self.handle = handle
        self.rule = EndRule(handle.record.requeue)
        self.backoff = Backoff(poll_s, max_poll_s)
        self._last: str | None = None
        self._changed = True

    def look(self) -> Look:
        info = self.handle.scheduler_info()
        state = info.get("JobState") or self.handle.state  # accounting, once the controller has forgotten it
        final = self.rule.final(state, self.handle.folder)
        if state == "PENDING":
            self.handle.release_if_held(info or None)
        self._changed, self._last = state != self._last, state
        return Look(state, info, final)

    def pause(self, changed: bool | None = None) -> None:
        """Sleep until the next look: soon after a change, ever longer while nothing changes."""
        time.sleep(self.backoff.next(self._changed if changed is None else changed, self.rule.confirm_in()))
