"""Sharded state (tensor-parallel DTensors, one pipeline stage per rank) through torch.distributed.checkpoint.

Every rank writes its own shards into the checkpoint's ``engine/`` folder; the Checkpointer
(checkpoint/manager.py) does the rest exactly as for any backend: the folder is written under a temporary
name, fsynced, renamed, and only then committed with its COMMIT marker, which records every file's
size and content digest. So a requeued job restores only a checkpoint that every rank finished writing.

Model and optimizer state are keyed by parameter name (``get_state_dict``), not by the optimizer's
parameter index, so each pipeline stage's keys are distinct and a replicated tensor is written once.
The optimizer state is flattened (``param_groups.<name>.lr``): nested, each stage's list of param
groups would land under the same key and one stage's hyperparameters would overwrite the other's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _state(model: Any, optimizer: Any, scaler: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, [optimizer] if optimizer is not None else [], options=_options())
    state: dict[str, Any] = {"model": model_state}
    if optimizer is not None:
        state["optimizer"] = optim_state
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    return state


def save(folder: str, model: Any, optimizer: Any = None, scaler: Any = None) -> None:
    """Every rank calls this (a collective); each writes its shards into ``folder``."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(model, optimizer, scaler), checkpoint_id=folder)


def load(folder: str, model: Any, optimizer: Any = None, scaler: Any = None) -> None:
    """Every rank calls this; loads its shards in place (the layout must be the one that saved)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer, scaler)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(
        model,
        [optimizer] if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optimizer", {}),
        options=_options(),
    )
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])


class AsyncSaver:
    """``save`` in the background: DCP's async_save, which blocks only while it copies the state to CPU.

    Its writer thread runs collectives (plans, the metadata) while training runs its own, so it gets a
    process group of its own (gloo: DCP's async path needs a CPU backend); the stager is kept across
    saves (pinned CPU copies of GPU tensors, copied without waiting and synchronized once).
    """

    def __init__(self) -> None:
        self.group: Any = None
        self.stager: Any = None

    def start(self, folder: str, model: Any, optimizer: Any = None, scaler: Any = None) -> Callable[[], None]:
        """Every rank calls this (a collective); returns what waits until this rank's part is written."""
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self.group is None:  # every rank is here: save() is a collective
            self.group = dist.new_group(backend="gloo")
            gpu = torch.cuda.is_available()
            self.stager = DefaultStager(StagingOptions(gpu, False, False, gpu))
        state = _state(model, optimizer, scaler)
        future = dcp.async_save(state, checkpoint_id=folder, process_group=self.group, async_stager=self.stager)
        return lambda: future.result()  # type: ignore[union-attr]  # a Future: the stager stages at once
