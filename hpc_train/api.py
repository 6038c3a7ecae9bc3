"""The Python API: the same options as the CLI, for scripts and notebooks on a login node.

    import hpc_train
    print(hpc_train.render("train.py", "--lr", "1e-4", site="bluecloud", nodes=4))
    job = hpc_train.submit("train.py", site="sandbox", nodes=2)
    job.wait(); print(job.stdout(rank=0))
    job = hpc_train.submit(my_function, 3, site="sandbox", nodes=2)
    print(job.result())
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_train.config.errors import problems_from_validation
from hpc_train.config.job import JobSpec
from hpc_train.config.loader import ResolvedSite, SiteRegistry, default_search_dirs
from hpc_train.config.validate import ValidationError, validate
from hpc_train.errors import ConfigError, ConfigWarning, Problem
from hpc_train.plan import JobPlan, build_plan
from hpc_train.plugins import Plugins, default_plugins

if TYPE_CHECKING:  # submitting and watching jobs: imported when used, `render` needs neither
    from hpc_train.handle import JobHandle

JOB_SOURCE = "job options"


def make_job(**options: Any) -> JobSpec:
    """Validate job options; errors name the option as the CLI spells it (``--procs-per-node``)."""
    try:
        return validate(JobSpec, options)
    except ValidationError as exc:
        problems = problems_from_validation(exc, JobSpec, JOB_SOURCE)
        renamed = [
            Problem(p.source, "--" + p.key.split(".")[0].replace("_", "-") + (("." + p.key.split(".", 1)[1]) if "." in p.key else ""), p.message, p.line, p.hint)
            for p in problems
        ]
        raise ConfigError(renamed) from None


def site_registry(plugins: Plugins) -> SiteRegistry:
    return SiteRegistry(default_search_dirs(plugins.site_dirs()), check=plugins.check_site)


def resolve_site(name: str | None, plugins: Plugins) -> ResolvedSite:
    if name is None:
        import socket

        name = plugins.detect_site(hostname=socket.gethostname(), environ=dict(os.environ))
    return site_registry(plugins).load(name)  # a site from a plugin that failed to load is an error


def check_script(job: JobSpec) -> None:
    """The training script must exist where the job will look for it (before anything is submitted)."""
    if not job.script:
        raise ConfigError(Problem(JOB_SOURCE, "script", "no training script given"))
    script = Path(job.workdir or ".") / os.path.expanduser(job.script)
    if not script.is_file():
        raise ConfigError(Problem(JOB_SOURCE, "script", f"training script {job.script!r} not found",
                                  hint=f"looked in {script.parent.resolve()}"))


def warn_about(plan: JobPlan) -> None:
    """Say the plan's warnings once, where the caller will see them (submit, sweep)."""
    for problem in plan.warnings:
        warnings.warn(str(problem), ConfigWarning, stacklevel=3)


def plan_job(
    job: JobSpec,
    plugins: Plugins | None = None,
    kind: Literal["script", "function"] = "script",
    function_name: str | None = None,
) -> JobPlan:
    plugins = plugins or default_plugins()
    resolved = resolve_site(job.site, plugins)
    if kind == "script":
        check_script(job)
    return build_plan(job, resolved, plugins, kind=kind, function_name=function_name)


def render_plan(plan: JobPlan, plugins: Plugins | None = None) -> str:
    from hpc_train.renderer import render as render_template

    plugins = plugins or default_plugins()
    return render_template(plan, plugins.template_dirs(plan.site))


def render(script: str | os.PathLike[str], *script_args: str, plugins: Plugins | None = None, **options: Any) -> str:
    """The exact sbatch script ``submit`` would send; submits nothing."""
    job = make_job(script=os.fspath(script), script_args=list(script_args), **options)
    plugins = plugins or default_plugins()
    return render_plan(plan_job(job, plugins), plugins)


def submit(target: str | os.PathLike[str] | Callable[..., Any], *args: Any, plugins: Plugins | None = None, **options: Any) -> JobHandle:
    """Submit a training script (``target`` a path; ``args`` its arguments) or a function (``args`` its arguments)."""
    from hpc_train.executor import submit_plan

    plugins = plugins or default_plugins()
    if options.get("after") is not None:  # handles and sweep ids become job ids
        from hpc_train.sweep_handle import expand_after

        options["after"] = expand_after(options["after"])
    if callable(target):
        job = make_job(**options)
        plan = plan_job(job, plugins, kind="function", function_name=getattr(target, "__name__", None))
        handle = submit_plan(plan, lambda p: render_plan(p, plugins), fn=target, args=args)
    else:
        job = make_job(script=os.fspath(target), script_args=[str(a) for a in args], **options)
        plan = plan_job(job, plugins)
        warn_about(plan)
        handle = submit_plan(plan, lambda p: render_plan(p, plugins))
    plugins.after_submit(handle, plan)
    return handle


def sweep(target: str | os.PathLike[str] | JobSpec, *args: Any, over: Any, **options: Any) -> Any:
    """Submit a script once per task of ``over`` (a grid ``{"lr": [...], "seed": [...]}`` or a list of
    overrides) as Slurm job arrays; returns a SweepHandle. See hpc_train.sweep and docs/sweeps.md."""
    from hpc_train.sweep import sweep as submit_sweep

    return submit_sweep(target, *args, over=over, **options)


def job(job_id: str) -> JobHandle:
    """The handle of a job submitted earlier through hpc_train (from any process on this machine)."""
    from hpc_train.handle import JobHandle

    return JobHandle.from_id(str(job_id))
