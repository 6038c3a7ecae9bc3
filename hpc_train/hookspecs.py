"""The plugin contract. Every hook is called with keyword arguments only.

Built-in backends (``plugins/``) implement these exactly as a third-party plugin does; they are
found through the ``hpc_train`` entry-point group. Implement with::

    from hpc_train import hookimpl

    @hookimpl
    def hpc_train_backends():
        return [MyBackend]
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from hpc_train.backend import Backend
    from hpc_train.config.job import JobSpec
    from hpc_train.config.models import SiteConfig
    from hpc_train.handle import JobHandle
    from hpc_train.plan import JobPlan

PROJECT = "hpc_train"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def hpc_train_backends() -> list[type[Backend]]:
    """Return the backend classes this plugin provides.

    Results from all plugins are concatenated. Two classes with the same ``name`` are an error
    that names both plugins.
    """


@hookspec
def hpc_train_site_dirs() -> list[Path]:
    """Return folders of site YAML files.

    All results are searched after ``$HPC_TRAIN_SITE_PATH`` and the user's folder, before the
    built-ins. Two plugins providing the same site name is an error naming both.
    """


@hookspec
def hpc_train_template_dirs() -> list[Path]:
    """Return folders of Jinja templates, searched before the built-in ``templates/``.

    A template may extend the built-in one it replaces with ``{% extends "default:sbatch/base.sh.j2" %}``.
    """


@hookspec(firstresult=True)
def hpc_train_detect_site(hostname: str, environ: Mapping[str, str]) -> str | None:
    """Return the site name to use when ``--site`` is omitted, or None if not recognised.

    Stops at the first non-None result. The built-in fallback (``local``) is ``trylast``.
    """


@hookspec
def hpc_train_validate_job(job: JobSpec, site: SiteConfig) -> list[str] | None:
    """Return problems with this job under the site's policy (empty or None when it is fine).

    Problems from all plugins are collected and reported together; any problem stops submission.
    """


@hookspec
def hpc_train_sbatch_directives(job: JobSpec, site: SiteConfig, backend: str) -> Mapping[str, Any] | None:
    """Return extra ``#SBATCH`` options as {long-option-name: value}.

    Merged in plugin call order (later registered plugins first, as pluggy calls them); the job's
    own ``sbatch`` options win over every hook. A value of True renders a bare flag; None removes it.
    """


@hookspec
def hpc_train_job_env(job: JobSpec, site: SiteConfig, backend: str) -> Mapping[str, str] | None:
    """Return environment variables for the job.

    Precedence, lowest to highest: site env < partition env < NCCL profile < backend < hooks < job.
    """


@hookspec
def hpc_train_template_context(plan: JobPlan) -> Mapping[str, Any] | None:
    """Return extra variables for (site) templates; merged into the context under ``extra``."""


@hookspec
def hpc_train_after_submit(handle: JobHandle, plan: JobPlan) -> None:
    """Called once after a job was accepted by the scheduler (audit, notifications). Results ignored."""
