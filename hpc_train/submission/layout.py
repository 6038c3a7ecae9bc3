"""Parallel layouts (``--parallel dp=2,tp=2,pp=1``): parsed and checked on the login side, no torch.

The job's processes form a mesh with the axes ordered ``pp, dp, tp``: tensor parallel is innermost,
so a tensor-parallel group is consecutive ranks, which torchrun and srun place on one node. The
runtime (``hpc_train.runtime.engine.parallel``) builds the same mesh from ``HPC_TRAIN_PARALLEL``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpc_train import contract
from hpc_train.errors import UsageError, did_you_mean

AXES = ("pp", "dp", "tp")  # mesh order, outermost first
AXIS_NAMES = {"dp": "data parallel", "tp": "tensor parallel", "pp": "pipeline parallel"}
ENV_VAR = contract.ENV_PARALLEL


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def shape(self) -> tuple[int, int, int]:
        """Sizes in mesh order (pp, dp, tp)."""
        return (self.pp, self.dp, self.tp)

    def __str__(self) -> str:
        return f"dp={self.dp},tp={self.tp},pp={self.pp}"

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits on each axis (tp fastest)."""
        return {"pp": rank // (self.dp * self.tp), "dp": rank // self.tp % self.dp, "tp": rank % self.tp}


def parse(value: str | dict[str, Any], *, world_size: int | None = None) -> Layout:
    """``"dp=2,tp=2"`` or ``{"dp": 2, "tp": 2}`` -> Layout; raises UsageError with a close match.

    Axes left out are 1, except ``dp``: left out, it is whatever the world size leaves over
    (``--parallel tp=2`` on 8 processes is dp=4), when the world size is known.
    """
    items: list[tuple[str, Any]]
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for part in (p.strip() for p in str(value).split(",")):
            if not part:
                continue
            key, sep, number = part.partition("=")
            if not sep:
                raise UsageError(f"parallel layout {value!r}: expected AXIS=N items like 'dp=2,tp=2', got {part!r}")
            items.append((key.strip(), number.strip()))
    if not items:
        raise UsageError("parallel layout is empty: give sizes like 'dp=2,tp=2,pp=1'")
    sizes: dict[str, int] = {}
    for key, number in items:
        if key not in AXES:
            raise UsageError(f"parallel layout: unknown axis {key!r} (axes: dp, tp, pp)", hint=did_you_mean(key, AXES, "axis"))
        if key in sizes:
            raise UsageError(f"parallel layout: axis {key!r} given twice")
        try:
            size = int(number)
        except (TypeError, ValueError):
            raise UsageError(f"parallel layout: {key}={number!r}: expected a whole number ≥ 1") from None
        if isinstance(number, bool) or size < 1 or str(size) != str(number).strip():
            raise UsageError(f"parallel layout: {key}={number!r}: expected a whole number ≥ 1")
        sizes[key] = size
    if "dp" not in sizes and world_size is not None:
        rest = sizes.get("tp", 1) * sizes.get("pp", 1)
        if world_size % rest == 0:
            sizes["dp"] = world_size // rest
    return Layout(**sizes)


def canonical(value: str | dict[str, Any]) -> str:
    """The layout as the job spec keeps it; ``dp`` stays open when it was left out."""
    layout = parse(value)
    given = value.keys() if isinstance(value, dict) else [p.partition("=")[0].strip() for p in str(value).split(",")]
    return ",".join(f"{axis}={getattr(layout, axis)}" for axis in ("dp", "tp", "pp") if axis in given)


def problems(
    value: str | dict[str, Any],
    *,
    nodes: int,
    procs_per_node: int,
    gpus_per_node: int,
    backend: str,
    axes_by_backend: Mapping[str, tuple[str, ...]],
) -> tuple[Layout | None, list[tuple[str, str | None]]]:
    """The resolved layout and everything wrong with it for this job, as (message, hint) pairs.

    ``axes_by_backend``: each backend's ``parallel_axes`` (what it declares), for the hints.
    """
    world = nodes * procs_per_node
    try:
        layout = parse(value, world_size=world)
    except UsageError as exc:
        return None, [(exc.message, exc.hint)]
    found: list[tuple[str, str | None]] = []
    if layout.size != world:
        found.append(
            (
                f"{layout} is {layout.size} processes, but the job has {world} "
                f"({nodes} node{'s' * (nodes > 1)} x {procs_per_node} per node)",
                "make dp x tp x pp equal --nodes x --procs-per-node",
            )
        )
    if gpus_per_node > 0 and layout.tp > 1 and procs_per_node % layout.tp != 0:
        found.append(
            (
                f"tp={layout.tp} would split tensor-parallel groups across nodes ({procs_per_node} processes "
                "per node); on a GPU partition tensor parallel must stay inside a node",
                f"use a tp that divides {procs_per_node} and put dp or pp across nodes",
            )
        )
    axes = axes_by_backend.get(backend, ())
    if not axes:
        able = " or ".join(sorted(name for name, have in axes_by_backend.items() if have))
        found.append(
            (
                f"backend {backend!r} takes no parallel layout (it is data parallel over all processes)",
                f"drop --parallel, or use --backend {able}" if able else "drop --parallel",
            )
        )
        return layout, found
    for axis in ("tp", "pp"):
        if getattr(layout, axis) > 1 and axis not in axes:
            having = sorted(name for name, have in axes_by_backend.items() if axis in have)
            found.append(
                (
                    f"backend {backend!r} has no {AXIS_NAMES[axis]} ({axis}={getattr(layout, axis)})",
                    f"use --backend {' or '.join(having)}" if having else None,
                )
            )
    return layout, found
