"""Plain MPI (mpi4py): one Slurm task per process through srun's PMIx, mpirun on the local site."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from hpc_train import Backend, LaunchInfo, Word, hookimpl, launch_shim
from hpc_train.config.fields import Ge, Model, setting


@dataclass(frozen=True, kw_only=True)
class MpiOptions(Model):
    pmi: str = setting("pmix", "srun --mpi plugin (Debian's Open MPI has pmix, not pmi2)")
    omp_num_threads: Annotated[int, Ge(1)] | None = setting(None, "OMP_NUM_THREADS per process (default: CPUs per process)")


class MpiLaunched(Backend):
    """Backends whose processes are MPI ranks: srun --mpi=... on Slurm, mpirun locally."""

    options: MpiOptions
    supports_comm_hook = False

    def env(self, info: LaunchInfo) -> dict[str, str]:
        env = {"OMP_NUM_THREADS": str(self.options.omp_num_threads or info.cpus_per_proc or 1)}
        if info.scheduler == "local":
            # mpirun refuses root without these; containers and CI often run as root
            env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        return env

    def srun_args(self, info: LaunchInfo) -> list[Word]:
        return [f"--mpi={self.options.pmi}"]

    def launch(self, info: LaunchInfo) -> list[Word]:
        if info.scheduler == "local":
            return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(info.procs_per_node), *launch_shim(info)]
        return launch_shim(info)


class Mpi(MpiLaunched):
    name = "mpi"
    requires = ("torch", "mpi4py")
    summary = "MPI ranks (mpi4py): srun --mpi=pmix, one task per process; gradients averaged with MPI_Allreduce"
    Options = MpiOptions
    runtime = "hpc_train_backends.mpi_runtime:MpiRuntime"


@hookimpl
def hpc_train_backends() -> list[type[Backend]]:
    return [Mpi]
