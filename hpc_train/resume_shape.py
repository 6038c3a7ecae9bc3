"""What a checkpoint's shape allows: read and judged without torch, on the login side and in the job.

Every checkpoint commits a small ``shape.json`` beside its files: the world size,
the backend, the ``--parallel`` layout, how the state is stored and each loader's global batch and
epoch. A job that resumes another job's checkpoint (``--resume-from``) is checked against it twice:
at submit, so a shape that cannot be resumed never queues, and again in the job before anything loads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SHAPE = "shape.json"
#: how the state is stored: replicated (one full state, whichever ranks wrote its pieces), DCP shards of a
#: layout, or a framework engine's own files
REPLICATED, SHARDED, ENGINE = "replicated", "sharded", "engine"


def read_shape(checkpoint: Path) -> dict[str, Any] | None:
    """The shape a checkpoint recorded; None for one saved before shapes were recorded (or unreadable)."""
    try:
        shape = json.loads((checkpoint / SHAPE).read_text())
    except (OSError, ValueError):
        return None
    return shape if isinstance(shape, dict) else None


def epoch_samples(dataset: int, dp: int, drop_last: bool) -> int:
    """Samples one epoch spans over ``dp`` data-parallel ranks (DistributedSampler: padded up, or cut)."""
    return (dataset // dp if drop_last else math.ceil(dataset / dp)) * dp


def loader_refusal(record: dict[str, Any], dp: int) -> str | None:
    """Why a loader saved as ``record`` cannot keep its global batch and sample order over ``dp`` ranks."""
    global_batch, dataset, saved_dp = record["global_batch"], record["dataset"], record["dp"]
    if global_batch % dp:
        return (
            f"the global batch of {global_batch} samples does not divide among {dp} data-parallel ranks "
            f"(resume with a data-parallel size that divides {global_batch})"
        )
    before, after = (epoch_samples(dataset, n, record["drop_last"]) for n in (saved_dp, dp))
    if before != after:
        return (
            f"an epoch of the {dataset}-sample dataset spans {before} samples over {saved_dp} ranks but {after} over "
            f"{dp} (the sampler pads or cuts to a multiple of the ranks), so the sample order would change "
            f"(resume with a data-parallel size that divides {dataset}, or one that pads the same way)"
        )
    return None


def refusal(shape: dict[str, Any], *, world: int, dp: int, pp: int, layout: bool, backend: str) -> str | None:
    """Why a checkpoint of ``shape`` cannot continue in a job of this shape; None when it can.

    ``dp``/``pp``: the new job's data-parallel and pipeline sizes; ``layout``: it has ``--parallel``.
    """
    saved_world, state = shape["world_size"], shape["state"]
    if backend != shape["backend"] and state != REPLICATED:
        return f"it was saved by backend {shape['backend']!r} in its own format; resume it with --backend {shape['backend']}"
    # an engine that reshards its own files records no reason; a shape without the key predates it
    reason = shape.get("reshard", "the engine's state is split across its ranks")
    if state == ENGINE and world != saved_world and reason:
        return f"it was saved by {saved_world} processes and cannot be resharded to {world}: {reason}"
    if state == REPLICATED and layout:
        return "it holds one full copy of the state (no --parallel); resume it without --parallel"
    if state == SHARDED and not layout:
        return f"it holds sharded state of --parallel {shape['layout']}; resume it with a --parallel layout (e.g. dp={world})"
    if state == SHARDED and pp != shape.get("pp", 1):
        return (
            f"it was saved with pp={shape.get('pp', 1)} pipeline stages; a different stage split is not resharded "
            f"(resume with pp={shape.get('pp', 1)}; dp and tp may change)"
        )
    for record in shape.get("loaders", []):
        problem = loader_refusal(record, dp)
        if problem:
            return problem
    return None


def describe(shape: dict[str, Any]) -> str:
    """``4 processes (torchrun, dp=2,tp=2,pp=1)``: the shape in a message."""
    extra = f", {shape['layout']}" if shape.get("layout") else ""
    return f"{shape['world_size']} processes ({shape['backend']}{extra})"
