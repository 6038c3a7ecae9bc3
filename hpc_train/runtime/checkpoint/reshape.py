"""Resume under a different shape: another job's checkpoint (``--resume-from``), any world size its state allows.

What is kept: the model, optimizer and scaler state, the step, the **global batch** (samples per
step over all data-parallel ranks) and the data order (the sampler's seed and position). What adapts:
the per-rank batch, ``global batch / data-parallel ranks``: ``ctx.loader(batch_size=...)`` is the
per-rank batch of the shape that started the run, so a script runs unchanged at any shape (one loader
batch stays one step; ``--micro-batch`` bounds the memory of a larger per-rank batch). What is refused,
before anything loads: a global batch the new ranks cannot split evenly, an epoch the sampler would pad
differently, and state the backend cannot reshard (hpc_train.resume_shape.refusal says which).

Every checkpoint records its shape (``shape.json``, committed with it) so the login side can refuse a
shape that cannot work before the job queues.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train.contract import committed
from hpc_train.resume_shape import ENGINE, REPLICATED, SHAPE, SHARDED, describe, loader_refusal, read_shape, refusal
from hpc_train.runtime.checkpoint.files import STATE_FILE
from hpc_train.runtime.lifecycle.no_retry import refuse_retry
from hpc_train.runtime.log import log

if TYPE_CHECKING:
    from hpc_train.runtime.data import DistributedLoader
    from hpc_train.runtime.views import CheckpointerView, ContextView


class ResumeError(RuntimeError):
    """The checkpoint to resume cannot continue in this job's shape; running again would fail the same way."""

    repeats = True


def shape(ctx: ContextView) -> dict[str, Any]:
    """This job's shape, as a checkpoint records it."""
    runtime = ctx.runtime
    if ctx.parallel is not None and not runtime.owns_parallelism:
        state = SHARDED  # hpc_train's own layout: DCP shards (hpc_train.runtime.checkpoint.sharded)
    else:
        state = ENGINE if runtime.engine_checkpoint or runtime.resharding is not None else REPLICATED
    layout = ctx.parallel.layout if ctx.parallel is not None else None
    return {
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "layout": str(layout) if layout is not None else None,
        "dp": layout.dp if layout is not None else ctx.world_size,
        "pp": layout.pp if layout is not None else 1,
        "state": state,
        "reshard": runtime.reshard_refusal(),
        "grad_accum": ctx.options.grad_accum,
        "loaders": [_loader_record(loader) for loader in ctx.loaders],
        # the code snapshot that saved it: a job resuming it with other code is told which files differ
        "code": os.environ.get(contract.ENV_CODE),
    }


def _loader_record(loader: DistributedLoader) -> dict[str, Any]:
    sampler, batch = loader.sampler, loader.loader.batch_size or 1
    return {
        "dataset": len(loader.loader.dataset),  # type: ignore[arg-type]
        "batch_size": batch,
        "dp": sampler.num_replicas,
        "global_batch": batch * sampler.num_replicas,
        "drop_last": sampler.drop_last,
        "shuffle": sampler.shuffle,
        "seed": sampler.seed,
    }


def write_shape(folder: Path, ctx: ContextView) -> None:
    """Into a checkpoint being written (rank 0): renamed into place and committed with the folder."""
    (folder / SHAPE).write_text(json.dumps(shape(ctx), indent=1, sort_keys=True))


def source(checkpointer: CheckpointerView) -> Path | None:
    """The other job's checkpoint folder to restore from: only while this job has none of its own."""
    folder = checkpointer.ctx.options.resume_from
    if not folder or checkpointer.complete():
        return None
    return Path(folder)


def _refuse(checkpointer: CheckpointerView, message: str) -> ResumeError:
    if checkpointer.ctx.is_main:
        log(message)
        refuse_retry(checkpointer.no_retry_file, message)
    return ResumeError(message)


def check(checkpointer: CheckpointerView, path: Path) -> None:
    """Raise ResumeError when checkpoint ``path`` cannot continue at this job's shape (before it loads)."""
    ctx = checkpointer.ctx
    saved = read_shape(path)
    mine = shape(ctx)
    if saved is None:  # saved before shapes were recorded: only its own shape is safe
        problem = None if _payload_world(path) == ctx.world_size else "it records no shape; resume it with its own world size"
    else:
        problem = refusal(
            saved, world=ctx.world_size, dp=mine["dp"], pp=mine["pp"], layout=mine["layout"] is not None, backend=ctx.backend
        )
    if problem:
        what = describe(saved) if saved else "an unknown shape"
        raise _refuse(
            checkpointer,
            f"{contract.ENV_RESUME_FROM}: cannot resume {path} (saved by {what}) in this job ({describe(mine)}): {problem}",
        )


def _payload_world(path: Path) -> int | None:
    import torch

    try:
        return int(torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)["world_size"])
    except Exception:  # unreadable: the verify and load that follow name what is wrong with it
        return None


def restore_from(checkpointer: CheckpointerView, folder: Path) -> int:
    """The newest checkpoint in another job's ``folder`` that checks out and loads; its step.

    Verified as the job's own are; nothing in ``folder`` is written (a damaged one is skipped, not set
    aside). None loading raises on every rank: never a silent start from step 0.
    """
    ctx = checkpointer.ctx
    candidates = ctx.runtime.gather_object(committed(folder) if ctx.is_main else None)[0]
    if not candidates:
        raise _refuse(checkpointer, f"{contract.ENV_RESUME_FROM}: {folder} has no committed checkpoint")
    failed = []
    for step, path in candidates:
        check(checkpointer, path)
        problem = checkpointer.loads(path)
        if problem is None:
            adapt(ctx, path)
            if ctx.is_main:
                log(f"run {checkpointer.run}: resumed step {step} from {path}; saving into {checkpointer.folder}")
            return step
        failed.append(f"step {step}: {problem}")
    raise _refuse(checkpointer, f"{contract.ENV_RESUME_FROM}: no checkpoint in {folder} loads ({'; '.join(failed)})")


def adapt(ctx: ContextView, path: Path) -> None:
    """Keep the global batch of the run checkpoint ``path`` restored in this job's loaders (now and those made later)."""
    ctx.restored_shape = read_shape(path)
    for index, loader in enumerate(ctx.loaders):
        _adapt_loader(ctx, loader, index)


def follow_loader(ctx: ContextView, loader: DistributedLoader) -> None:
    """A loader made by ``ctx.loader``: recorded in checkpoints, adapted to a shape restored before it."""
    ctx.loaders.append(loader)
    _adapt_loader(ctx, loader, len(ctx.loaders) - 1)


def _adapt_loader(ctx: ContextView, loader: DistributedLoader, index: int) -> None:
    records = (ctx.restored_shape or {}).get("loaders") or []
    if index >= len(records):
        return
    record, mine = records[index], _loader_record(loader)
    if (record["seed"], record["shuffle"], record["dataset"]) != (mine["seed"], mine["shuffle"], mine["dataset"]):
        raise ResumeError(
            f"loader {index}: the checkpoint's data order came from {record['dataset']} samples, seed {record['seed']}, "
            f"shuffle={record['shuffle']}; this job's loader has {mine['dataset']}, seed {mine['seed']}, "
            f"shuffle={mine['shuffle']}: give ctx.loader the same dataset, seed and shuffle to resume"
        )
    problem = loader_refusal(record, mine["dp"])
    if problem:
        raise ResumeError(f"loader {index}: {problem}")
    per_rank = record["global_batch"] // mine["dp"]
    if per_rank != mine["batch_size"]:
        loader.rebatch(per_rank)
        if ctx.is_main:
            log(
                f"loader {index}: global batch {record['global_batch']} kept over {mine['dp']} data-parallel ranks: "
                f"{per_rank} samples per rank (the script asked for {mine['batch_size']})"
            )
