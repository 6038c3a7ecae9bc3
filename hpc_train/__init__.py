"""hpc_train: take a PyTorch training script to a Slurm cluster and keep it running there.

The top level stays light (no torch, no submitit at import): login nodes are slow and shared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpc_train.errors import ConfigError, HpcTrainError, SchedulerError, UsageError
from hpc_train.lazy import lazy_names
from hpc_train.plugin.backend import (
    Backend,
    CliOption,
    LaunchInfo,
    Raw,
    Word,
    launch_shim,
    survive_stop_signal,
)
from hpc_train.plugin.hookspecs import hookimpl
from hpc_train.version import __version__

if TYPE_CHECKING:
    from hpc_train.api import job, render, submit, sweep
    from hpc_train.config.job import JobSpec
    from hpc_train.config.loader import load_site
    from hpc_train.jobs.handle import JobHandle

_LAZY = {
    "submit": "hpc_train.api",
    "render": "hpc_train.api",
    "job": "hpc_train.api",
    "sweep": "hpc_train.api",
    "SweepHandle": "hpc_train.sweeps.handle",
    "JobSpec": "hpc_train.config.job",
    "load_site": "hpc_train.config.loader",
    "JobHandle": "hpc_train.jobs.handle",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)

__all__ = [
    "Backend",
    "CliOption",
    "ConfigError",
    "HpcTrainError",
    "JobHandle",
    "JobSpec",
    "LaunchInfo",
    "Raw",
    "SchedulerError",
    "SweepHandle",
    "UsageError",
    "Word",
    "__version__",
    "hookimpl",
    "job",
    "launch_shim",
    "load_site",
    "render",
    "submit",
    "survive_stop_signal",
    "sweep",
]
