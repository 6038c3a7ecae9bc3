"""The plan of one job: every decision about it, as a record (``JobPlan``). Made by ``submission.plan``,
formatted by the renderer, submitted by the executor, and handed to plugins through the hook specs; in a
module of its own so the contract (``plugin.hookspecs``) names it without importing the planner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_train.errors import Problem
from hpc_train.plugin.backend import Backend, Raw, Word

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.config.models import SiteConfig


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | Raw
    source: str  # "site", "partition a100", "nccl profile ib-hdr", "backend torchrun", "plugin x", "job", "hpc_train"


@dataclass(frozen=True)
class JobPlan:
    job: JobSpec
    site: SiteConfig
    site_path: Path
    backend: Backend
    kind: Literal["script", "function"]
    scheduler: Literal["slurm", "local"]
    partition: str | None
    nodes: int
    procs_per_node: int
    tasks_per_node: int
    gpus_per_node: int
    time_seconds: int | None
    job_name: str
    job_root: str
    python: str
    workdir: str
    directives: list[tuple[str, Any]]
    env: list[EnvVar]
    nccl_profile: str | None
    launch: list[Word]
    requeue: bool = False
    max_restarts: int = 0
    signal: str = "USR2"
    signal_grace: int = 120
    on_failure: str = "fail"
    release_held: bool = False
    srun_args: list[Word] = field(default_factory=list)
    backend_setup: list[str] = field(default_factory=list)
    backend_cleanup: list[str] = field(default_factory=list)
    function_command: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    warnings: list[Problem] = field(default_factory=list)  # worth saying, not worth stopping for (render prints them)
    sweep: Any = None  # hpc_train.sweeps.scripts.ArrayPart: this script is one array of a sweep (its tasks, their overrides)
    watchdog: bool = False  # the batch script runs hpc_train.runtime.supervise.watchdog next to the step (hangs)
    node_check: bool = False  # each node runs hpc_train.runtime.supervise.node_check before a run trains on it
    spare_nodes: int = 0  # allocated beyond ``nodes``: a failed run restarts on them inside the allocation
    cpus_per_task: int | None = None  # asked of sbatch and, again, of srun (22.05's srun does not inherit it)
    cpu_bind: str | None = None  # srun --cpu-bind (the partition's)
    gpu_bind: bool = False  # srun --gpu-bind=closest: the partition asks and each task drives one GPU
    code: Any = None  # hpc_train.snapshot.code.Code: the snapshot the script runs from (None: the files in place)

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def folder(self) -> str:
        """The job folder, with Slurm's %j for the job id (submitit fills it in)."""
        return os.path.join(self.job_root, "%j")

    @property
    def stdout_pattern(self) -> str:
        if self.sweep is not None:  # a link to the sweep task's own folder, made by the script (hpc_train.sweeps.scripts)
            return os.path.join(self.sweep.folder, "slurm", "%A_%a", "%t_log.out")
        return os.path.join(self.folder, "%j_%t_log.out")

    @property
    def stderr_pattern(self) -> str:
        if self.sweep is not None:
            return os.path.join(self.sweep.folder, "slurm", "%A_%a", "%t_log.err")
        return os.path.join(self.folder, "%j_%t_log.err")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node
