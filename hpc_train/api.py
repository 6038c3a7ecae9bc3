"""The Python API: the same options as the CLI, for scripts and notebooks on a login node.

import hpc_train
print(hpc_train.render("train.py", "--lr", "1e-4", site="bluecloud", nodes=4))
job = hpc_train.submit("train.py", site="sandbox", nodes=2)
job.wait(); print(job.stdout(rank=0))
print(job.state, job.why)  # why: how often it was retried and from which step, or why it was not
job = hpc_train.submit(my_function, 3, site="sandbox", nodes=2)
print(job.result())
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

from hpc_train.config.job import JobSpec
from hpc_train.errors import UsageError
from hpc_train.plugin.manager import Plugins, default_plugins
from hpc_train.submission.prepare import (
    check_script,
    make_job,
    plan_job,
    render_plan,
    resolve_site,
    site_registry,
    warn_about,
)

__all__ = [
    "check_script",
    "job",
    "make_job",
    "plan_job",
    "render",
    "render_plan",
    "resolve_site",
    "site_registry",
    "submit",
    "sweep",
    "warn_about",
]

if TYPE_CHECKING:  # submitting and watching jobs: imported when used, `render` needs neither
    from hpc_train.jobs.handle import JobHandle
    from hpc_train.remote.client import RemoteJob


def render(script: str | os.PathLike[str], *script_args: str, plugins: Plugins | None = None, **options: Any) -> str:
    """The exact sbatch script ``submit`` would send; submits nothing."""
    job = make_job(script=os.fspath(script), script_args=list(script_args), **options)
    plugins = plugins or default_plugins()
    return render_plan(plan_job(job, plugins), plugins)


@overload
def submit(
    target: str | os.PathLike[str] | Callable[..., Any],
    *args: Any,
    plugins: Plugins | None = None,
    remote: None = None,
    **options: Any,
) -> JobHandle: ...


@overload
def submit(
    target: str | os.PathLike[str] | Callable[..., Any], *args: Any, plugins: Plugins | None = None, remote: str, **options: Any
) -> RemoteJob: ...


def submit(
    target: str | os.PathLike[str] | Callable[..., Any],
    *args: Any,
    plugins: Plugins | None = None,
    remote: str | None = None,
    **options: Any,
) -> JobHandle | RemoteJob:
    """Submit a training script (``target`` a path; ``args`` its arguments) or a function (``args`` its arguments).
    Returns a JobHandle; with ``remote`` (a login node ssh reaches), the script's project goes there and the job is
    submitted by that node's hpc_train (a RemoteJob: state, wait, stdout, cancel over ssh)."""
    if remote is not None:
        if callable(target):
            raise UsageError("a function cannot be submitted through a login node: submit a script (remote=...)")
        from hpc_train.remote.client import submit_api

        return submit_api(remote, os.fspath(target), [str(a) for a in args], options)
    from hpc_train.submission.executor import submit_plan, submit_with_code

    plugins = plugins or default_plugins()
    if options.get("after") is not None:  # handles and sweep ids become job ids
        from hpc_train.sweeps.handle import expand_after

        options["after"] = expand_after(options["after"])
    if callable(target):
        job = make_job(**options)
        plan = plan_job(job, plugins, kind="function", function_name=getattr(target, "__name__", None), submitting=True)
        handle = submit_plan(plan, lambda p: render_plan(p, plugins), fn=target, args=args)
    else:
        job = make_job(script=os.fspath(target), script_args=[str(a) for a in args], **options)
        plan = plan_job(job, plugins, submitting=True)  # refuses to train on a login node by fallback
        warn_about(plan)
        handle = submit_with_code(plan, lambda p: render_plan(p, plugins))
    plugins.after_submit(handle, plan)
    return handle


def sweep(target: str | os.PathLike[str] | JobSpec, *args: Any, over: Any, **options: Any) -> Any:
    """Submit a script once per task of ``over`` (a grid ``{"lr": [...], "seed": [...]}`` or a list of
    overrides) as Slurm job arrays; returns a SweepHandle. See hpc_train.sweeps.submit and docs/sweeps.md."""
    from hpc_train.sweeps.submit import sweep as submit_sweep

    return submit_sweep(target, *args, over=over, **options)


def job(job_id: str) -> JobHandle:
    """The handle of a job submitted earlier through hpc_train (from any process on this machine)."""
    from hpc_train.jobs.handle import JobHandle

    return JobHandle.from_id(str(job_id))
