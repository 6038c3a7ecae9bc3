"""torchrun (torch.distributed.run) DDP: one launcher task per node, which forks the workers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hpc_train import Backend, LaunchInfo, Raw, Word, hookimpl


class TorchrunOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rdzv_backend: Literal["c10d", "static"] = Field("c10d", description="rendezvous: c10d store on the first node, or static ranks")
    max_restarts: int = Field(0, ge=0, description="worker group restarts torchrun itself attempts")
    rdzv_timeout: int = Field(900, ge=1, description="seconds to wait for all nodes to join")
    omp_num_threads: int | None = Field(None, ge=1, description="OMP_NUM_THREADS per worker (torchrun's default: 1)")


class Torchrun(Backend):
    name = "torchrun"
    summary = "PyTorch DDP through torchrun: one launcher per node, c10d rendezvous on the first node"
    Options = TorchrunOptions
    options: TorchrunOptions

    def tasks_per_node(self, procs_per_node: int) -> int:
        return 1

    def env(self, info: LaunchInfo) -> dict[str, str]:
        if self.options.omp_num_threads is not None:
            return {"OMP_NUM_THREADS": str(self.options.omp_num_threads)}
        return {}

    def launch(self, info: LaunchInfo) -> list[Word]:
        argv: list[Word] = [info.python, "-m", "torch.distributed.run"]
        if info.scheduler == "local":
            argv += ["--standalone", "--nnodes=1"]
        else:
            argv += [
                f"--nnodes={info.nodes}",
                f"--rdzv-backend={self.options.rdzv_backend}",
                Raw('--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"'),
                Raw('--rdzv-id="${SLURM_JOB_ID}"'),
                f"--rdzv-conf=timeout={self.options.rdzv_timeout}",
            ]
            if self.options.rdzv_backend == "static":
                argv.append(Raw('--node-rank="${SLURM_NODEID}"'))
        argv += [f"--nproc-per-node={info.procs_per_node}", f"--max-restarts={self.options.max_restarts}"]
        return [*argv, info.script, *info.script_args]


@hookimpl
def hpc_train_backends() -> list[type[Backend]]:
    return [Torchrun]
