"""Naming the rank that holds the others back, while the run goes on.

In data parallel every step waits for the slowest rank, so one slow GPU, a throttled node or a rank
whose data loading stalls slows the whole job, and from the outside it only looks like a slow job.
What tells the slow rank apart is its *compute* time: the step's wall time minus the time it spent in
gradient communication (the metrics recorder times that per backend). The fast ranks spend the
difference waiting in communication; the slow one hardly waits at all.

Every ``window`` steps each rank sends its mean compute time per step over the window to every other
rank: one small collective through the backend's runtime, so the same on gloo/NCCL, DeepSpeed, Horovod
and MPI (``gather_object`` the first time, with each rank's host; then ``gather_numbers``, one
all-reduce of a float per rank, no pickling). Rank 0 compares each rank with the median of the others; a rank slower than that
by more than ``threshold`` for ``NAMED_AFTER`` windows in a row is named: a log line, a line in
``metrics/stragglers.jsonl``. The per-window numbers of every rank go to ``steps.jsonl`` as
``"event": "ranks"`` lines (for ``report``'s per-rank chart).

Settings: ``HPC_TRAIN_STRAGGLER_THRESHOLD`` (fraction, 0.2 = 20 %; "0"/"off" disables) and
``HPC_TRAIN_STRAGGLER_WINDOW`` (steps, 50). Imports no framework: the gather is given to it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.runtime.log import log as _log

DEFAULT_THRESHOLD = 0.2
DEFAULT_WINDOW = 50
# Windows in a row before a rank is named. One slow window is usually a one-off: a synchronous
# checkpoint save, a garbage-collection pause, a cold page cache, a neighbour's burst on a shared node.
# Three in a row (150 steps at the default window) is a rank that stays slow, yet is named within
# minutes; and a balanced run's noise rarely lines up three windows on the same rank.
NAMED_AFTER = 3
# A rank must also be this much slower per step in absolute terms. Sub-millisecond steps (tiny models,
# tests) make rank 0's own bookkeeping (metrics writes) look like a 60 % slowdown of nothing that matters.
MIN_EXCESS_S = 0.002
OFF = ("0", "off", "false", "no", "none")


# -- settings ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    threshold: float | None  # None: detection off
    window: int


def settings(environ: Mapping[str, str] | None = None, warn: Callable[[str], None] | None = None) -> Settings:
    """The job's settings; a value that does not parse is warned about and replaced by the default,
    because a typo in an environment variable must not end a training run."""
    env = os.environ if environ is None else environ
    warn = warn or _log
    return Settings(
        _threshold(env.get(contract.ENV_STRAGGLER_THRESHOLD, ""), warn), _window(env.get(contract.ENV_STRAGGLER_WINDOW, ""), warn)
    )


def _threshold(raw: str, warn: Callable[[str], None]) -> float | None:
    text = raw.strip().lower()
    if not text:
        return DEFAULT_THRESHOLD
    if text in OFF:
        return None
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        warn(
            f"straggler: {contract.ENV_STRAGGLER_THRESHOLD}={raw!r} is not a fraction (0.2 = 20 %) or 'off'; "
            f"using {DEFAULT_THRESHOLD}"
        )
        return DEFAULT_THRESHOLD
    return value or None  # "0.0" is off, as "0" is


def _window(raw: str, warn: Callable[[str], None]) -> int:
    text = raw.strip()
    if not text:
        return DEFAULT_WINDOW
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        warn(f"straggler: {contract.ENV_STRAGGLER_WINDOW}={raw!r} is not a number of steps; using {DEFAULT_WINDOW}")
        return DEFAULT_WINDOW
    return value


# -- the rule (pure) -----------------------------------------------------------------------------
def medians_of_others(values: Sequence[float]) -> list[float]:
    """For each value, the median of all the *other* values, in O(n log n) for all of them.

    Against the median of everyone a slow rank pulls its own reference up: of two ranks, one 50 %
    slower than the other is only 20 % above their median. Leaving it out keeps the comparison
    honest for small worlds and is the same as the plain median for large ones.
    """
    n = len(values)
    if n < 2:
        return [math.nan] * n
    order = sorted(range(n), key=values.__getitem__)
    ranked = [values[i] for i in order]
    out = [0.0] * n
    half, odd = divmod(n - 1, 2)  # the others: n - 1 values
    for position, index in enumerate(order):
        upper = _kth_without(ranked, half, position)
        out[index] = upper if odd else (_kth_without(ranked, half - 1, position) + upper) / 2
    return out


def _kth_without(ranked: list[float], k: int, position: int) -> float:
    """The k-th smallest of ``ranked`` once the value at ``position`` is taken out."""
    return ranked[k if k < position else k + 1]


def slowdowns(compute: Sequence[float | None], groups: Sequence[Any] | None = None) -> dict[int, tuple[float, float]]:
    """rank -> (its compute, the median of its peers') for every rank with a usable comparison.

    Peers are the ranks of the same group (pipeline stage): stages do different work, so only ranks
    of one stage are comparable. Ranks that measured nothing (None) take no part.
    """
    by_group: dict[Any, list[int]] = {}
    for rank, value in enumerate(compute):
        if value is not None and math.isfinite(value):
            by_group.setdefault(groups[rank] if groups else None, []).append(rank)
    out: dict[int, tuple[float, float]] = {}
    for ranks in by_group.values():
        values = [float(compute[r]) for r in ranks]  # type: ignore[arg-type]
        for rank, value, reference in zip(ranks, values, medians_of_others(values)):
            if reference > 0:
                out[rank] = (value, reference)
    return out


@dataclass
class Streak:
    windows: int = 0
    compute: float = 0.0  # sums over the streak's windows, for the means the naming reports
    reference: float = 0.0
    named: bool = False


@dataclass(frozen=True)
class Named:
    rank: int
    slowdown: float  # mean compute over the streak / mean peer median - 1
    compute_s: float  # per step, mean over the streak
    median_s: float
    windows: int


@dataclass
class Rule:
    """Consecutive slow windows per rank; a rank is named once per streak (again only after it
    recovered and then stayed slow for ``windows`` windows again)."""

    threshold: float
    windows: int = NAMED_AFTER
    streaks: dict[int, Streak] = field(default_factory=dict)

    def update(
        self, compute: Sequence[float | None], groups: Sequence[Any] | None = None, excused: frozenset[int] = frozenset()
    ) -> list[Named]:
        """``excused``: ranks whose slowness their larger share of the data explains (not slow per sample)."""
        named = []
        compared = slowdowns(compute, groups)
        for rank in range(len(compute)):
            value, reference = compared.get(rank, (0.0, 0.0))
            slow = reference and value > reference * (1 + self.threshold) and value - reference >= MIN_EXCESS_S
            if not slow or rank in excused:
                self.streaks.pop(rank, None)  # recovered (or not measured): the streak starts over
                continue
            streak = self.streaks.setdefault(rank, Streak())
            streak.windows += 1
            streak.compute += value
            streak.reference += reference
            if streak.windows >= self.windows and not streak.named:
                streak.named = True
                named.append(
                    Named(
                        rank,
                        streak.compute / streak.reference - 1,
                        streak.compute / streak.windows,
                        streak.reference / streak.windows,
                        streak.windows,
                    )
                )
        return named


# -- in the job ------------------------------------------------------------------------------------
class StragglerMonitor:
    """One per process, fed by the metrics recorder at every optimizer step.

    ``on_step`` only appends; every ``window`` steps ``close_window`` runs the gather, a collective,
    so every rank must reach it at the same step: it counts the calls it got (every rank steps the
    same number of times), not the recorder's step numbers.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        rank: int,
        world_size: int,
        gather: Callable[[Any], list[Any]],
        seconds: Callable[[list[Any]], float],
        settle: Callable[[], None] = lambda: None,
        gather_numbers: Callable[[float | None], list[float | None]] | None = None,
        folder: Path | None = None,
        run: int = 1,
        group: Any = None,
        host: str | None = None,
        samples: bool = False,
    ) -> None:
        assert settings.threshold is not None
        self.window, self.rank, self.world_size, self.run = settings.window, rank, world_size, run
        self.rule = Rule(settings.threshold)
        self.gather, self.seconds, self.settle = gather, seconds, settle
        self.gather_numbers = gather_numbers or (lambda value: [g[0] for g in gather((value, None, None))])
        self.folder, self.group = folder, group
        self.host = host or socket.gethostname()
        self.hosts: list[str] | None = None  # every rank's, from the first gather (on every rank)
        self.groups: list[Any] = []
        self.judging = rank == 0  # rank 0 judges and writes; the others only take part in the gather
        self.named: list[dict[str, Any]] = []  # what this run named (rank 0)
        self._count = 0
        self._first_step: int | None = None
        self._walls: list[float] = []
        self._comms: list[list[Any]] = []
        self._gather_s = 0.0  # the last gather's own time: it lies in the next window's first step
        # samples per step go along (data balance): every rank decides alike, the gather is collective
        self.with_samples = samples
        self._samples: list[int] = []
        self._wall_per_step: float | None = None
        self.imbalance_told = False

    def on_step(self, step: int, step_s: float | None, comm: list[Any], samples: int | None = None) -> dict[str, Any] | None:
        """Count one step (``samples``: this rank's, when known); at a window's end, compare the ranks
        (rank 0: the window's record)."""
        if step_s is not None:
            self._walls.append(step_s)
            self._comms.append(comm)
            if samples is not None:
                self._samples.append(samples)
        if self._first_step is None:
            self._first_step = step
        self._count += 1
        if self._count % self.window:
            return None
        return self.close_window(step)

    def close_window(self, step: int) -> dict[str, Any] | None:
        try:
            mine = self._compute_per_step()
        except Exception as exc:  # this rank still joins the gather: the others are already waiting in it
            _log(f"straggler: rank {self.rank} could not time its window: {type(exc).__name__}: {exc}")
            mine = None
        first, self._first_step = self._first_step, None
        start = time.perf_counter()
        first_window = self.hosts is None
        compute = self._exchange(mine)  # every rank, same step: a collective
        counts = self.gather_numbers(self._samples_per_step()) if self.with_samples else None
        self._gather_s = time.perf_counter() - start
        if not self.judging:
            return None
        try:
            return self._judge(compute, first if first is not None else step, step, first_window, counts)
        except Exception as exc:
            # Only the judging stops: rank 0 goes on gathering, or the other ranks would wait in a
            # gather it never joins. Detection is an aid; it must not end a run.
            _log(f"straggler: detection stopped after an error: {type(exc).__name__}: {exc}")
            self.judging = False
            return None

    def _exchange(self, mine: float | None) -> list[float | None]:
        """Every rank's number; the first time with where each rank runs (which never changes in a run)."""
        if self.hosts is not None:
            return self.gather_numbers(mine)
        gathered = self.gather((mine, self.host, self.group))
        self.hosts, self.groups = [str(g[1]) for g in gathered], [g[2] for g in gathered]
        return [g[0] for g in gathered]

    def _compute_per_step(self) -> float | None:
        """Mean seconds per step not spent in communication, over this window's timed steps."""
        walls, comms = self._walls, self._comms
        self._walls, self._comms = [], []
        if not walls:
            return None
        self.settle()  # on a GPU: the window's events have completed, and its wall time is the device's
        comm = self.seconds([interval for step in comms for interval in step])
        wall = sum(walls) - self._gather_s
        self._wall_per_step = wall / len(walls)
        return max(0.0, wall - comm) / len(walls)

    def _samples_per_step(self) -> float | None:
        """This rank's mean samples per step over the window; None unless every timed step counted them."""
        counted, self._samples = self._samples, []
        return sum(counted) / len(counted) if counted else None

    def _judge(
        self, compute: list[float | None], first: int, last: int, first_window: bool, counts: list[float | None] | None = None
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "event": "ranks",
            "run": self.run,
            "time": round(time.time(), 3),
            "first_step": first,
            "last_step": last,
            "compute_ms": [None if c is None else round(c * 1e3, 4) for c in compute],
        }
        groups = self.groups if any(g is not None for g in self.groups) else None
        if first_window:
            record["hosts"] = self.hosts  # once per run: ranks keep their hosts
            if groups:
                record["groups"] = groups
        known = [c for c in compute if c is not None]
        if known:
            record["median_ms"] = round(_median(known) * 1e3, 4)
        excused = self._per_sample(compute, counts, record, groups) if counts else frozenset()
        for named in self.rule.update(compute, groups, excused):
            self._name(named, last)
        return record

    def _per_sample(
        self, compute: list[float | None], counts: list[float | None], record: dict[str, Any], groups: Sequence[Any] | None
    ) -> frozenset[int]:
        """Every rank's samples per step and per second in the record; when the ranks' shares differ, the
        ranks not slower than their peers per sample: more data is imbalance, not a slow rank. A rank is
        named only when slow both per step and per sample (a step's fixed cost makes per sample alone
        unfair to the ranks with less data)."""
        if any(c is None or c <= 0 for c in counts):
            return frozenset()
        shares = [float(c) for c in counts if c is not None]
        record["samples"] = [round(c, 3) for c in shares]
        if self._wall_per_step:  # the ranks step together: one wall time per step for all
            record["samples_per_s"] = [round(c / self._wall_per_step, 3) for c in shares]
        if max(shares) <= min(shares):
            return frozenset()
        median = _median(shares)
        record["imbalance"] = round(max(shares) / min(shares) - 1, 4)
        if not self.imbalance_told:
            self.imbalance_told = True
            most = shares.index(max(shares))
            _log(
                f"data: rank {most} trains on {shares[most]:g} samples per step, the median rank on {median:g} "
                f"({record['imbalance'] * 100:.0f}% more than the least); a rank is named a straggler only when "
                "it is slower per sample too"
            )
        per_sample = [None if c is None else c / n for c, n in zip(compute, shares)]
        judged = slowdowns(per_sample, groups)
        return frozenset(r for r, (value, ref) in judged.items() if value <= ref * (1 + self.rule.threshold))

    def _name(self, named: Named, step: int) -> None:
        host = self.hosts[named.rank] if self.hosts else "?"
        _log(
            f"straggler: rank {named.rank} on {host} is {named.slowdown * 100:.0f}% slower than the median "
            f"(compute {named.compute_s * 1e3:.1f} ms/step vs {named.median_s * 1e3:.1f} ms) for {named.windows} windows"
        )
        line = {
            "rank": named.rank,
            "host": host,
            "slowdown": round(named.slowdown, 4),
            "step": step,
            "windows": named.windows,
            "run": self.run,
            "time": round(time.time(), 3),
            "compute_ms": round(named.compute_s * 1e3, 4),
            "median_ms": round(named.median_s * 1e3, 4),
            "window_steps": self.window,
            "threshold": self.rule.threshold,
        }
        self.named.append(line)
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / contract.STRAGGLERS, "a") as f:  # rare: opened for each line
                f.write(json.dumps(line) + "\n")
        except OSError as exc:
            _log(f"straggler: could not write {self.folder / contract.STRAGGLERS}: {exc}")


def _median(values: Sequence[float]) -> float:
    ranked = sorted(values)
    mid = len(ranked) // 2
    return ranked[mid] if len(ranked) % 2 else (ranked[mid - 1] + ranked[mid]) / 2


def monitor(*, rank: int, world_size: int, environ: Mapping[str, str] | None = None, **given: Any) -> StragglerMonitor | None:
    """The monitor for this process (``given``: StragglerMonitor's keywords); None when off or alone
    (nobody to compare with).

    Every rank reads the same job environment, so every rank decides the same way: a monitor on some
    ranks only would leave the others waiting in its gather.
    """
    warned: list[str] = []
    found = settings(environ, warn=warned.append)
    if rank == 0:
        for message in warned:  # once, from one rank, not from every process of the job
            _log(message)
    if found.threshold is None or world_size < 2:
        return None
    return StragglerMonitor(found, rank=rank, world_size=world_size, **given)
