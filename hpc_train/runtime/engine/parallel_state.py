"""This rank's place in a ``--parallel`` layout's device mesh (``ParallelState``): a record that the backend
base class, the layouts' code and the Context all name, in a module of its own so that naming it pulls
in none of them. Imports nothing of hpc_train's but the layout's record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpc_train.submission.layout import Layout


@dataclass(frozen=True)
class ParallelState:
    """This rank's place in the mesh and the process groups of its axes."""

    layout: Layout
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh, dims ("pp", "dp", "tp")

    def _rank(self, axis: str) -> int:
        return self.mesh.get_local_rank(axis)

    def _group(self, axis: str) -> Any:
        return self.mesh.get_group(axis)

    dp_rank = property(lambda self: self._rank("dp"))
    tp_rank = property(lambda self: self._rank("tp"))
    pp_rank = property(lambda self: self._rank("pp"))
    stage = pp_rank  # the pipeline stage index
    dp_size = property(lambda self: self.layout.dp)
    tp_size = property(lambda self: self.layout.tp)
    pp_size = property(lambda self: self.layout.pp)
    num_stages = pp_size
    dp_group = property(lambda self: self._group("dp"))
    tp_group = property(lambda self: self._group("tp"))
    pp_group = property(lambda self: self._group("pp"))
    is_first_stage = property(lambda self: self.pp_rank == 0)
    is_last_stage = property(lambda self: self.pp_rank == self.layout.pp - 1)

    def __repr__(self) -> str:
        return f"ParallelState({self.layout}, dp_rank={self.dp_rank}, tp_rank={self.tp_rank}, stage={self.stage})"
