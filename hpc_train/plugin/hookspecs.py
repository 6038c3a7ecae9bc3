# mypy: disable-error-code="empty-body"
# (hook specs are signatures: their bodies are the docs; pluggy calls the implementations)
"""The plugin contract. Every hook is called with keyword arguments only.

Built-in backends (``plugins/``) implement these exactly as a third-party plugin does; they are
found through the ``hpc_train`` entry-point group. Implement with::

    from hpc_train import hookimpl

    @hookimpl
    def hpc_train_backends():
        return [MyBackend]

Site scoping: the per-job hooks (``validate_job``, ``sbatch_directives``, ``job_env``,
``template_context``, ``template_dirs``, ``after_submit``, ``node_suspect``) of a plugin that serves particular sites
are called only for jobs on those sites. A plugin serves the sites it names in
``hpc_train_site_names``; without that hook, the sites whose files it ships through
``hpc_train_site_dirs``; a plugin with neither applies to every site.
``docs/plugins.md`` carries a reference generated from this file.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pluggy

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.config.models import SiteConfig
    from hpc_train.jobs.handle import JobHandle
    from hpc_train.plugin.backend import Backend
    from hpc_train.submission.job_plan import JobPlan

PROJECT = "hpc_train"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: The hooks whose calls are limited to the sites a plugin serves (see ``hpc_train_site_names``).
SITE_SCOPED_HOOKS = (
    "hpc_train_template_dirs",
    "hpc_train_validate_job",
    "hpc_train_sbatch_directives",
    "hpc_train_job_env",
    "hpc_train_template_context",
    "hpc_train_after_submit",
    "hpc_train_node_suspect",
)


@runtime_checkable
class CliCommand(Protocol):
    """A subcommand a plugin adds to ``python -m hpc_train`` (a module or any object with these).

    ``name`` is the subcommand; ``register`` adds its parser with ``subparsers.add_parser(name, ...)``
    and returns it; ``run`` gets the parsed arguments and returns the exit status. Raise
    :class:`hpc_train.HpcTrainError` (or a subclass) for problems the user can act on: the CLI prints
    its message without a traceback.
    """

    name: str

    def register(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace) -> int | None: ...


@hookspec
def hpc_train_backends() -> list[type[Backend]]:
    """Return the backend classes this plugin provides.

    Results from all plugins are concatenated. Two classes with the same ``name`` are an error
    that names both plugins.
    """


@hookspec
def hpc_train_site_dirs() -> list[Path]:
    """Return folders of site YAML files (each ``NAME.yaml`` defines the site ``NAME``).

    All results are searched after ``$HPC_TRAIN_SITE_PATH`` and the user's folder, before the
    built-ins. Two plugins providing the same site name is an error naming both. Unless the plugin
    implements ``hpc_train_site_names``, the sites found here are the sites it serves.
    Ship these files in a folder named ``sites`` inside your package: when your plugin fails to
    import, hpc_train finds them in the distribution's file list and tells users asking for one of
    those sites what broke, instead of saying "unknown site".
    """


@hookspec
def hpc_train_site_names() -> Sequence[str]:
    """Return the names of the sites this plugin serves (``fnmatch`` patterns: ``"acme-*"``, ``"*"``).

    Each plugin's result is read on its own, never merged with other plugins': it limits that
    plugin's per-job hooks (``hpc_train.plugin.hookspecs.SITE_SCOPED_HOOKS``) to jobs whose site name
    matches. Without this hook a plugin serves the sites whose files it returns from
    ``hpc_train_site_dirs``; a plugin with neither hook applies to every site. A site that
    ``extends:`` a served site under another name is another site: name it (or a pattern) here.
    """


@hookspec
def hpc_train_template_dirs() -> list[Path]:
    """Return folders of Jinja templates, searched before the built-in ``templates/``.

    Called only for jobs on the sites the plugin serves, so a folder may hold a
    ``sbatch/base.sh.j2`` that overrides single blocks of the built-in one for those sites only::

        {% extends "default:sbatch/base.sh.j2" %}
        {% block setup %}{{ super() }}source /etc/acme/fabric.sh{% endblock %}

    Results from all serving plugins are concatenated and searched in that order.
    """


@hookspec(firstresult=True)
def hpc_train_detect_site(hostname: str, environ: Mapping[str, str]) -> str | None:
    """Return the site name to use when ``--site`` is omitted, or None if not recognised.

    Stops at the first non-None result. The built-in fallback (``local``) is ``trylast``.
    """


@hookspec
def hpc_train_validate_job(job: JobSpec, site: SiteConfig) -> list[str] | None:
    """Return problems with this job under the site's policy (empty or None when it is fine).

    Problems from all plugins are collected and reported together with the job's other problems;
    any problem stops submission. Write each one as the sentence the user should read, with what
    to do (``"jobs over 2 nodes need a reservation: add --reservation NAME"``). To amend a job
    instead of rejecting it (a default account), return the value from
    ``hpc_train_sbatch_directives``.
    """


@hookspec
def hpc_train_sbatch_directives(job: JobSpec, site: SiteConfig, backend: str) -> Mapping[str, Any] | None:
    """Return extra ``#SBATCH`` options as {long-option-name: value}.

    Merged in plugin call order (later registered plugins first, as pluggy calls them); the
    result wins over the site file and over options such as ``--account`` (check ``job.account``
    before supplying a default), and the job's own ``--sbatch`` options win over every hook.
    A value of True renders a bare flag; None removes it.
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


@hookspec
def hpc_train_cli_commands() -> list[CliCommand]:
    """Return subcommands to add to ``python -m hpc_train`` (see :class:`CliCommand`).

    Results from all plugins are concatenated. A name already taken by a built-in command or an
    earlier plugin is skipped with a warning naming both; a plugin whose commands fail to register
    is reported on stderr and ``--help`` keeps working.
    """


@hookspec
def hpc_train_node_suspect(site: str, node: str, reason: str, job_id: str | None, job_folder: Path) -> None:
    """Called in the job, on the batch node, each time hpc_train names a node as the cause of a failed run
    (a hang, the first ranks to fail, a failed node check at start-up), before the next run avoids it.

    Admins drain or report the node here (draining takes an operator's rights: a site plugin may call its
    own service instead). Results are ignored; an exception is logged and changes nothing for the job.
    """
