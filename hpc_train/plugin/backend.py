"""The login-side half of a distributed backend: what it asks of Slurm and how it launches.

A backend plugin returns subclasses of :class:`Backend` from ``hpc_train_backends``. Nothing here
imports a framework; a backend's runtime half (``hpc_train.runtime``) imports its framework lazily.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from hpc_train.config.fields import Model


class Raw(str):
    """A shell word written verbatim: only for text a backend builds itself (``"${MASTER_ADDR}"``).

    Everything else that reaches a script is shell-quoted. User input must never be wrapped in Raw.
    """


Word = str | Raw


@dataclass(frozen=True, kw_only=True)
class NoOptions(Model):
    pass


@dataclass(frozen=True)
class CliOption:
    """A flag a backend adds to ``submit`` and ``render``: ``--deepspeed-config X`` is ``-o config=X``.

    The core lists every registered backend's flags under their own heading; a flag given with another
    backend is a usage error that names the backend it belongs to.
    """

    flag: str  # "--deepspeed-config"
    option: str  # the field of the backend's Options it sets: "config"
    help: str
    metavar: str | None = None


@dataclass(frozen=True)
class LaunchInfo:
    """What a backend needs to build its launch line; computed by the planner.

    Values known only once the job runs are shell variables the batch script exports, to be written
    as ``Raw`` words: ``"${MASTER_ADDR}"``, ``"${MASTER_PORT}"``, ``"${HPC_TRAIN_JOB_FOLDER}"``.
    """

    scheduler: Literal["slurm", "local"]
    nodes: int
    procs_per_node: int
    gpus_per_node: int
    python: str
    script: str
    script_args: tuple[str, ...]
    #: the site's ``master_port``: the job's own ports are a block of 4 from this plus a per-job offset
    #: (``SLURM_JOB_ID % 500 * 4``; locally, ``$$ % 2000``), so two jobs on one node do not collide. A launch line uses
    #: ``"${MASTER_PORT}"``, never this number
    master_port_base: int
    #: the folder job folders are created in (``--job-root``, else the site's ``job_root``); this job's own
    #: folder is ``<job_root>/<job id>``, known only in the job: ``"${HPC_TRAIN_JOB_FOLDER}"``
    job_root: str
    #: CPUs each process may use: its Slurm task's CPUs (--cpus-per-task, else the task's share of the
    #: node) divided among the processes the task starts (a launcher that forks workers shares them)
    cpus_per_proc: int | None = None
    #: the partition's ``gpu_bind``: "closest" asks each process to run on the CPUs nearest its GPU; srun does it
    #: for one task per GPU, a launcher that forks its workers (several processes per task) must do it for them
    gpu_bind: str | None = None
    precision: str | None = None
    grad_accum: int | None = None
    grad_clip: float | None = None
    #: what the job's processes will see that a backend may decide with: ``PWD`` (relative paths among the
    #: script's arguments) and the ``--parallel`` layout (``HPC_TRAIN_PARALLEL``) when the job has one
    env: dict[str, str] = field(default_factory=dict)
    #: the signal that tells the ranks to save and stop (``USR2``); None when the job does not requeue
    stop_signal: str | None = None

    # The old names, kept (with a warning) for plugins written against them: they held what the new names say.
    @property
    def master_port(self) -> int:
        """Deprecated: the base port, not the job's port; use ``master_port_base`` (or ``"${MASTER_PORT}"``)."""
        _renamed("master_port", "master_port_base")
        return self.master_port_base

    @property
    def job_folder(self) -> str:
        """Deprecated: the job *root*, not the job's folder; use ``job_root`` (or ``"${HPC_TRAIN_JOB_FOLDER}"``)."""
        _renamed("job_folder", "job_root")
        return self.job_root


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f'LaunchInfo.{old} is renamed LaunchInfo.{new} (docs/plugins.md, "LaunchInfo")', DeprecationWarning, stacklevel=3
    )


class Backend:
    """Subclass, set ``name``/``summary``, declare ``Options`` and override what differs.

    What a backend can do is declared in the class attributes below, and hpc_train reads nothing else:
    the core never looks a backend up by its name. The job-side half is the ``runtime`` class, whose own
    declarations are on :class:`hpc_train.runtime.engine.backend.BackendRuntime`.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    #: typed options (``--option key=value``, ``backend_options=``, site ``backends.<name>``); unknown keys
    #: rejected. A config dataclass (hpc_train.config.fields), or a pydantic model.
    Options: ClassVar[type] = NoOptions
    #: "module:Class" of the job-side half, a subclass of hpc_train.runtime.engine.backend.BackendRuntime, imported only
    #: in the job. The default suits a backend that changes only how processes start: torch.distributed from
    #: the environment, gradients averaged in one all-reduce per optimizer step (no DDP: that is torchrun's).
    runtime: ClassVar[str] = "hpc_train.runtime.engine.backend:AllReduceRuntime"
    #: whether --comm-hook applies: the runtime registers DDP communication hooks (the default runtime does not)
    supports_comm_hook: ClassVar[bool] = False
    #: why the runtime cannot split batches and change the accumulation as it runs (--micro-batch is then
    #: refused at submit with this reason); None: it can (hpc_train.runtime.step.memory)
    fixed_micro_batch: ClassVar[str | None] = None
    #: the --parallel axes ("dp", "tp", "pp") the runtime builds a device mesh for; () takes no layout
    parallel_axes: ClassVar[tuple[str, ...]] = ()
    #: distributions the job imports on the compute nodes, as pip names them (``doctor`` checks them)
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    #: flags of its own on ``submit``/``render``, each a shorthand for one ``--option`` (see CliOption)
    cli_options: ClassVar[tuple[CliOption, ...]] = ()

    def __init__(self, options: Any) -> None:
        self.options = options

    def tasks_per_node(self, procs_per_node: int) -> int:
        """Slurm tasks per node. Launchers that fork their own workers (torchrun) want 1."""
        return procs_per_node

    def env(self, info: LaunchInfo) -> dict[str, str]:
        """Environment the backend needs, beneath the user's and the hooks' values."""
        return {}

    def launch(self, info: LaunchInfo) -> list[Word]:
        """argv that runs the script on every task (after ``srun ...`` on Slurm, alone locally)."""
        return [info.python, "-u", info.script, *info.script_args]

    def srun_args(self, info: LaunchInfo) -> list[Word]:
        """Extra srun options for the launch step (``--mpi=pmix`` for MPI programs)."""
        return []

    def setup(self, info: LaunchInfo) -> list[str]:
        """Shell lines run in the batch script before the launch, written verbatim.

        Backends are trusted code: never put user input here, pass it through ``env()`` instead.
        """
        return []

    def cleanup(self, info: LaunchInfo) -> list[str]:
        """Shell lines run when the batch script exits, however it exits (verbatim, like ``setup``)."""
        return []


def launch_shim(info: LaunchInfo, *flags: str, args: list[Word] | None = None) -> list[Word]:
    """argv that runs the script through ``hpc_train.runtime.launch.worker``, which maps the launcher's
    variables (SLURM_*, OMPI_*) to RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* and then becomes the script."""
    script_args = list(info.script_args) if args is None else args
    return [info.python, "-m", "hpc_train.runtime.launch.worker", *flags, "--", info.script, *script_args]


def survive_stop_signal(info: LaunchInfo, argv: list[Word]) -> list[Word]:
    """``argv`` of a launcher that forks the ranks (``python -m torch.distributed.run ...``), made to
    survive the job's stop signal: ``scancel --signal`` reaches the launcher as well as the ranks, and a
    launcher killed by it ends the step while the ranks save. SIGTERM is left to the launcher's own
    handling (it forwards it and waits)."""
    if not info.stop_signal or info.stop_signal.upper().removeprefix("SIG") in ("TERM", "INT", "KILL"):
        return argv
    python, *rest = argv
    return [python, "-m", "hpc_train.runtime.launch.signal_guard", f"--ignore={info.stop_signal}", "--", *rest]
