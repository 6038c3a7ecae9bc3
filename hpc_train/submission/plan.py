"""JobSpec + site + backend → JobPlan: every decision about the job, made once, without I/O.

The steps that decide (resources, requeue, layout, names) are here; the rules a job is checked against
are plan_checks.CHECKS, what it exports and asks Slurm for is plan_env, and what they share is plan_facts.

The renderer only formats a plan; the executor only submits one. Everything a user could get
wrong is checked here and reported together.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_train.config.errors import problems_from_validation
from hpc_train.config.job import JobSpec
from hpc_train.config.loader import display_path
from hpc_train.config.models import Partition, SiteConfig
from hpc_train.config.resolved import ResolvedSite
from hpc_train.config.slurm_time import format_slurm_time, parse_slurm_time
from hpc_train.config.validate import ValidationError, defaults, validate
from hpc_train.errors import ConfigError, Problem, did_you_mean
from hpc_train.fabric import nccl
from hpc_train.plugin.backend import Backend, Word
from hpc_train.submission.job_plan import JobPlan
from hpc_train.submission.layout import problems as check_layout
from hpc_train.submission.plan_checks import CHECKS
from hpc_train.submission.plan_env import cpus_per_task, directives, environment, launch_info
from hpc_train.submission.plan_facts import JOB, Facts, Names, Problems, Requeue, Resources, expand, watchdog

if TYPE_CHECKING:
    from hpc_train.plugin.manager import Plugins
    from hpc_train.snapshot.code import Code


@dataclass(frozen=True)
class Additions:
    """What a submission adds to the job's own options."""

    script_args: tuple[Word, ...] = ()  # after the job's: a sweep task's overrides (Raw)
    code: Code | None = None  # the snapshot the script runs from (hpc_train.snapshot.code)


def build_plan(
    job: JobSpec,
    resolved: ResolvedSite,
    plugins: Plugins,
    *,
    kind: Literal["script", "function"] = "script",
    function_name: str | None = None,
    adds: Additions = Additions(),
) -> JobPlan:
    """Every decision about the job, in named steps; every problem found by any step is raised together.
    ``adds``: what the submission adds to the job's options (a sweep's arguments, the code snapshot)."""
    f, options = _facts(job, resolved, plugins, kind)
    site, backend, res, tasks, requeue = f.site, f.backend, f.res, f.tasks, f.requeue
    selection, node_check = _checked(f)
    code = adds.code if kind == "script" else None
    names = _names(job, site, kind, function_name, code)
    cpus = cpus_per_task(f)
    info = launch_info(f, names, adds.script_args, cpus)
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
        directives=directives(f, cpus, names),
        env=sorted(environment(f, selection, options, info, names).values(), key=lambda e: e.name),
        nccl_profile=selection.label,
        launch=backend.launch(info) if script_job else [],
        requeue=requeue.enabled,
        watchdog=script_job and watchdog(f),
        spare_nodes=job.spare_nodes,
        node_check=node_check,
        cpus_per_task=cpus if site.scheduler == "slurm" else None,
        cpu_bind=res.part.cpu_bind,
        gpu_bind=res.part.gpu_bind == "closest" and res.gpus > 0 and tasks == res.procs,
        code=code,
        max_restarts=job.max_restarts if job.max_restarts is not None else requeue.policy.max_restarts,
        signal=requeue.policy.signal,
        signal_grace=requeue.grace,
        on_failure=_on_failure(job, requeue),
        release_held=requeue.policy.release_held,
        srun_args=backend.srun_args(info) if script_job else [],
        backend_setup=backend.setup(info) if script_job else [],
        backend_cleanup=backend.cleanup(info) if script_job else [],
        warnings=nccl.job_warnings(selection, site, res.part_name, resolved.provenance, f.problems.site_file),
    )
    return dataclasses.replace(plan, extra=plugins.template_context(plan))


def _facts(job: JobSpec, resolved: ResolvedSite, plugins: Plugins, kind: str) -> tuple[Facts, Any]:
    """The decisions the checks build on (backend, resources, requeue, layout), and the backend's options."""
    site = resolved.config
    problems = Problems(display_path(resolved.path))
    backend, options = _backend(job, site, plugins, problems)
    res = _resources(job, site, problems)
    tasks = backend.tasks_per_node(res.procs) if kind == "script" else res.procs
    requeue = _requeue(job, site, res, problems)
    layout = _layout(job, res, plugins, problems)
    return Facts(job, resolved, plugins, kind, backend, res, tasks, requeue, layout, problems), options


def _checked(f: Facts) -> tuple[Any, bool]:
    """Every check run (plan_checks.CHECKS, the NCCL profile, the node check, the site's policy plugins); then
    every problem raised together. Returns the NCCL profile selection and whether the node check runs."""
    job, site, problems = f.job, f.site, f.problems
    selection = nccl.select(site.nccl_profiles, job.nccl_profile, f.res.part.nccl_profile, site.name)  # extends, +debug
    for message, hint in selection.problems:
        problems.add("nccl_profile", message, hint)
    for check in CHECKS:
        check(f)
    node_check = _node_check(f)
    for message in f.plugins.validate_job(job, site):
        problems.add("", message, source=f"site policy ({site.name})")
    if problems:
        raise ConfigError(list(problems))
    return selection, node_check


def _backend(job: JobSpec, site: SiteConfig, plugins: Plugins, problems: Problems) -> tuple[Backend, Any]:
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
    return backend_cls(options if options is not None else defaults(backend_cls.Options)), options


def _resources(job: JobSpec, site: SiteConfig, problems: Problems) -> Resources:
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
    return Resources(part_name, part, gpus, job.procs_per_node or (gpus if gpus > 0 else 1), time_seconds)


def _requeue(job: JobSpec, site: SiteConfig, res: Resources, problems: Problems) -> Requeue:
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
    return Requeue(enabled, grace, policy)


def _on_failure(job: JobSpec, requeue: Requeue) -> str:
    """What a crashed run does. Spares are there for a run that fails on a node: without a retry the batch
    script ends the job FAILED at the first crash, the spares unused (issue 31), so --spare-nodes implies
    requeue unless --on-failure says otherwise (refused then: _check_spares)."""
    if job.on_failure is not None:
        return job.on_failure
    return "requeue" if job.spare_nodes else requeue.policy.on_failure


def _node_check(f: Facts) -> bool:
    """Each node checks itself before a run trains on it, where a failing node can be replaced (Slurm, requeue
    on) and the check can run with the job's python on the host (not in a container, as the watchdog)."""
    job, site, requeue, kind, problems = f.job, f.site, f.requeue, f.kind, f.problems
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


def _layout(job: JobSpec, res: Resources, plugins: Plugins, problems: Problems) -> Any:
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


def _names(job: JobSpec, site: SiteConfig, kind: str, function_name: str | None, code: Code | None) -> Names:
    workdir = os.path.abspath(job.workdir or os.getcwd())
    script = ""
    if kind == "script":
        if not job.script:
            raise ConfigError(Problem(JOB, "script", "a script job needs a training script"))
        script = expand(job.script, workdir)
    name = job.job_name or (f"hpc_train-{Path(script).stem}" if script else f"hpc_train-{function_name or 'function'}")
    python, job_root = job.python or site.python or sys.executable, expand(job.job_root or site.job_root, workdir)
    if code is None:
        return Names(workdir, python, job_root, script, name)
    # the name is the script's as the user gave it; the path is its copy in the snapshot
    return Names(workdir, python, job_root, code.path_of(script), name, code.tree)
