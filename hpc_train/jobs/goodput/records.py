"""What goodput reads and builds: an allocation, the batch log's lines, the job folder's files, a run, the
summary; and how a value read from a file is taken (a number only if it is one). Imports nothing of goodput's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hpc_train.jobs.poll import RunOutcome

CAUSES = {  # key -> label, in the order the report lists them
    "startup": "start-up",
    "restart_downtime": "restart downtime",
    "recomputed": "recomputed steps",
    "checkpoint_stalls": "checkpoint stalls",
    "hang_detection": "hang detection",
    "straggler": "straggler slowdown",
    "other": "other",
}


SLACK_S = 5.0  # clocks of the batch node, rank 0 and the controller differ by this much, and dates are to the second


DISAGREE_S = 60.0  # the records explain more than was allocated by this much: say so


@dataclass
class Allocation:
    """One allocation of the job: the first, and one per requeue (``sacct --duplicates``)."""

    start: float
    end: float | None  # None: still running
    state: str = ""
    exit_code: str = ""
    nodelist: str = ""
    nodes: int | None = None
    gpus: int | None = None  # gres/gpu over the whole allocation
    submit: float | None = None


@dataclass
class BatchLog:
    starts: dict[int, tuple[float | None, str]] = field(default_factory=dict)  # run -> (when, batch host)
    failures: dict[int, tuple[int, str]] = field(default_factory=dict)  # run -> (exit status, what followed)
    stops: dict[int, tuple[int, str]] = field(default_factory=dict)  # run -> (step, reason)
    saves: set[int] = field(default_factory=set)
    not_started: int | None = None  # the run the restart budget refused


@dataclass
class Files:
    """Everything read from the job folder, and what could not be read."""

    folder: Path
    record: dict[str, Any] = field(default_factory=dict)
    starts: dict[int, dict[str, Any]] = field(default_factory=dict)  # run_start events
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)  # run_end events
    rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # run -> its steps, every copy
    windows: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    hangs: dict[int, dict[str, Any]] = field(default_factory=dict)
    suspects: list[dict[str, Any]] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    runs_counter: int = 0
    hang_run: int | None = None
    start_step: tuple[int, int] | None = None  # run_start_step: (run, newest committed step when it began)
    last_run: RunOutcome | None = None
    log: BatchLog = field(default_factory=BatchLog)
    committed: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


def read_text(path: Path, notes: list[str], name: str | None = None) -> str | None:
    """The file's text; None when it is missing, or unreadable (a note says so, under ``name`` if given)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(f"{name or path.name}: unreadable ({exc.strerror or exc})")
        return None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def iso_seconds(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()  # naive (sacct): the login node's time zone
    except ValueError:
        return None


@dataclass
class RunView:
    """One run: where and when it ran, what it trained, how it ended."""

    run: int
    begin: float | None = None
    end: float | None = None
    hosts: list[str] = field(default_factory=list)
    start_step: int | None = None  # the checkpoint it restored
    first_step: int | None = None
    last_step: int | None = None
    steps: int = 0  # step lines it wrote
    ended: str = "unknown"  # completed, requeued, failed, hang, restarted, stopped, running, unknown
    how: str = "no record of how it ended"
    hang: dict[str, Any] | None = None
    suspects: list[str] = field(default_factory=list)
    stragglers: list[str] = field(default_factory=list)
    allocation: int | None = None  # index into Goodput.allocations


@dataclass
class Goodput:
    job_id: str | None
    allocated_s: float
    productive_s: float
    lost_s: dict[str, float]
    queue_wait_s: float  # between allocations after requeues: lost, but not allocated
    requeues: int
    first_wait_s: float | None  # submit to the first start
    wall_s: float
    steps_recomputed: int
    saves: int  # saves whose stall was measured
    nodes: int | None
    gpus_per_node: int | None
    gpu_hours: float | None
    node_hours: float | None
    price_per_gpu_hour: float | None
    cost: float | None
    estimated: bool  # allocations from the job's own records, not the scheduler's
    runs: list[RunView]
    allocations: list[Allocation]
    excluded: list[str]
    notes: list[str]

    @property
    def goodput(self) -> float | None:
        return self.productive_s / self.allocated_s if self.allocated_s > 0 else None
