"""torchrun (torch.distributed.run) DDP: one launcher task per node, which forks the workers; or, with
``agent: false``, one srun task per rank through hpc_train's launch shim (no agent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from hpc_train import Backend, LaunchInfo, Raw, Word, hookimpl, launch_shim, survive_stop_signal
from hpc_train.config.fields import Ge, Model, setting
from hpc_train.errors import ConfigError, Problem
from hpc_train.submission.plan import JOB


@dataclass(frozen=True, kw_only=True)
class TorchrunOptions(Model):
    agent: bool = setting(
        True,
        "torchrun's agent forks each node's workers (rendezvous, max_restarts, NUMA binding); false: one srun task "
        "per rank sets torchrun's variables and runs the script, ~2 s sooner at every start and restart",
    )
    rdzv_backend: Literal["c10d", "static"] = setting("c10d", "rendezvous: c10d store on the first node, or static ranks")
    max_restarts: Annotated[int, Ge(0)] = setting(0, "worker group restarts torchrun itself attempts")
    rdzv_timeout: Annotated[int, Ge(1)] = setting(900, "seconds to wait for all nodes to join")
    omp_num_threads: Annotated[int, Ge(1)] | None = setting(
        None, "OMP_NUM_THREADS per worker (default: the task's CPUs / workers)"
    )


class Torchrun(Backend):
    name = "torchrun"
    parallel_axes = ("dp", "tp", "pp")  # the runtime builds a device mesh over these (--parallel)
    summary = "PyTorch DDP through torchrun: one launcher per node, c10d rendezvous on the first node"
    Options = TorchrunOptions
    runtime = "hpc_train_backends.torchrun_runtime:TorchrunRuntime"
    supports_comm_hook = True  # its runtime wraps the model in DDP, which takes communication hooks
    options: TorchrunOptions

    def tasks_per_node(self, procs_per_node: int) -> int:
        return 1 if self.options.agent else procs_per_node

    def env(self, info: LaunchInfo) -> dict[str, str]:
        if not self.options.agent and self.options.max_restarts and info.scheduler != "local":
            raise ConfigError(
                Problem(
                    JOB,
                    "backend option max_restarts",
                    f"max_restarts={self.options.max_restarts} restarts torchrun's agent's workers, and agent=false starts none",
                    hint="drop max_restarts (a failed run restarts anyway: --spare-nodes, --on-failure requeue), or keep agent=true",
                )
            )
        # the task's CPUs shared among its workers (torchrun itself would set 1 when nothing is set)
        threads = self.options.omp_num_threads or info.cpus_per_proc
        return {"OMP_NUM_THREADS": str(threads)} if threads else {}

    def launch(self, info: LaunchInfo) -> list[Word]:
        if not self.options.agent and info.scheduler != "local":
            # Without the agent a (re)start imports torch once, not twice, and waits for no rendezvous: the
            # shim maps srun's variables to RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* and becomes the script
            return launch_shim(info)
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
        if info.gpu_bind == "closest" and info.scheduler != "local":
            # each worker on its own share of the cores of its GPU's NUMA node (torch.numa; needs numactl)
            argv.append("--numa-binding=exclusive")
        return survive_stop_signal(info, [*argv, info.script, *info.script_args])


@hookimpl
def hpc_train_backends() -> list[type[Backend]]:
    return [Torchrun]
