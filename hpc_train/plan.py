"""JobSpec + site + backend → JobPlan: every decision about the job, made once, without I/O.

The renderer only formats a plan; the executor only submits one. Everything a user could get
wrong is checked here and reported together.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_train import nccl
from hpc_train.backend import Backend, LaunchInfo, Raw, Word
from hpc_train.config.errors import problems_from_validation
from hpc_train.config.fields import field_names
from hpc_train.config.job import JobSpec
from hpc_train.config.loader import ResolvedSite, display_path
from hpc_train.config.models import Partition, SiteConfig
from hpc_train.config.slurm_time import format_slurm_time, parse_slurm_time
from hpc_train.config.validate import ValidationError, defaults, dump, validate
from hpc_train.errors import ConfigError, Problem, did_you_mean
from hpc_train.layout import ENV_VAR as LAYOUT_ENV
from hpc_train.layout import problems as check_layout

if TYPE_CHECKING:
    from hpc_train.plugins import Plugins

JOB = "<job>"  # the source name for problems in what the user passed


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | Raw
    source: str  # "site", "partition a100", "nccl profile ib-hdr", "backend torchrun", "plugin x", "job", "hpc_train"


@dataclass
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
    sweep: Any = None  # hpc_train.sweep.ArrayPart: this script is one array of a sweep (its tasks, their overrides)

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def folder(self) -> str:
        """The job folder, with Slurm's %j for the job id (submitit fills it in)."""
        return os.path.join(self.job_root, "%j")

    @property
    def stdout_pattern(self) -> str:
        if self.sweep is not None:  # a link to the sweep task's own folder, made by the script (hpc_train.sweep)
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


def _expand(path: str, workdir: str) -> str:
    expanded = os.path.expanduser(os.path.expandvars(path))
    return os.path.normpath(os.path.join(workdir, expanded))


def build_plan(
    job: JobSpec,
    resolved: ResolvedSite,
    plugins: Plugins,
    *,
    kind: Literal["script", "function"] = "script",
    function_name: str | None = None,
    extra_script_args: tuple[Word, ...] = (),
) -> JobPlan:
    site = resolved.config
    problems: list[Problem] = []
    site_file = display_path(resolved.path)

    def problem(key: str, message: str, hint: str | None = None, source: str = JOB) -> None:
        problems.append(Problem(source, key, message, None, hint))

    # --- backend and its options (site defaults < job options) -------------------------
    backend_cls = plugins.backend(job.backend)
    for name in site.backends:
        if name not in plugins.backends:
            problem(f"backends.{name}", "no such backend", did_you_mean(name, plugins.backends, "backend"), site_file)
    raw_options = {**site.backends.get(job.backend, {}), **job.backend_options}
    options: Any = None
    try:
        options = validate(backend_cls.Options, raw_options)
    except ValidationError as exc:
        problems.extend(problems_from_validation(exc, backend_cls.Options, f"backend {job.backend!r} options", prefix=()))
    backend = backend_cls(options if options is not None else defaults(backend_cls.Options))

    if job.comm_hook not in (None, "none") and not backend_cls.supports_comm_hook:
        problem("comm_hook", f"backend {job.backend!r} has no DDP communication hooks; use it with --backend torchrun")

    # --- partition and resources -------------------------------------------------------
    part_name, part = site.partition(job.partition)
    if job.partition and site.partitions and part is None:
        problem("partition", f"site {site.name!r} has no partition {job.partition!r}",
                did_you_mean(job.partition, site.partitions, "partition"))
    part = part or Partition()
    gpus = job.gpus_per_node if job.gpus_per_node is not None else part.gpus_per_node
    if site.partitions and part_name in site.partitions and gpus > part.gpus_per_node:
        problem("gpus_per_node", f"partition {part_name!r} has {part.gpus_per_node} GPUs per node, {gpus} requested")
    procs = job.procs_per_node or (gpus if gpus > 0 else 1)
    if part.max_nodes is not None and job.nodes > part.max_nodes:
        problem("nodes", f"partition {part_name!r} allows at most {part.max_nodes} nodes, {job.nodes} requested")
    if site.scheduler == "local" and job.nodes > 1:
        problem("nodes", f"site {site.name!r} runs on this machine only: use --nodes 1 and --procs-per-node N")

    time_value = job.time if job.time is not None else part.default_time
    time_seconds = parse_slurm_time(time_value) if time_value is not None else None
    if time_seconds is not None and part.max_time is not None:
        limit = parse_slurm_time(part.max_time)
        if time_seconds > limit:
            problem("time", f"{format_slurm_time(time_seconds)} exceeds partition {part_name!r}'s limit {format_slurm_time(limit)}")

    # --- NCCL profile ------------------------------------------------------------------
    # inheritance (extends) and "+debug" overlays are resolved in hpc_train.nccl
    selection = nccl.select(site.nccl_profiles, job.nccl_profile, part.nccl_profile, site.name)
    profile = selection.label
    for message, hint in selection.problems:
        problem("nccl_profile", message, hint)

    if (job.container or job.container_image) and site.container.runtime == "none":
        problem("container", f"site {site.name!r} has no container runtime (container.runtime in the site file)")
    elif job.container and not (job.container_image or site.container.image):
        problem("container", f"site {site.name!r} names no container image; give one with --container-image")

    policy = site.requeue
    requeue = site.scheduler == "slurm" and (job.requeue if job.requeue is not None else policy.enabled)
    grace = job.signal_grace or policy.grace_seconds
    if job.requeue and site.scheduler != "slurm":
        problem("requeue", f"site {site.name!r} runs on this machine; only Slurm sites requeue")
    if requeue and time_seconds is not None and grace >= time_seconds:
        problem("signal_grace", f"the warning ({grace} s before the limit) must come after the job starts "
                f"(time limit {format_slurm_time(time_seconds)})")

    # --- tensor / pipeline parallel layout --------------------------------------------------
    layout = None
    if job.parallel is not None:
        layout, layout_problems = check_layout(job.parallel, nodes=job.nodes, procs_per_node=procs, gpus_per_node=gpus,
                                               backend=job.backend, backend_axes=getattr(backend_cls, "parallel_axes", None))
        for message, hint in layout_problems:
            problem("parallel", message, hint)

    # --- site policy from plugins --------------------------------------------------------
    for message in plugins.validate_job(job, site):
        problem("", message, source=f"site policy ({site.name})")

    if problems:
        raise ConfigError(problems)
    workdir = os.path.abspath(job.workdir or os.getcwd())

    python = job.python or site.python or sys.executable
    job_root = _expand(job.job_root or site.job_root, workdir)
    script = ""
    if kind == "script":
        if not job.script:
            raise ConfigError(Problem(JOB, "script", "a script job needs a training script"))
        script = _expand(job.script, workdir)
    name = job.job_name or (f"hpc_train-{Path(script).stem}" if script else f"hpc_train-{function_name or 'function'}")

    # --- environment, lowest precedence first --------------------------------------------
    env: dict[str, EnvVar] = {}

    def put(values: dict[str, str], source: str) -> None:
        for key, value in values.items():
            env[key] = EnvVar(key, value, source)

    put(site.env, "site")
    put(part.env, f"partition {part_name}")
    for var_name, var_value, var_source in selection.variables:
        put({var_name: var_value}, var_source)
    put({f"HPC_TRAIN_{key.upper()}_DIR": _expand(value, workdir) for key, value in site.storage.items()}, "site storage")
    info = LaunchInfo(
        scheduler=site.scheduler,
        nodes=job.nodes,
        procs_per_node=procs,
        gpus_per_node=gpus,
        python=python,
        script=script,
        script_args=(*job.script_args, *extra_script_args),  # extra: a sweep task's overrides (Raw)
        master_port=site.master_port,
        job_folder=job_root,
        cpus_per_proc=job.cpus_per_task or (part.cpus_per_node // procs if part.cpus_per_node else None),
        precision=job.precision,
        grad_accum=job.grad_accum,
        grad_clip=job.grad_clip,
    )
    put(backend.env(info), f"backend {backend.name}")
    put(plugins.job_env(job, site, backend.name), "plugins")
    if options is not None and field_names(backend_cls.Options):
        put({"HPC_TRAIN_BACKEND_OPTIONS": json.dumps(dump(options), separators=(",", ":"))}, f"backend {backend.name}")
    training = {
        "HPC_TRAIN_PRECISION": job.precision,
        "HPC_TRAIN_GRAD_CLIP": None if job.grad_clip is None else repr(job.grad_clip),
        "HPC_TRAIN_GRAD_ACCUM": None if job.grad_accum is None else str(job.grad_accum),
        "HPC_TRAIN_COMM_HOOK": job.comm_hook,
        "HPC_TRAIN_ACTIVATION_CHECKPOINTING": None if job.activation_checkpointing is None else str(int(job.activation_checkpointing)),
    }
    put({k: v for k, v in training.items() if v is not None}, "job")
    checkpointing = {
        "HPC_TRAIN_CHECKPOINT_EVERY": job.checkpoint_every,
        "HPC_TRAIN_KEEP_CHECKPOINTS": job.keep_checkpoints,
        "HPC_TRAIN_ASYNC_CHECKPOINT": None if job.async_checkpoint is None else int(job.async_checkpoint),
        "HPC_TRAIN_EXACT_RESUME": None if job.exact_resume is None else int(job.exact_resume),
        "HPC_TRAIN_METRICS": None if job.metrics is None else int(job.metrics),  # read by hpc_train.runtime.metrics
    }
    put({k: str(v) for k, v in checkpointing.items() if v is not None}, "job")
    if layout is not None:
        put({LAYOUT_ENV: str(layout)}, "job")  # the runtime builds its device mesh from this
    put(dict(job.env), "job")
    put({
        "HPC_TRAIN_SITE": site.name,
        "HPC_TRAIN_BACKEND": backend.name,
        "HPC_TRAIN_NODES": str(job.nodes),
        "HPC_TRAIN_PROCS_PER_NODE": str(procs),
        "HPC_TRAIN_JOB_ROOT": job_root,
    }, "hpc_train")

    # --- #SBATCH directives ------------------------------------------------------------
    directives: dict[str, Any] = {}
    tasks = backend.tasks_per_node(procs) if kind == "script" else procs
    if site.scheduler == "slurm":
        directives.update({
            "job-name": name,
            "nodes": job.nodes,
            "ntasks-per-node": tasks,
            "output": os.path.join(job_root, "%j", "%j_0_log.out"),
            "error": os.path.join(job_root, "%j", "%j_0_log.err"),
            "open-mode": "append",
        })
        if part_name:
            directives["partition"] = part_name
        if time_seconds is not None:
            directives["time"] = format_slurm_time(time_seconds)
        if gpus > 0:
            directives["gres"] = f"gpu:{part.gpu_type}:{gpus}" if part.gpu_type else f"gpu:{gpus}"
        if requeue:
            # B: -> only the batch shell gets the warning; it tells the ranks through a file
            directives["requeue"] = True
            directives["signal"] = f"B:{policy.signal}@{grace}"
        for key in ("cpus_per_task", "mem", "account", "qos", "reservation", "constraint"):
            value = getattr(job, key)
            if key == "constraint" and value is None:
                value = part.constraint
            if key == "mem" and value is None:
                value = part.mem_per_node
            if value is not None:
                directives[key.replace("_", "-")] = value
        directives.update(site.sbatch)
        directives.update(part.sbatch)
        directives.update(plugins.sbatch_directives(job, site, backend.name))
        directives.update(job.sbatch)
        if job.after:  # a dependency that can never be met cancels the job instead of leaving it pending
            directives.setdefault("dependency", f"{job.after_type}:" + ":".join(job.after))
            directives.setdefault("kill-on-invalid-dep", "yes")
    sorted_directives = sorted((k, v) for k, v in directives.items() if v is not None and v is not False)

    launch: list[Word] = backend.launch(info) if kind == "script" else []
    srun_args: list[Word] = backend.srun_args(info) if kind == "script" else []
    setup_lines = backend.setup(info) if kind == "script" else []
    cleanup_lines = backend.cleanup(info) if kind == "script" else []
    plan = JobPlan(
        job=job,
        site=site,
        site_path=resolved.path,
        backend=backend,
        kind=kind,
        scheduler=site.scheduler,
        partition=part_name,
        nodes=job.nodes,
        procs_per_node=procs,
        tasks_per_node=tasks,
        gpus_per_node=gpus,
        time_seconds=time_seconds,
        job_name=name,
        job_root=job_root,
        python=python,
        workdir=workdir,
        directives=sorted_directives,
        env=sorted(env.values(), key=lambda e: e.name),
        nccl_profile=profile,
        launch=launch,
        requeue=requeue,
        max_restarts=job.max_restarts if job.max_restarts is not None else policy.max_restarts,
        signal=policy.signal,
        signal_grace=grace,
        on_failure=job.on_failure or policy.on_failure,
        release_held=policy.release_held,
        srun_args=srun_args,
        backend_setup=setup_lines,
        backend_cleanup=cleanup_lines,
    )
    plan.warnings = nccl.job_warnings(selection, site, part_name, resolved.provenance, site_file)
    plan.extra = plugins.template_context(plan)
    return plan
