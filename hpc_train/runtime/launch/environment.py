"""Who am I in the job? Rank, world and node from whichever launcher started this process.

Pure functions of an environment mapping, so each launcher's variables can be unit-tested without
launching anything. Order matters: a torchrun worker under srun sees both torchrun's variables and
srun's (of the launcher task); torchrun's describe the worker.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpc_train import contract


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun", "srun", "mpirun", "submitit-local", "single"

    def as_torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's env:// init and DeepSpeed read."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            contract.ENV_LAUNCHER: self.launcher,  # who really started us, once RANK & co. are set
        }


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return int(str(value).split("(")[0].split(",")[0])
    if default is None:
        raise KeyError(names[0])
    return default


def first_host(nodelist: str) -> str:
    """First host of a Slurm node list (``n[1-2],gpu07`` -> ``n1``) without calling scontrol."""
    match = re.match(r"([^\[,]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return nodelist
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _master(environ: Mapping[str, str]) -> tuple[str, int]:
    addr = environ.get("MASTER_ADDR")
    if not addr and environ.get("SLURM_JOB_NODELIST"):
        addr = first_host(environ["SLURM_JOB_NODELIST"])
    port = _int(environ, "MASTER_PORT", default=29500)
    return addr or "127.0.0.1", port


def _torchrun(env: Mapping[str, str], addr: str, port: int) -> DistEnv:
    world = _int(env, "WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE", default=world)
    rank = _int(env, "RANK")
    node = _int(env, "GROUP_RANK", default=rank // max(1, local_world))
    return DistEnv(rank, _int(env, "LOCAL_RANK", default=0), world, local_world, node, max(1, world // max(1, local_world)),
                   addr, port, env.get(contract.ENV_LAUNCHER, "torchrun"))  # fmt: skip


def _open_mpi(env: Mapping[str, str], addr: str, port: int) -> DistEnv:
    rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", default=1)
    node = _int(env, "OMPI_COMM_WORLD_NODE_RANK", default=rank // max(1, local_world))
    return DistEnv(rank, _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=0), world, local_world, node,
                   max(1, world // max(1, local_world)), addr, port, "mpirun")  # fmt: skip


def _srun_task(env: Mapping[str, str], addr: str, port: int) -> DistEnv:
    world = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1)
    per_node = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    local_world = _int(env, *per_node, default=max(1, world // nodes))
    return DistEnv(_int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID", default=0), world, local_world,
                   _int(env, "SLURM_NODEID", default=0), nodes, addr, port, "srun")  # fmt: skip


def _submitit_local(env: Mapping[str, str], addr: str, port: int) -> DistEnv:
    world = _int(env, "SUBMITIT_LOCAL_NTASKS", default=1)
    return DistEnv(_int(env, "SUBMITIT_LOCAL_GLOBALID"), _int(env, "SUBMITIT_LOCAL_LOCALID", default=0), world, world,
                   0, 1, addr, port, "submitit-local")  # fmt: skip


def detect(environ: Mapping[str, str] | None = None) -> DistEnv:
    env = os.environ if environ is None else environ
    addr, port = _master(env)
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, the deepspeed launcher, our launch shim
        return _torchrun(env, addr, port)
    if "OMPI_COMM_WORLD_RANK" in env:  # mpirun (or srun --mpi=pmix once MPI has started)
        return _open_mpi(env, addr, port)
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:  # a task of an srun step (not the batch shell)
        return _srun_task(env, addr, port)
    if "SUBMITIT_LOCAL_GLOBALID" in env:  # submitit's local executor (function jobs on the local site)
        return _submitit_local(env, addr, port)
    return DistEnv(0, 0, 1, 1, 0, 1, addr, port, "single")
