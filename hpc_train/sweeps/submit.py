"""``hpc_train.sweep(...)``: a sweep submitted, its record kept, its handle returned.

The arrays themselves are made in hpc_train.sweeps.arrays; the handle (status, wait, resubmit) is
hpc_train.sweeps.handle.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpc_train.config.job import JobSpec
from hpc_train.config.validate import dump
from hpc_train.errors import UsageError
from hpc_train.submission.prepare import make_job, render_plan
from hpc_train.sweeps.arrays import expand, new_folder, submit_arrays, sweep_plan
from hpc_train.sweeps.handle import SweepHandle, SweepRecord, expand_after

if TYPE_CHECKING:
    from hpc_train.plugin.manager import Plugins


def sweep(
    target: str | os.PathLike[str] | JobSpec,
    *args: Any,
    over: Mapping[str, Iterable[Any]] | Sequence[Mapping[str, Any]],
    max_concurrent: int | None = None,
    plugins: Plugins | None = None,
    **options: Any,
) -> SweepHandle:
    """Submit ``target`` (a script path with its arguments and job options, or a JobSpec) once per
    task of ``over``; returns one handle for the whole sweep."""
    from hpc_train.plugin.manager import default_plugins
    from hpc_train.submission.executor import _make_job_root, login_slurm_conf

    if max_concurrent is not None and (not isinstance(max_concurrent, int) or max_concurrent < 1):
        raise UsageError(f"max_concurrent must be a whole number ≥ 1, got {max_concurrent!r}")
    plugins = plugins or default_plugins()
    overrides = expand(over)
    if isinstance(target, JobSpec):
        if args or options:
            raise UsageError("give job options either in the JobSpec or as keywords, not both")
        job = target
    else:
        options["after"] = expand_after(options.get("after"))
        job = make_job(script=os.fspath(target), script_args=[str(a) for a in args], **options)
    plan = sweep_plan(job, plugins)
    _make_job_root(plan)
    folder = new_folder(plan.job_root)
    from hpc_train.snapshot.take import discard, tidy

    try:
        arrays = submit_arrays(plan, lambda p: render_plan(p, plugins), folder, overrides, range(len(overrides)), max_concurrent)
    except BaseException:
        discard(plan.code)  # this sweep's own snapshot (a resubmission's is the sweep's: it never gets here)
        raise
    stored = dataclasses.replace(job, workdir=plan.workdir)  # a resubmission from elsewhere runs in the same place
    record = SweepRecord(
        sweep_id=arrays[0]["job_id"],
        folder=str(folder),
        site=plan.site.name,
        backend=plan.backend_name,
        job_name=plan.job_name,
        nodes=plan.nodes,
        procs_per_node=plan.procs_per_node,
        tasks_per_node=plan.tasks_per_node,
        slurm_conf=login_slurm_conf(plan),
        submitted_at=time.time(),
        requeue=plan.requeue,
        release_held=plan.release_held and plan.requeue,
        max_concurrent=max_concurrent,
        overrides=overrides,
        arrays=arrays,
        job=dump(stored),
        code=plan.code.as_record() if plan.code is not None else None,
    )
    record.save()
    tidy(plan.code, plan.site.snapshot.gc_above)
    return SweepHandle(record)
