"""``--profile torch[:SPEC]`` and ``--profile nsys[:SPEC]``: the profiler, its steps and its ranks.

Read on both sides and importing nothing heavy: the login side checks a spec before submission (a typo
must not cost a queue wait), the job reads the same text back (``HPC_TRAIN_PROFILE``). The grammar::

    PROFILE  = KIND [":" ITEM ("," ITEM)*]
    KIND     = "torch" | "nsys"
    ITEM     = "wait=" N | "warmup=" N | "active=" N | "ranks=" RANKS | FLAG "=" BOOL
    RANKS    = "all" | RANK ("," RANK)*         a rank list may go on after a comma: ranks=0,3
    RANK     = N | N "-" N | "last"
    FLAG     = "shapes" | "stack" | "memory"    (torch only: record_shapes, with_stack, profile_memory)

Steps are the run's optimizer steps (``ctx.step()`` returning True), counted from 0 in each run: the
first ``wait`` are left alone, the next ``warmup`` are traced and thrown away (the profiler's own
start-up cost), the next ``active`` are recorded, then profiling stops. ``torch:wait=5,warmup=2,active=3``
records steps 5, 6 and 7: ``ProfilerStep#5`` to ``#7`` in the trace. ``nsys`` captures the same active steps.
Default ranks: 0 and the last (the first and the last node).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from hpc_train import contract
from hpc_train.errors import did_you_mean

KINDS = ("torch", "nsys")
COUNTS = ("wait", "warmup", "active")
FLAGS = ("shapes", "stack", "memory")  # torch.profiler's record_shapes, with_stack, profile_memory
KEYS = (*COUNTS, "ranks", *FLAGS)
ALL, LAST = "all", "last"
FORM = "expected torch or nsys, optionally with ':wait=N,warmup=N,active=N,ranks=0,last' (or ranks=all)"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_RANGE = re.compile(r"([0-9]+)-([0-9]+)")

Rank = int | tuple[int, int] | str  # 3, (0, 3) for 0-3, or "last"


class SpecError(ValueError):
    """A --profile value that does not parse; ``str()`` is the whole message, the hint included."""

    def __init__(self, message: str, hint: str = FORM) -> None:
        super().__init__(f"{message}; {hint}" if hint else message)
        self.message, self.hint = message, hint


@dataclass(frozen=True)
class ProfileSpec:
    kind: str
    wait: int = 5
    warmup: int = 2
    active: int = 3
    ranks: tuple[Rank, ...] | None = None  # None: rank 0 and the last; (ALL,): every rank
    shapes: bool = False
    stack: bool = False
    memory: bool = False

    @property
    def first(self) -> int:
        """The run's first recorded step (0-based)."""
        return self.wait + self.warmup

    @property
    def steps(self) -> range:
        """The run's recorded steps (0-based): the trace's ``ProfilerStep#N`` numbers."""
        return range(self.first, self.first + self.active)

    def chosen(self, world_size: int) -> frozenset[int]:
        """The ranks that profile in a job of ``world_size`` processes (ranks outside it: none)."""
        if self.ranks is None:
            return frozenset({0, world_size - 1})
        out: set[int] = set()
        for rank in self.ranks:
            if rank == ALL:
                return frozenset(range(world_size))
            if rank == LAST:
                out.add(world_size - 1)
            elif isinstance(rank, tuple):
                out.update(range(rank[0], rank[1] + 1))
            elif isinstance(rank, int):
                out.add(rank)
        return frozenset(r for r in out if 0 <= r < world_size)

    def beyond(self, world_size: int) -> list[int]:
        """Explicit ranks a job of ``world_size`` processes does not have."""
        named = [r for rank in self.ranks or () for r in _numbers(rank)]
        return sorted({r for r in named if r >= world_size})

    def __str__(self) -> str:
        items = [f"{key}={getattr(self, key)}" for key in COUNTS]
        if self.ranks is not None:
            items.append("ranks=" + ",".join(_rank_text(r) for r in self.ranks))
        items += [f"{flag}=1" for flag in FLAGS if getattr(self, flag)]
        return f"{self.kind}:" + ",".join(items)


def _numbers(rank: Rank) -> list[int]:
    if isinstance(rank, tuple):
        return [rank[0], rank[1]]
    return [rank] if isinstance(rank, int) else []


def _rank_text(rank: Rank) -> str:
    return f"{rank[0]}-{rank[1]}" if isinstance(rank, tuple) else str(rank)


def parse(text: str) -> ProfileSpec:
    """The spec of a --profile value, or SpecError saying what is wrong and what would be right."""
    kind, colon, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise SpecError(f"unknown profiler {kind!r}" if kind else "no profiler named", did_you_mean(kind, KINDS, "profiler"))
    spec = ProfileSpec(kind)
    if not colon:
        return spec
    values: dict[str, object] = {}
    key = None
    for item in rest.split(","):
        item = item.strip()
        if not item:
            raise SpecError(f"{text!r}: an empty setting (two commas, or nothing after ':')")
        if "=" not in item:
            if key != "ranks":  # a bare word only continues a rank list: ranks=0,3
                raise SpecError(f"{item!r} is not KEY=VALUE")
            values["ranks"] = (*values["ranks"], _rank(item))  # type: ignore[misc]
            continue
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in KEYS:
            raise SpecError(f"unknown setting {key!r}", did_you_mean(key, KEYS, "setting"))
        if key in values:
            raise SpecError(f"{key} is given twice")
        values[key] = (_rank(value),) if key == "ranks" else _count(key, value) if key in COUNTS else _flag(key, value)
    return _checked(replace(spec, **values), values)  # type: ignore[arg-type]


def _count(key: str, value: str) -> int:
    least = 1 if key == "active" else 0
    if not re.fullmatch(r"-?[0-9]+", value):
        raise SpecError(f"{key}={value!r}: expected a whole number of steps")
    number = int(value)
    if number < least:
        what = "at least 1 step is recorded" if key == "active" else "a number of steps, 0 or more"
        raise SpecError(f"{key}={number}: {what}", f"e.g. {key}={max(least, 1 if key != 'wait' else 5)}")
    return number


def _flag(key: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise SpecError(f"{key}={value!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def _rank(word: str) -> Rank:
    word = word.strip()
    if word in (ALL, LAST):
        return word
    if word.isdigit():
        return int(word)
    span = _RANGE.fullmatch(word)
    if span and int(span.group(1)) <= int(span.group(2)):
        return (int(span.group(1)), int(span.group(2)))
    if re.fullmatch(r"-[0-9]+", word):
        raise SpecError(f"rank {word}: ranks count from 0", "use 'last' for the last rank, e.g. ranks=0,last")
    raise SpecError(f"{word!r} is not a rank", "a rank is N, a range N-M (N <= M), 'last', or ranks=all alone")


def _checked(spec: ProfileSpec, given: dict[str, object]) -> ProfileSpec:
    if spec.ranks is not None and ALL in spec.ranks and len(spec.ranks) > 1:
        raise SpecError("ranks=all names every rank: give it alone", "ranks=all, or a list such as ranks=0,last")
    flags = [flag for flag in FLAGS if flag in given]
    if spec.kind != "torch" and flags:
        raise SpecError(f"{flags[0]} is a setting of the torch profiler", f"--profile torch:{flags[0]}=1, or drop it for nsys")
    return spec


def problems(
    spec: ProfileSpec, *, world_size: int, where: str, nsys: str | None, site: str, script_job: bool
) -> list[tuple[str, str]]:
    """What is wrong with ``spec`` for this job: ranks it does not have, nsys where the site has none.

    ``where`` says how the world comes about ("2 nodes x 4 processes"); ``nsys`` is the site's tools.nsys.
    """
    found = []
    beyond = spec.beyond(world_size)
    if beyond:
        found.append(
            (
                f"rank {', '.join(map(str, beyond))} is outside the job's {world_size} processes ({where}): ranks 0-{world_size - 1}",
                "name ranks below the world size, 'last' for the last one, or ranks=all",
            )
        )
    if spec.kind == "nsys" and not nsys:
        found.append(
            (
                f"site {site!r} has no Nsight Systems (tools.nsys is null in its site file)",
                "use --profile torch, or set tools.nsys in the site file to nsys's path on the compute nodes",
            )
        )
    if spec.kind == "nsys" and not script_job:
        found.append(("nsys runs a training script's processes under it: a function job has none", "use --profile torch"))
    return found


def run_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where this run's profiles go: ``<job folder>/profile/run-R`` (``./profile/run-R`` outside a job)."""
    env = os.environ if environ is None else environ
    return Path(env.get(contract.ENV_JOB_FOLDER) or ".") / contract.PROFILE / f"run-{env.get(contract.ENV_RUN) or 1}"
