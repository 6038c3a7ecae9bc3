"""Job side of the horovod backend: hvd.init, DistributedOptimizer, rank 0's state broadcast."""

from __future__ import annotations

import functools
from typing import Any

from hpc_train.runtime.engine.backend import BackendRuntime
from hpc_train.runtime.launch.environment import DistEnv


class HorovodRuntime(BackendRuntime):
    name = "horovod"

    @functools.cached_property
    def hvd(self) -> Any:
        import horovod.torch as hvd

        return hvd

    def init(self) -> None:
        hvd = self.hvd
        hvd.init()
        env = self.env
        self.env = DistEnv(
            hvd.rank(),
            hvd.local_rank(),
            hvd.size(),
            hvd.local_size(),
            hvd.cross_rank(),
            hvd.cross_size(),
            env.master_addr,
            env.master_port,
            env.launcher,
        )

    def shutdown(self) -> None:
        # joins Horovod's background thread (the GIL released: a ctypes call) before the interpreter exits
        self.hvd.shutdown()

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        model, optimizer = super().prepare(model, optimizer)
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if optimizer is not None:
            compression = hvd.Compression.fp16 if self.options.backend_options.get("fp16_compression") else hvd.Compression.none
            optimizer = hvd.DistributedOptimizer(
                optimizer,
                named_parameters=model.named_parameters(),
                compression=compression,
                backward_passes_per_step=self.options.grad_accum,
            )
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self.optimizer = optimizer
        return model, optimizer

    def wrap(self, model: Any) -> Any:
        return model  # Horovod averages through the optimizer, not a model wrapper

    def set_gradient_sync(self, sync: bool) -> None:
        """DistributedOptimizer counts backward passes itself (backward_passes_per_step)."""

    def synchronize_gradients(self) -> None:
        self.optimizer.synchronize()  # before clipping, so every rank clips the averaged gradient

    def optimizer_step(self) -> None:
        with self.optimizer.skip_synchronize():
            super().optimizer_step()

    def all_reduce(self, tensor: Any, op: str = "sum") -> Any:
        hvd = self.hvd
        result = hvd.allreduce(tensor, op=hvd.Average if op == "mean" else hvd.Sum)
        tensor.copy_(result)
        return tensor

    def barrier(self) -> None:
        self.hvd.barrier()

    def gather_object(self, obj: Any) -> list[Any]:
        # one name on every rank: by default Horovod names it after type(obj), so ranks gathering a None
        # and a str (one saw the stop request, one not yet) wait for each other forever
        return self.hvd.allgather_object(obj, name="hpc_train.gather_object")
