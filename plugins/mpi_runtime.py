"""Job side of the mpi backend: mpi4py for every collective, no torch process group needed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpc_train.runtime.engine.backend import BackendRuntime
from hpc_train.runtime.launch.environment import DistEnv


class MpiRuntime(BackendRuntime):
    name = "mpi"

    @property
    def comm(self) -> Any:
        from mpi4py import MPI

        return MPI.COMM_WORLD

    def init(self) -> None:
        comm = self.comm  # MPI_Init happens on import; the world comes from MPI itself
        env = self.env
        if (comm.Get_rank(), comm.Get_size()) != (env.rank, env.world_size):
            self.env = DistEnv(
                comm.Get_rank(),
                env.local_rank,
                comm.Get_size(),
                env.local_world_size,
                env.node_rank,
                env.num_nodes,
                env.master_addr,
                env.master_port,
                env.launcher,
            )

    def abandon(self) -> None:
        """MPI has no timeouts: the others would wait in their Allreduce forever, and this rank in
        MPI_Finalize (a fence with them) at exit. Abort the world, as ``python -m mpi4py`` does."""
        self.comm.Abort(1)

    def shutdown(self) -> None:
        """Nothing to stop: the Context's barrier already ran (when orderly), mpi4py finalizes MPI at exit."""

    def wrap(self, model: Any) -> Any:
        import torch

        with torch.no_grad():  # start every replica from rank 0's weights
            for tensor in list(model.parameters()) + list(model.buffers()):
                host = tensor.detach().cpu().contiguous()
                self.comm.Bcast(host.numpy(), root=0)
                tensor.copy_(host)
        return model

    def set_gradient_sync(self, sync: bool) -> None:
        """Gradients are averaged once per optimizer step, in synchronize_gradients."""

    def synchronize_gradients(self) -> None:
        import torch
        from mpi4py import MPI

        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads or self.env.world_size == 1:
            return
        # one flat buffer: one MPI call per step instead of one per parameter
        flat = torch.cat([g.detach().reshape(-1).to("cpu", torch.float32) for g in grads])
        with torch.profiler.record_function("mpi_allreduce"):  # what --profile torch counts as communication
            self.comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
        flat /= self.env.world_size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def all_reduce(self, tensor: Any, op: str = "sum") -> Any:
        from mpi4py import MPI

        host = tensor.detach().cpu().contiguous()
        self.comm.Allreduce(MPI.IN_PLACE, host.numpy(), op=MPI.SUM)
        if op == "mean":
            host /= self.env.world_size
        tensor.copy_(host)
        return tensor

    def barrier(self) -> None:
        self.comm.Barrier()

    def any_ranks(self, flags: Sequence[bool]) -> tuple[bool, ...]:
        from mpi4py import MPI

        # the flags as the bits of one int: one allreduce, no torch tensor to stage
        bits = self.comm.allreduce(sum(1 << i for i, flag in enumerate(flags) if flag), op=MPI.BOR)
        return tuple(bool(bits >> i & 1) for i in range(len(flags)))

    def gather_object(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)
