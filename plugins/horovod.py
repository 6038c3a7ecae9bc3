"""Horovod: one MPI rank per GPU (or CPU process) through srun's PMIx; mpirun on the local site."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from hpc_train_backends.mpi import MpiLaunched

from hpc_train import Backend, LaunchInfo, hookimpl
from hpc_train.config.fields import Ge, Gt, Model, setting


@dataclass(frozen=True, kw_only=True)
class HorovodOptions(Model):
    pmi: str = setting("pmix", "srun --mpi plugin")
    fusion_threshold_mb: Annotated[int, Ge(0)] | None = setting(None, "HOROVOD_FUSION_THRESHOLD (tensor fusion buffer)")
    cycle_time_ms: Annotated[float, Gt(0)] | None = setting(None, "HOROVOD_CYCLE_TIME between fusion cycles")
    fp16_compression: bool = setting(False, "compress gradients to fp16 for the all-reduce")
    cpu_operations: Literal["gloo", "mpi"] | None = setting(None, "HOROVOD_CPU_OPERATIONS")
    omp_num_threads: Annotated[int, Ge(1)] | None = setting(None, "OMP_NUM_THREADS per process (default: CPUs per process)")


class Horovod(MpiLaunched):
    name = "horovod"
    requires = ("torch", "horovod")
    summary = "Horovod: hvd.DistributedOptimizer over MPI ranks (srun --mpi=pmix, one task per process)"
    Options = HorovodOptions
    runtime = "hpc_train_backends.horovod_runtime:HorovodRuntime"
    fixed_micro_batch = (
        "hvd.DistributedOptimizer fixes its backward passes per step when it is built and starts its all-reduces "
        "during backward, where a rank out of memory would leave the others waiting; use --grad-accum"
    )
    options: HorovodOptions

    def env(self, info: LaunchInfo) -> dict[str, str]:
        env = super().env(info)
        if self.options.fusion_threshold_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(self.options.fusion_threshold_mb * 1024 * 1024)
        if self.options.cycle_time_ms is not None:
            env["HOROVOD_CYCLE_TIME"] = str(self.options.cycle_time_ms)
        if self.options.cpu_operations is not None:
            env["HOROVOD_CPU_OPERATIONS"] = self.options.cpu_operations
        return env


@hookimpl
def hpc_train_backends() -> list[type[Backend]]:
    return [Horovod]
