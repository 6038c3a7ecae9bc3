"""DeepSpeed's engine checkpoint written in the background (``--async-checkpoint``).

DeepSpeed builds its state dicts on every rank and hands each file's to its checkpoint engine's
``save(state_dict, path)``. For one save hpc_train puts :class:`DeferredWrites` in the engine's place: it
copies each state dict into CPU buffers kept from the previous save (the only part that blocks
training) and leaves the writing to hpc_train's checkpoint writer thread, which calls :meth:`write_all`.
Everything else (folders, the ``latest`` file, loading) stays DeepSpeed's own engine's.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from hpc_train.runtime.checkpoint import shares as shard_save


class DeferredWrites:
    """Stands in for the engine's checkpoint engine during one ``save_checkpoint``."""

    def __init__(self, engine: Any, staging: dict[str, Any], group: Any) -> None:
        self._engine = engine  # DeepSpeed's own: it writes, later, what was copied now
        self._staging = staging  # file name -> buffers of the previous save, reused
        self._group = group  # a gloo group of the ranks' writer threads; None for one process
        self.pending: list[tuple[Any, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def save(self, state_dict: Any, path: str) -> None:
        buffers = self._staging.setdefault(os.path.basename(path), {})
        self.pending.append((_own_objects(shard_save.snapshot(state_dict, buffers)), path))

    def write_all(self) -> None:
        """In the writer thread: every file, then a barrier of the writer threads, so that when rank 0's
        returns every rank's files are written (rank 0 then digests and fsyncs them)."""
        try:
            for state, path in self.pending:
                self._engine.save(state, path)
        finally:
            self.pending = []
            if self._group is not None:
                import torch.distributed as dist

                dist.barrier(group=self._group)


def _own_objects(obj: Any) -> Any:
    """The snapshot's plain objects copied too: a loss scaler in the state changes with training."""
    if isinstance(obj, dict):
        return {key: _own_objects(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_own_objects(value) for value in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj) and type(obj).__module__ != "torch":
        try:
            return copy.copy(obj)
        except Exception:  # an object that will not copy is written as it is then
            return obj
    return obj
