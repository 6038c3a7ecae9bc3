"""What the per-step benches share: loops interleaved in blocks inside the same processes, wall and CPU
time per step, and ratios printed with their spread and the microseconds they add.

A 2-core machine shared with others drifts by more than the few per cent a bench must tell apart, so
every loop runs in every block, the order rotating from block to block, and drift hits all alike. The
figure is the ratio of the medians over all steps; the spread is the lowest and highest ratio of one
block's medians (how far a single block could mislead); the added microseconds per step are the
difference of the medians (a fixed cost reads better as time than as a ratio of a model's step).
CPU time (``time.process_time``: every thread of the process) is printed beside wall time because it
does not count the time a rank waits for a core the machine gave to someone else.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

Sample = tuple[float, float]  # one step: wall seconds, CPU seconds


def timed(step: Callable[[], Any]) -> Sample:
    """Wall and CPU time of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - wall, time.process_time() - cpu


def timed_steps(batches: Iterable[Any], step: Callable[[Any], Any]) -> list[Sample]:
    """Each step's wall and CPU time, fetching its batch included (a loader's own cost is part of a step)."""
    found, batches = [], iter(batches)
    while True:
        wall, cpu = time.perf_counter(), time.process_time()
        batch = next(batches, None)
        if batch is None:
            return found
        step(batch)
        found.append((time.perf_counter() - wall, time.process_time() - cpu))


def rotation(names: Sequence[str], index: int) -> list[str]:
    """The order of block ``index``: each name first once every ``len(names)`` blocks."""
    shift = index % len(names)
    return [*names[shift:], *names[:shift]]


def _medians(samples: Iterable[Sample]) -> tuple[float, float]:
    walls, cpus = zip(*samples)
    return statistics.median(walls), statistics.median(cpus)


@dataclass
class Runs:
    """One process's samples: every step of every loop, and each block's medians."""

    names: tuple[str, ...]
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    blocks: list[dict[str, tuple[float, float]]] = field(default_factory=list)

    def add_block(self, found: Mapping[str, list[Sample]]) -> None:
        for name, samples in found.items():
            self.samples.setdefault(name, []).extend(samples)
        self.blocks.append({name: _medians(samples) for name, samples in found.items()})

    def vector(self) -> list[float]:
        """Medians over all steps, then each block's, as one flat list (for one all-reduce over the ranks)."""
        values = [v for name in self.names for v in _medians(self.samples[name])]
        return values + [v for block in self.blocks for name in self.names for v in block[name]]


def interleave(loops: Mapping[str, Callable[[], list[Sample]]], blocks: int, warmup: int = 1) -> Runs:
    """Run every loop once per block (after ``warmup`` unrecorded rounds), the order rotating."""
    for _ in range(warmup):  # the allocator, gloo's buffers and autograd's caches settle first
        for loop in loops.values():
            loop()
    runs = Runs(tuple(loops))
    for index in range(blocks):
        runs.add_block({name: loops[name]() for name in rotation(runs.names, index)})
    return runs


def mean_over_ranks(values: list[float], all_reduce: Callable[[Any], Any], world_size: int) -> list[float]:
    """Each value averaged over the ranks: in data parallel the slower rank sets the pace of both."""
    import torch

    tensor = torch.tensor(values, dtype=torch.float64)
    all_reduce(tensor)
    return (tensor / world_size).tolist()


@dataclass(frozen=True)
class Comparison:
    """One loop against its baseline, from medians in seconds."""

    wall: float
    base_wall: float
    cpu: float
    base_cpu: float
    low: float  # the lowest block's wall ratio
    high: float

    @property
    def ratio(self) -> float:
        return self.wall / self.base_wall

    @property
    def cpu_ratio(self) -> float:
        return self.cpu / self.base_cpu

    @property
    def added_us(self) -> float:
        return (self.wall - self.base_wall) * 1e6

    @property
    def added_cpu_us(self) -> float:
        return (self.cpu - self.base_cpu) * 1e6

    def lines(self, label: str, target: float) -> list[str]:
        # both clocks: a wall ratio under the target with CPU time over it is the machine's noise, not a cost gone
        verdict = "met" if max(self.ratio, self.cpu_ratio) <= target else "NOT met"
        return [
            f"{label}: wall {self.ratio:.4f} (blocks {self.low:.3f}-{self.high:.3f}), CPU {self.cpu_ratio:.4f}"
            f"  (target <= {target}, wall and CPU: {verdict})",
            f"{'':>{len(label)}}  added per step: {self.added_us:+.1f} us wall, {self.added_cpu_us:+.1f} us CPU",
        ]

    def added_lines(self, label: str, target_us: float) -> list[str]:
        """For one rank, whose step has no communication: the time added is what counts, not the ratio."""
        verdict = "met" if max(self.added_us, self.added_cpu_us) <= target_us else "NOT met"
        return [
            f"{label}: wall {self.ratio:.4f} (blocks {self.low:.3f}-{self.high:.3f}) of a step without communication",
            f"{'':>{len(label)}}  added per step: {self.added_us:+.1f} us wall, {self.added_cpu_us:+.1f} us CPU"
            f"  (target <= {target_us:g} us: {verdict})",
        ]


@dataclass(frozen=True)
class Summary:
    """:meth:`Runs.vector`, averaged over the ranks, read back by name."""

    names: tuple[str, ...]
    vector: list[float]

    def median(self, name: str) -> tuple[float, float]:
        i = 2 * self.names.index(name)
        return self.vector[i], self.vector[i + 1]

    def block_ratios(self, name: str, base: str) -> list[float]:
        width = 2 * len(self.names)
        blocks = self.vector[width:]
        at, base_at = 2 * self.names.index(name), 2 * self.names.index(base)
        return [blocks[b + at] / blocks[b + base_at] for b in range(0, len(blocks), width)]

    def compare(self, name: str, base: str) -> Comparison:
        (wall, cpu), (base_wall, base_cpu) = self.median(name), self.median(base)
        ratios = self.block_ratios(name, base) or [wall / base_wall]
        return Comparison(wall, base_wall, cpu, base_cpu, min(ratios), max(ratios))


def torchrun(script: str, args: Sequence[str], procs: int = 2, env: Mapping[str, str] | None = None) -> NoReturn:
    """Run ``script --worker ARGS`` on ``procs`` local ranks and exit with torchrun's status.

    One thread per rank (two ranks on two cores), and none of the variables of hpc_train.contract from the
    caller's environment: a bench sets its own, a job's would change what is measured.
    """
    from hpc_train import contract

    declared = {v for k, v in vars(contract).items() if k.startswith("ENV_") and isinstance(v, str)}
    clean = {k: v for k, v in os.environ.items() if k not in declared}
    clean.update({"OMP_NUM_THREADS": "1", **(env or {})})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
    raise SystemExit(subprocess.call([*command, script, "--worker", *args], env=clean))
