"""JobSpec + site + backend → JobPlan: every decision about the job, made once, without I/O.

The renderer only formats a plan; the executor only submits one. Everything a user could get
wrong is checked here and reported together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_train import contract, resume_shape
from hpc_train.config import profile_spec
from hpc_train.config.errors import problems_from_validation
from hpc_train.config.fields import field_names, flag_of, to_env
from hpc_train.config.job import JobSpec
from hpc_train.config.loader import display_path
from hpc_train.config.models import Partition, SiteConfig, mem_megabytes, mem_size_problem
from hpc_train.config.resolved import ResolvedSite
from hpc_train.config.slurm_time import format_slurm_time, parse_slurm_time
from hpc_train.config.validate import ValidationError, defaults, dump, validate
from hpc_train.errors import ConfigError, Problem, did_you_mean
from hpc_train.fabric import nccl
from hpc_train.plugin.backend import Backend, LaunchInfo, Word
from hpc_train.submission.job_plan import EnvVar, JobPlan
from hpc_train.submission.layout import ENV_VAR as LAYOUT_ENV
from hpc_train.submission.layout import problems as check_layout

if TYPE_CHECKING:
    from hpc_train.plugin.manager import Plugins

JOB = "<job>"  # the source name for problems in what the user passed
USER_VAR = re.compile(r"\$(?:USER(?![A-Za-z0-9_])|\{USER\})")  # $USER or ${USER}, not $USERNAME


def _login_user() -> str | None:
    """Who $USER means: the variable, else this account's name (cron, `su`, some containers leave USER unset)."""
    if os.environ.get("USER"):
        return os.environ["USER"]
    import getpass

    try:
        return getpass.getuser() or None
    except (KeyError, OSError):  # no passwd entry for this uid (KeyError before Python 3.13)
        return None


def _expand(path: str, workdir: str) -> str:
    """A path as the job will use it, expanded here: $USER is the submitting user even where USER is unset."""
    if not os.environ.get("USER") and USER_VAR.search(path):
        user = _login_user()  # never None here: _check_user refused the job
        path = USER_VAR.sub(lambda _: user or "$USER", path)
    expanded = os.path.expanduser(os.path.expandvars(path))
    return os.path.normpath(os.path.join(workdir, expanded))


class _Problems(list[Problem]):
    """Everything wrong with the job, gathered by every step and reported at once."""

    def __init__(self, site_file: str) -> None:
        super().__init__()
        self.site_file = site_file

    def add(self, key: str, message: str, hint: str | None = None, source: str = JOB) -> None:
        """``key``: the JobSpec field (or the CLI flag) the problem is about; shown as the flag."""
        self.append(Problem(source, flag_of(JobSpec, key) if source == JOB else key, message, None, hint))


@dataclass(frozen=True)
class _Resources:
    """Where the job runs and with how much: the partition, its processes and GPUs, its time."""

    part_name: str | None
    part: Partition
    gpus: int
    procs: int
    time_seconds: int | None


@dataclass(frozen=True)
class _Requeue:
    enabled: bool
    grace: int
    policy: Any  # the site's RequeuePolicy


@dataclass(frozen=True)
class _Names:
    """The job's paths and name on the compute nodes."""

    workdir: str
    python: str
    job_root: str
    script: str
    job_name: str


def build_plan(
    job: JobSpec,
    resolved: ResolvedSite,
    plugins: Plugins,
    *,
    kind: Literal["script", "function"] = "script",
    function_name: str | None = None,
    extra_script_args: tuple[Word, ...] = (),
) -> JobPlan:
    """Every decision about the job, in named steps; every problem found by any step is raised together."""
    site = resolved.config
    problems = _Problems(display_path(resolved.path))
    backend, options = _backend(job, site, plugins, problems)
    res = _resources(job, site, problems)
    tasks = backend.tasks_per_node(res.procs) if kind == "script" else res.procs
    selection, requeue, node_check, layout = _checked(job, resolved, res, tasks, kind, plugins, problems)
    names = _names(job, site, kind, function_name)
    cpus = cpus_per_task(job, res, tasks)
    info = _launch_info(job, site, res, names, requeue, extra_script_args, layout, cpus, tasks)
    env = _environment(job, site, res, selection, backend, options, info, plugins, layout, names, requeue)
    script_job = kind == "script"
    plan = JobPlan(
        job=job,
        site=site,
        site_path=resolved.path,
        backend=backend,
        kind=kind,
        scheduler=site.scheduler,
        partition=res.part_name,
        nodes=job.nodes,
        procs_per_node=res.procs,
        tasks_per_node=tasks,
        gpus_per_node=res.gpus,
        time_seconds=res.time_seconds,
        job_name=names.job_name,
        job_root=names.job_root,
        python=names.python,
        workdir=names.workdir,
        directives=_directives(job, site, res, tasks, cpus, names, requeue, plugins, backend.name),
        env=sorted(env.values(), key=lambda e: e.name),
        nccl_profile=selection.label,
        launch=backend.launch(info) if script_job else [],
        requeue=requeue.enabled,
        watchdog=script_job and _watchdog(job, site, requeue),
        spare_nodes=job.spare_nodes,
        node_check=node_check,
        cpus_per_task=cpus if site.scheduler == "slurm" else None,
        cpu_bind=res.part.cpu_bind,
        gpu_bind=res.part.gpu_bind == "closest" and res.gpus > 0 and tasks == res.procs,
        max_restarts=job.max_restarts if job.max_restarts is not None else requeue.policy.max_restarts,
        signal=requeue.policy.signal,
        signal_grace=requeue.grace,
        on_failure=_on_failure(job, requeue),
        release_held=requeue.policy.release_held,
        srun_args=backend.srun_args(info) if script_job else [],
        backend_setup=backend.setup(info) if script_job else [],
        backend_cleanup=backend.cleanup(info) if script_job else [],
        warnings=nccl.job_warnings(selection, site, res.part_name, resolved.provenance, problems.site_file),
    )
    return dataclasses.replace(plan, extra=plugins.template_context(plan))


def _checked(
    job: JobSpec, resolved: ResolvedSite, res: _Resources, tasks: int, kind: str, plugins: Plugins, problems: _Problems
) -> tuple[Any, _Requeue, bool, Any]:
    """The steps that can find a problem, all of them run; then every problem raised together.

    Returns what the later steps build on: the NCCL profile selection, the requeue decision, whether
    the node check runs, and the parallel layout.
    """
    site = resolved.config
    _check_fit(job, res, tasks, problems)
    _check_sbatch_names(job, problems)
    selection = nccl.select(site.nccl_profiles, job.nccl_profile, res.part.nccl_profile, site.name)  # extends, +debug
    for message, hint in selection.problems:
        problems.add("nccl_profile", message, hint)
    _check_container(job, site, problems)
    _check_user(job, resolved, problems)
    requeue = _requeue(job, site, res, problems)
    _check_spares(job, site, res, requeue, kind, problems)
    _check_requeue_options(job, site, requeue, problems)
    _check_slurm_only(job, site, problems)
    node_check = _node_check(job, site, requeue, kind, problems)
    _check_hang_timeout(job, site, requeue, kind, problems)
    layout = _layout(job, res, plugins, problems)
    _check_resume(job, res, layout, problems)
    _check_local_tier(job, site, problems)
    _check_profile(job, site, res, kind, problems)
    for message in plugins.validate_job(job, site):
        problems.add("", message, source=f"site policy ({site.name})")
    if problems:
        raise ConfigError(list(problems))
    return selection, requeue, node_check, layout


def _backend(job: JobSpec, site: SiteConfig, plugins: Plugins, problems: _Problems) -> tuple[Backend, Any]:
    """The backend with its options (site defaults < job options); None options when they are invalid."""
    backend_cls = plugins.backend(job.backend)
    for name in site.backends:
        if name not in plugins.backends:
            problems.add(
                f"backends.{name}", "no such backend", did_you_mean(name, plugins.backends, "backend"), problems.site_file
            )
    options: Any = None
    try:
        options = validate(backend_cls.Options, {**site.backends.get(job.backend, {}), **job.backend_options})
    except ValidationError as exc:
        problems.extend(problems_from_validation(exc, backend_cls.Options, f"backend {job.backend!r} options", prefix=()))
    if job.comm_hook not in (None, "none") and not backend_cls.supports_comm_hook:
        able = " or ".join(sorted(n for n, c in plugins.backends.items() if c.supports_comm_hook))
        problems.add(
            "comm_hook",
            f"backend {job.backend!r} has no DDP communication hooks",
            f"use it with --backend {able}" if able else None,
        )
    _check_micro_batch(job, backend_cls, plugins, problems)
    _check_divergence(job, problems)
    return backend_cls(options if options is not None else defaults(backend_cls.Options)), options


def _check_micro_batch(job: JobSpec, backend_cls: type[Backend], plugins: Plugins, problems: _Problems) -> None:
    """--micro-batch needs a runtime that can change the accumulation as it runs (the backend says)."""
    if job.micro_batch is None:
        return
    if backend_cls.fixed_micro_batch:
        able = " or ".join(sorted(n for n, c in plugins.backends.items() if not c.fixed_micro_batch))
        problems.add(
            "micro_batch",
            f"backend {job.backend!r} cannot change the micro-batch as it runs: {backend_cls.fixed_micro_batch}",
            f"use --micro-batch with --backend {able}" if able else None,
        )
    if (job.grad_accum or 1) > 1:
        problems.add(
            "micro_batch",
            "--micro-batch sets the accumulation itself: the loader's batch is one optimizer step",
            "drop --grad-accum and give ctx.loader the whole batch per rank",
        )
    if job.parallel:
        problems.add("micro_batch", "--micro-batch does not apply under --parallel (a pipeline has its own micro-batches)")


def _check_divergence(job: JobSpec, problems: _Problems) -> None:
    """--on-divergence acts after --max-bad-steps bad steps in a row; with 0 it never would."""
    if job.max_bad_steps == 0 and job.on_divergence is not None:
        problems.add(
            "on_divergence",
            f"{job.on_divergence!r} never acts with --max-bad-steps 0 (0: bad steps are skipped, the run never "
            "stops or rolls back)",
            f"give --max-bad-steps N (N >= 1: {job.on_divergence} after N bad steps in a row, like 5), "
            "or drop --on-divergence to skip bad steps for ever",
        )


def _resources(job: JobSpec, site: SiteConfig, problems: _Problems) -> _Resources:
    part_name, found = site.partition(job.partition)
    if job.partition and site.partitions and found is None:
        problems.add(
            "partition",
            f"site {site.name!r} has no partition {job.partition!r}",
            did_you_mean(job.partition, site.partitions, "partition"),
        )
    part = found or Partition()
    gpus = job.gpus_per_node if job.gpus_per_node is not None else part.gpus_per_node
    if site.partitions and part_name in site.partitions and gpus > part.gpus_per_node:
        problems.add("gpus_per_node", f"partition {part_name!r} has {part.gpus_per_node} GPUs per node, {gpus} requested")
    if part.max_nodes is not None and job.nodes > part.max_nodes:
        problems.add("nodes", f"partition {part_name!r} allows at most {part.max_nodes} nodes, {job.nodes} requested")
    if site.scheduler == "local" and job.nodes > 1:
        problems.add("nodes", f"site {site.name!r} runs on this machine only: use --nodes 1 and --procs-per-node N")
    time_value = job.time if job.time is not None else part.default_time
    time_seconds = parse_slurm_time(time_value) if time_value is not None else None
    if time_seconds is not None and part.max_time is not None:
        limit = parse_slurm_time(part.max_time)
        if time_seconds > limit:
            problems.add(
                "time", f"{format_slurm_time(time_seconds)} exceeds partition {part_name!r}'s limit {format_slurm_time(limit)}"
            )
    return _Resources(part_name, part, gpus, job.procs_per_node or (gpus if gpus > 0 else 1), time_seconds)


def _check_fit(job: JobSpec, res: _Resources, tasks: int, problems: _Problems) -> None:
    """What the job asks of one node against what the partition's nodes have (where the site says it):
    sbatch would queue such a job forever or refuse it, and a process beyond the GPUs shares one."""
    part, name = res.part, res.part_name
    gpus = min(res.gpus, part.gpus_per_node)
    if job.procs_per_node is not None and gpus > 0 and job.procs_per_node > gpus:  # a process per GPU
        has = (
            f"the job has {gpus} GPUs per node (--gpus-per-node)"
            if job.gpus_per_node is not None and gpus < part.gpus_per_node
            else f"partition {name!r} has {gpus} GPUs per node"
        )
        problems.add(
            "--procs-per-node",
            f"{job.procs_per_node} processes per node, but {has}; a job runs one process per GPU",
            f"use --procs-per-node {gpus}, or leave it out: one per GPU is the default",
        )
    mem_problem = mem_size_problem(job.mem) if job.mem is not None else None  # a JobSpec made without make_job
    if mem_problem:
        problems.add("--mem", mem_problem)
    elif job.mem is not None and part.mem_per_node and mem_megabytes(job.mem) > mem_megabytes(part.mem_per_node):
        problems.add(
            "--mem",
            f"{job.mem} per node, but partition {name!r} has {part.mem_per_node} per node",
            f"use --mem {part.mem_per_node} or less, or leave it out for the partition's",
        )
    if job.cpus_per_task and part.cpus_per_node and job.cpus_per_task * tasks > part.cpus_per_node:
        fits = part.cpus_per_node // tasks
        problems.add(
            "--cpus-per-task",
            f"{job.cpus_per_task} CPUs x {tasks} task(s) per node = "
            f"{job.cpus_per_task * tasks}, but partition {name!r} has {part.cpus_per_node} CPUs per node",
            f"use --cpus-per-task {fits} or fewer" if fits else "fewer processes per node",
        )


def _check_sbatch_names(job: JobSpec, problems: _Problems) -> None:
    """``--sbatch NAME=...`` names an option sbatch has: it would refuse the script only at submission."""
    if not job.sbatch:
        return
    from hpc_train.config.sbatch_options import unknown_option  # a job without --sbatch loads no list

    for key, value in job.sbatch.items():
        hint = unknown_option(key)
        if hint is not None:
            typed = key if value is True else f"{key}={value}"
            problems.add(f"--sbatch {typed}", f"sbatch has no option --{key}", hint)


def _check_user(job: JobSpec, resolved: ResolvedSite, problems: _Problems) -> None:
    """A path with $USER needs a user name now: left as text it would name another folder in the job."""
    site = resolved.config
    paths = {f"storage.{key}": value for key, value in site.storage.items()}
    if not job.job_root:
        paths["job_root"] = site.job_root
    used = {key: value for key, value in paths.items() if USER_VAR.search(value)}
    if job.job_root and USER_VAR.search(job.job_root):
        used["--job-root"] = job.job_root
    if not used or _login_user() is not None:
        return
    for key, value in used.items():
        source, line = (JOB, None) if key == "--job-root" else resolved.provenance.get(key, (problems.site_file, None))
        problems.append(
            Problem(
                source,
                key,
                f"{value!r} uses $USER, but USER is not set and no user name is known for this account",
                line,
                "export USER=$(id -un), or write the path without $USER",
            )
        )


def _check_container(job: JobSpec, site: SiteConfig, problems: _Problems) -> None:
    if (job.container or job.container_image) and site.container.runtime == "none":
        problems.add("container", f"site {site.name!r} has no container runtime (container.runtime in the site file)")
    elif job.container and not (job.container_image or site.container.image):
        problems.add("container", f"site {site.name!r} names no container image; give one with --container-image")


def _requeue(job: JobSpec, site: SiteConfig, res: _Resources, problems: _Problems) -> _Requeue:
    policy = site.requeue
    enabled = site.scheduler == "slurm" and (job.requeue if job.requeue is not None else policy.enabled)
    grace = job.signal_grace or policy.grace_seconds
    if job.requeue and site.scheduler != "slurm":
        problems.add("requeue", f"site {site.name!r} runs on this machine; only Slurm sites requeue")
    if enabled and res.time_seconds is not None and grace >= res.time_seconds:
        problems.add(
            "signal_grace",
            f"the warning ({grace} s before the limit) must come after the job starts "
            f"(time limit {format_slurm_time(res.time_seconds)})",
        )
    return _Requeue(enabled, grace, policy)


def _check_spares(job: JobSpec, site: SiteConfig, res: _Resources, requeue: _Requeue, kind: str, problems: _Problems) -> None:
    if not job.spare_nodes:
        return
    if not requeue.enabled or kind != "script":
        problems.add(
            "spare_nodes",
            "spare nodes restart a failed run inside the allocation: that needs a script job on a Slurm site with requeue on",
            "drop --spare-nodes, or add --requeue",
        )
    if job.on_failure == "fail":
        problems.add(
            "spare_nodes",
            "needs --on-failure requeue (given: --on-failure fail): a run that crashes on a node would end the job "
            "FAILED with the spares unused",
            "leave --on-failure out, and a crashed run restarts on a spare; or drop --spare-nodes",
        )
    total = job.nodes + job.spare_nodes
    if res.part.max_nodes is not None and total > res.part.max_nodes:
        problems.add(
            "spare_nodes",
            f"{job.nodes} nodes + {job.spare_nodes} spare = {total}: partition "
            f"{res.part_name!r} allows at most {res.part.max_nodes}",
            f"use --spare-nodes {max(res.part.max_nodes - job.nodes, 0)} or fewer",
        )


def _on_failure(job: JobSpec, requeue: _Requeue) -> str:
    """What a crashed run does. Spares are there for a run that fails on a node: without a retry the batch
    script ends the job FAILED at the first crash, the spares unused (issue 31), so --spare-nodes implies
    requeue unless --on-failure says otherwise (refused then: _check_spares)."""
    if job.on_failure is not None:
        return job.on_failure
    return "requeue" if job.spare_nodes else requeue.policy.on_failure


def _no_requeue_here(job: JobSpec, site: SiteConfig) -> tuple[str, str]:
    """Why this job does not requeue, and what would change that."""
    if site.scheduler != "slurm":
        return f"site {site.name!r} runs the job on this machine; only Slurm sites requeue", "submit to a Slurm site"
    if job.requeue is False:
        return "requeue is off (--no-requeue)", "drop --no-requeue"
    return f"site {site.name!r} has requeue off (requeue.enabled)", "add --requeue"


def _check_requeue_options(job: JobSpec, site: SiteConfig, requeue: _Requeue, problems: _Problems) -> None:
    """The options the requeue acts on, refused where it is off: the batch script has no retry (nor the
    warning signal) then, and they would do nothing."""
    if requeue.enabled:
        return
    given = {
        "on_failure": job.on_failure == "requeue",
        "max_restarts": bool(job.max_restarts),  # 0 restarts is what no requeue does
        "signal_grace": job.signal_grace is not None,
    }
    why, hint = _no_requeue_here(job, site)
    for key in (k for k, on in given.items() if on):
        problems.add(key, f"acts through the requeue: {why}", f"{hint}, or leave {flag_of(JobSpec, key)} out")


# sbatch options with no counterpart on a site that runs the job on this machine
SLURM_ONLY = ("account", "qos", "reservation", "constraint", "mem", "sbatch", "after")


def _check_slurm_only(job: JobSpec, site: SiteConfig, problems: _Problems) -> None:
    """Slurm's own options, refused on the local site rather than dropped: nothing there takes them."""
    if job.after_type != "afterok" and not job.after:  # afterok is the default: not told apart from not given
        problems.add("after_type", f"{job.after_type} says how the --after jobs must end, and none is given", "add --after JOB")
    if site.scheduler == "slurm":
        return
    for key in (k for k in SLURM_ONLY if getattr(job, k)):
        problems.add(
            key,
            f"an sbatch option, and site {site.name!r} runs the job on this machine, without sbatch",
            f"submit to a Slurm site, or leave {flag_of(JobSpec, key)} out",
        )


# torch.distributed's flight recorder, read by the hang report (hpc_train.runtime.lifecycle.heartbeat.flight_record): the last
# 2,000 collectives per process group, under both names torch has used (TORCH_FR_ since 2.6)
FLIGHT_RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}


def _hang_timeout(job: JobSpec, site: SiteConfig) -> float | None:
    return job.hang_timeout if job.hang_timeout is not None else site.health.hang_timeout


def _watchdog(job: JobSpec, site: SiteConfig, requeue: _Requeue) -> bool:
    """Hangs are watched where a run can be restarted (Slurm, requeue on) unless turned off (0, off).

    Not in a container: the watchdog runs on the batch node, outside the image that has the job's python.
    """
    in_container = job.container if job.container is not None else (site.container.enabled or bool(job.container_image))
    return requeue.enabled and _hang_timeout(job, site) != 0 and not (in_container and site.container.runtime != "none")


def _check_hang_timeout(job: JobSpec, site: SiteConfig, requeue: _Requeue, kind: str, problems: _Problems) -> None:
    """A --hang-timeout given where no watchdog would run is refused, not ignored: a hung rank would sit
    until the time limit (seen on --site local: 150 s, until killed from outside)."""
    if not job.hang_timeout or (kind == "script" and _watchdog(job, site, requeue)):
        return
    if site.scheduler != "slurm":
        why = f"site {site.name!r} runs the job on this machine, where nothing restarts a hung run"
        hint = "submit to a Slurm site (--site sandbox after `make cluster-up`, or your cluster's), or leave --hang-timeout out"
    elif kind != "script":
        why, hint = "a function job has no ranks of its own to watch", "submit a script, or leave --hang-timeout out"
    elif not requeue.enabled:
        why, hint = "with requeue off, a hung run could not be restarted", "drop --no-requeue"
    else:
        why, hint = (
            "it runs on the batch node, outside the job's container",
            "run without the container, or leave --hang-timeout out",
        )
    problems.add("hang_timeout", f"the hang watchdog does not run here: {why}", hint)


def _node_check(job: JobSpec, site: SiteConfig, requeue: _Requeue, kind: str, problems: _Problems) -> bool:
    """Each node checks itself before a run trains on it, where a failing node can be replaced (Slurm, requeue
    on) and the check can run with the job's python on the host (not in a container, as the watchdog)."""
    wanted = job.node_check if job.node_check is not None else site.health.node_check
    in_container = job.container if job.container is not None else (site.container.enabled or bool(job.container_image))
    possible = requeue.enabled and kind == "script" and not (in_container and site.container.runtime != "none")
    if job.node_check and not possible:
        problems.add(
            "node_check",
            "the node check replaces a failing node by a spare or a requeue: that needs a "
            "script job on a Slurm site with requeue on, outside a container",
            "drop --node-check, or add --requeue",
        )
    return bool(wanted and possible)


def _health_env(job: JobSpec, site: SiteConfig, requeue: _Requeue) -> dict[str, str]:
    """The watchdog's timeout (none: learned from the run), the straggler rule, node exclusion."""
    env = {contract.ENV_STRAGGLER_THRESHOLD: f"{_straggler_threshold(job, site):g}"}
    watchdog = _watchdog(job, site, requeue)
    if watchdog:
        timeout = _hang_timeout(job, site)
        if timeout is not None:
            env[contract.ENV_HANG_TIMEOUT] = f"{timeout:g}"
    node_check = requeue.enabled and (job.node_check if job.node_check is not None else site.health.node_check)
    if watchdog or node_check:  # both name suspects; without this the requeue could land on the same node
        env[contract.ENV_EXCLUDE_SUSPECTS] = "1" if site.health.exclude_suspect_nodes else "0"
    return env


def _local_tier_env(job: JobSpec, site: SiteConfig) -> dict[str, str]:
    """The site's node-local folder, unexpanded: each node expands its own ($SLURM_TMPDIR differs per node)."""
    if site.checkpoint_local_dir is None or job.local_checkpoints is False:
        return {}
    return {contract.ENV_LOCAL_CHECKPOINT_DIR: site.checkpoint_local_dir}


def _check_local_tier(job: JobSpec, site: SiteConfig, problems: _Problems) -> None:
    if job.local_checkpoints and site.checkpoint_local_dir is None:
        problems.add(
            "local_checkpoints",
            f"site {site.name!r} names no node-local storage for checkpoints",
            "drop --local-checkpoints, or set checkpoint_local_dir in the site file",
        )


def _straggler_threshold(job: JobSpec, site: SiteConfig) -> float:
    return job.straggler_threshold if job.straggler_threshold is not None else site.health.straggler_threshold


def _layout(job: JobSpec, res: _Resources, plugins: Plugins, problems: _Problems) -> Any:
    """The tensor / pipeline parallel layout, checked against what each backend declares it builds."""
    if job.parallel is None:
        return None
    layout, found = check_layout(
        job.parallel,
        nodes=job.nodes,
        procs_per_node=res.procs,
        gpus_per_node=res.gpus,
        backend=job.backend,
        axes_by_backend={n: c.parallel_axes for n, c in plugins.backends.items()},
    )
    for message, hint in found:
        problems.add("parallel", message, hint)
    return layout


def _check_resume(job: JobSpec, res: _Resources, layout: Any, problems: _Problems) -> None:
    """--resume-from: the newest checkpoint's recorded shape against this job's, so a refusal comes before the queue."""
    if job.resume_from is None or (job.parallel is not None and layout is None):  # a bad layout is reported already
        return
    found = contract.committed(Path(job.resume_from))
    saved = resume_shape.read_shape(found[0][1]) if found else None
    if saved is None:  # no shape recorded (an older checkpoint): the job checks what it can
        return
    world = job.nodes * res.procs
    problem = resume_shape.refusal(
        saved,
        world=world,
        dp=layout.dp if layout is not None else world,
        pp=layout.pp if layout is not None else 1,
        layout=layout is not None,
        backend=job.backend,
    )
    if problem:
        problems.add(
            "resume_from",
            f"{found[0][1]} (saved by {resume_shape.describe(saved)}) cannot continue in this job "
            f"({world} processes: {job.nodes} node(s) x {res.procs}): {problem}",
        )


def _check_profile(job: JobSpec, site: SiteConfig, res: _Resources, kind: str, problems: _Problems) -> None:
    """--profile's ranks against the job's world, and nsys against what the site says it has."""
    if job.profile is None:
        return
    found = profile_spec.problems(
        profile_spec.parse(job.profile),
        world_size=job.nodes * res.procs,
        where=f"{job.nodes} node(s) x {res.procs} per node",
        nsys=site.tools.nsys,
        site=site.name,
        script_job=kind == "script",
    )
    for message, hint in found:
        problems.add("--profile", message, hint)


def _profile_env(job: JobSpec, site: SiteConfig, names: _Names) -> dict[str, str]:
    """Under --profile nsys the job's sitecustomize puts the chosen ranks' python under nsys
    (hpc_train.runtime.nsys_exec): it needs which nsys, and which script's python is a rank's."""
    if job.profile is None or profile_spec.parse(job.profile).kind != "nsys" or not site.tools.nsys:
        return {}
    return {contract.ENV_NSYS: site.tools.nsys, contract.ENV_PROFILE_SCRIPT: names.script}


def _names(job: JobSpec, site: SiteConfig, kind: str, function_name: str | None) -> _Names:
    workdir = os.path.abspath(job.workdir or os.getcwd())
    script = ""
    if kind == "script":
        if not job.script:
            raise ConfigError(Problem(JOB, "script", "a script job needs a training script"))
        script = _expand(job.script, workdir)
    name = job.job_name or (f"hpc_train-{Path(script).stem}" if script else f"hpc_train-{function_name or 'function'}")
    return _Names(
        workdir, job.python or site.python or sys.executable, _expand(job.job_root or site.job_root, workdir), script, name
    )


def cpus_per_task(job: JobSpec, res: _Resources, tasks: int) -> int | None:
    """The CPUs each Slurm task asks for: --cpus-per-task, else the task's share of the CPUs that come with
    the job's part of a node (all of it; on a GPU partition, the share of its GPUs the job uses).

    Slurm's default is one CPU per task: where tasks are bound (task/affinity, task/cgroup), a torchrun
    task that forks 8 workers would run them, and their data loaders, on one core."""
    part = res.part
    if job.cpus_per_task is not None or not part.cpus_per_node:
        return job.cpus_per_task
    node = part.cpus_per_node * res.gpus // part.gpus_per_node if part.gpus_per_node and res.gpus else part.cpus_per_node
    return max(1, node // tasks)


def _launch_info(
    job: JobSpec,
    site: SiteConfig,
    res: _Resources,
    names: _Names,
    requeue: _Requeue,
    extra_script_args: tuple[Word, ...],
    layout: Any = None,
    cpus: int | None = None,
    tasks: int = 1,
) -> LaunchInfo:
    return LaunchInfo(
        scheduler=site.scheduler,
        nodes=job.nodes,
        procs_per_node=res.procs,
        gpus_per_node=res.gpus,
        python=names.python,
        script=names.script,
        script_args=(*job.script_args, *extra_script_args),  # extra: a sweep task's overrides (Raw)
        master_port_base=site.master_port,
        job_root=names.job_root,
        cpus_per_proc=max(1, cpus * tasks // res.procs) if cpus else None,
        gpu_bind=res.part.gpu_bind if res.gpus > 0 else None,
        precision=job.precision,
        grad_accum=job.grad_accum,
        grad_clip=job.grad_clip,
        stop_signal=requeue.policy.signal if requeue.enabled else None,
        # what the job's processes will see that a backend may decide with: the folder the script runs in
        # (relative paths among its arguments) and the layout (data-parallel size = world / (tp x pp))
        env={"PWD": names.workdir, **({LAYOUT_ENV: str(layout)} if layout is not None else {})},
    )


def _environment(
    job: JobSpec,
    site: SiteConfig,
    res: _Resources,
    selection: Any,
    backend: Backend,
    options: Any,
    info: LaunchInfo,
    plugins: Plugins,
    layout: Any,
    names: _Names,
    requeue: _Requeue,
) -> dict[str, EnvVar]:
    """Every exported variable, lowest precedence first: site < partition < nccl profile < backend < plugins < job."""
    env: dict[str, EnvVar] = {}

    def put(values: dict[str, Any], source: str) -> None:
        env.update({key: EnvVar(key, value, source) for key, value in values.items()})

    if _watchdog(job, site, requeue):  # lowest: a site's or user's own recorder settings win
        put(FLIGHT_RECORDER_ENV, "hpc_train (hang reports)")
    put(site.env, "site")
    put(res.part.env, f"partition {res.part_name}")
    for var_name, var_value, var_source in selection.variables:
        put({var_name: var_value}, var_source)
    put({contract.storage_dir_env(key): _expand(value, names.workdir) for key, value in site.storage.items()}, "site storage")
    put(backend.env(info), f"backend {backend.name}")
    put(plugins.job_env(job, site, backend.name), "plugins")
    if options is not None and field_names(type(backend).Options):
        put({contract.ENV_BACKEND_OPTIONS: json.dumps(dump(options), separators=(",", ":"))}, f"backend {backend.name}")
    put(to_env(job), "job")  # the job options the runtime reads in the job: each field's setting(env=...)
    if layout is not None:
        put({LAYOUT_ENV: str(layout)}, "job")  # the runtime builds its device mesh from this
    put(dict(job.env), "job")
    put(
        {
            contract.ENV_SITE: site.name,
            contract.ENV_BACKEND: backend.name,
            contract.ENV_NODES: str(job.nodes),
            contract.ENV_PROCS_PER_NODE: str(res.procs),
            contract.ENV_JOB_ROOT: names.job_root,
            **({contract.ENV_STOP_SIGNAL: requeue.policy.signal} if requeue.enabled else {}),  # the ranks save and stop on it
            **_health_env(job, site, requeue),
            **_local_tier_env(job, site),
            **_profile_env(job, site, names),
        },
        "hpc_train",
    )
    return env


def _directives(
    job: JobSpec,
    site: SiteConfig,
    res: _Resources,
    tasks: int,
    cpus: int | None,
    names: _Names,
    requeue: _Requeue,
    plugins: Plugins,
    backend_name: str,
) -> list[tuple[str, Any]]:
    """The #SBATCH options, sorted: ours, then the site's, the partition's, the plugins' and the job's own."""
    if site.scheduler != "slurm":
        return []
    directives: dict[str, Any] = {
        "job-name": names.job_name,
        "nodes": job.nodes + job.spare_nodes,  # the spares wait in the allocation
        "ntasks-per-node": tasks,
        "output": os.path.join(names.job_root, "%j", "%j_0_log.out"),
        "error": os.path.join(names.job_root, "%j", "%j_0_log.err"),
        "open-mode": "append",
        "partition": res.part_name or None,
        "time": format_slurm_time(res.time_seconds) if res.time_seconds is not None else None,
    }
    if res.gpus > 0:
        directives["gres"] = f"gpu:{res.part.gpu_type}:{res.gpus}" if res.part.gpu_type else f"gpu:{res.gpus}"
    if requeue.enabled:
        # B: -> only the batch shell gets the warning; it tells the ranks through a file
        directives.update({"requeue": True, "signal": f"B:{requeue.policy.signal}@{requeue.grace}"})
    defaults_from_partition = {"constraint": res.part.constraint, "mem": res.part.mem_per_node, "cpus_per_task": cpus}
    for key in ("cpus_per_task", "mem", "account", "qos", "reservation", "constraint"):
        value = getattr(job, key)
        directives[key.replace("_", "-")] = value if value is not None else defaults_from_partition.get(key)
    directives.update(site.sbatch)
    directives.update(res.part.sbatch)
    directives.update(plugins.sbatch_directives(job, site, backend_name))
    directives.update(job.sbatch)
    if job.after:  # a dependency that can never be met cancels the job instead of leaving it pending
        directives.setdefault("dependency", f"{job.after_type}:" + ":".join(job.after))
        directives.setdefault("kill-on-invalid-dep", "yes")
    return sorted((k, v) for k, v in directives.items() if v is not None and v is not False)
