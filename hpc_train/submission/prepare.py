"""The steps every submission shares, below the public API: validate the options, find the site,
check the script, plan, say the plan's warnings, render. ``api`` (the facade), sweeps and the fabric
checks use these; nothing here imports them back.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpc_train.config.errors import problems_from_validation
from hpc_train.config.fields import flag_of
from hpc_train.config.job import JobSpec
from hpc_train.config.loader import SiteRegistry, default_search_dirs
from hpc_train.config.resolved import ResolvedSite
from hpc_train.config.validate import ValidationError, validate
from hpc_train.errors import ConfigError, ConfigWarning, HpcTrainError, Problem, TemplateError, UsageError
from hpc_train.plugin.manager import Plugins, default_plugins
from hpc_train.submission.job_plan import JobPlan
from hpc_train.submission.plan import JOB, Additions, build_plan
from hpc_train.submission.plan_facts import expand

if TYPE_CHECKING:
    from hpc_train.snapshot.code import Code

LOCAL = "local"  # the core's answer when no plugin detects a site (hpc_train.plugin.manager._Defaults)
DEFAULTS_PLUGIN = "hpc_train.defaults"  # the name the core registers that fallback under
# where a Slurm client finds its configuration (the usual install prefixes, and configless slurmd's cache)
SLURM_CONF_FILES = (
    "/etc/slurm/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
    "/usr/local/etc/slurm.conf",
    "/run/slurm/conf/slurm.conf",
)


def make_job(**options: Any) -> JobSpec:
    """Validate job options; errors name the option as the CLI spells it (``--procs-per-node``)."""
    try:
        return validate(JobSpec, options)
    except ValidationError as exc:
        problems = problems_from_validation(exc, JobSpec, JOB)
        raise ConfigError([dataclasses.replace(p, key=flag_of(JobSpec, p.key)) for p in problems]) from None


def site_registry(plugins: Plugins) -> SiteRegistry:
    return SiteRegistry(default_search_dirs(plugins.site_dirs()), check=plugins.check_site)


@dataclass(frozen=True)
class SiteChoice:
    """The site a job goes to and why: named (--site), detected by a plugin, or the fallback."""

    name: str
    why: Literal["given", "detected", "fallback"]
    host: str = ""

    def note(self) -> str | None:
        """The line that says so, when the user did not name the site."""
        if self.why == "detected":
            return f"site: {self.name} (no --site given; detected for host {self.host})"
        if self.why == "fallback":
            return f"site: {self.name} (no --site given and no site detected for host {self.host}; say --site NAME)"
        return None


def choose_site(name: str | None, plugins: Plugins) -> SiteChoice:
    if name is not None:
        return SiteChoice(name, "given")
    import socket

    host = socket.gethostname()
    # the plugins without the core's fallback: whether one of them knows this host is the point
    fallback = [p for p in (plugins.pm.get_plugin(DEFAULTS_PLUGIN),) if p is not None]
    detect = plugins.pm.subset_hook_caller("hpc_train_detect_site", remove_plugins=fallback)
    found = detect(hostname=host, environ=dict(os.environ))
    return SiteChoice(found, "detected", host) if found else SiteChoice(LOCAL, "fallback", host)


def resolve_site(name: str | None, plugins: Plugins) -> ResolvedSite:
    return site_registry(plugins).load(choose_site(name, plugins).name)  # a site from a plugin that failed to load is an error


def slurm_here(
    environ: Mapping[str, str] = os.environ,
    exists: Callable[[str], bool] = os.path.isfile,
    ping: Callable[[], bool] | None = None,
) -> str | None:
    """Why this machine looks like a node of a Slurm cluster, or None.

    A Slurm configuration file (SLURM_CONF or the usual places) is a stat away and is what every
    Slurm command reads; a configless cluster has none on its login nodes, so where Slurm's commands
    are installed a controller that answers `scontrol ping` within a few seconds says it instead."""
    configured = environ.get("SLURM_CONF")
    for path in ([configured] if configured else []) + list(SLURM_CONF_FILES):
        if exists(path):
            return f"{path} configures Slurm here"
    if (ping or _controller_answers)():
        return "a Slurm controller answers `scontrol ping`"
    return None


def _controller_answers() -> bool:
    import shutil

    from hpc_train.submission import slurm_cmd

    if shutil.which("scontrol") is None:
        return False
    out = slurm_cmd.run(["scontrol", "ping"], timeout=3)
    return out.returncode == 0 and " is UP" in out.stdout


def site_for(job: JobSpec, plugins: Plugins, *, training: bool = False) -> ResolvedSite:
    """The job's site, saying on stderr which one and why when the job does not name it.

    The fallback ``local`` runs the job on this machine: on a cluster's login node, the login node.
    Submitting a training script there is refused unless ``--site local`` says so (``training``);
    rendering one is only warned about."""
    choice = choose_site(job.site, plugins)
    evidence = slurm_here() if choice.why == "fallback" and choice.name == LOCAL else None
    if evidence and training:
        raise UsageError(
            f"no --site given and no site detected for host {choice.host}: the job would train on "
            f"this machine (site local), but this is a Slurm node ({evidence})",
            hint="say --site NAME for the cluster (`python -m hpc_train sites` lists them), "
            "or --site local to train on this machine anyway",
        )
    note = choice.note()
    if note:
        print(note, file=sys.stderr)
    if evidence:
        warnings.warn(
            f"site local runs the job on this machine, a Slurm node ({evidence}); submit refuses it "
            "without --site local: say --site NAME for the cluster",
            ConfigWarning,
            stacklevel=2,
        )
    return site_registry(plugins).load(choice.name)


def check_script(job: JobSpec) -> None:
    """The training script must exist where the job will look for it (before anything is submitted)."""
    if not job.script:
        raise ConfigError(Problem(JOB, "script", "no training script given"))
    script = Path(job.workdir or ".") / os.path.expanduser(job.script)
    if not script.is_file():
        raise ConfigError(
            Problem(JOB, "script", f"training script {job.script!r} not found", hint=f"looked in {script.parent.resolve()}")
        )


Snapshotter = Callable[[JobPlan], "Code | None"]


def code_for(*, submitting: bool) -> Snapshotter:
    """What takes the snapshot a checked script job runs from (hpc_train.snapshot), under the plan's job root;
    None when the job or its site turns snapshots off. ``submitting`` adds where the code came from (git,
    packages) for the job's record. It raises SnapshotError before anything is queued: over the size
    limit, a file that cannot be read."""

    def take_now(plan: JobPlan) -> Code | None:
        job, policy = plan.job, plan.site.snapshot
        if not (job.snapshot if job.snapshot is not None else policy.enabled) or not job.script:
            return None
        from hpc_train.snapshot.take import take

        return take(expand(job.script, plan.workdir), plan.job_root, policy.max_bytes, with_provenance=submitting)

    return take_now


def warn_about(plan: JobPlan) -> None:
    """Say the plan's warnings once, where the caller will see them (submit, sweep)."""
    for problem in plan.warnings:
        warnings.warn(str(problem), ConfigWarning, stacklevel=3)


def checked_plan(
    job: JobSpec, resolved: ResolvedSite, plugins: Plugins, snapshot: Snapshotter | None = None, **plan_options: Any
) -> JobPlan:
    """The job's plan on this site, after everything about the site the plan does not look at itself
    (every backend's options, the template), each problem with its file:line. The one check that
    ``validate``, ``render``, ``submit`` and the Python API share, so what one refuses none accepts.
    ``snapshot`` (code_for) takes the code's snapshot once all of that passed: a refused job stores nothing."""
    from hpc_train.config.site_check import backend_problems

    problems = backend_problems(resolved, plugins.backends)
    if problems:
        raise ConfigError(sorted(problems, key=Problem.sort_key))
    plan = build_plan(job, resolved, plugins, **plan_options)
    _load_template(plan, resolved, plugins)
    code = snapshot(plan) if snapshot is not None and plan.kind == "script" else None
    if code is None:
        return plan
    adds = dataclasses.replace(plan_options.pop("adds", Additions()), code=code)
    plan = build_plan(job, resolved, plugins, adds=adds, **plan_options)  # planned again: 0.3 ms
    return dataclasses.replace(plan, warnings=[*plan.warnings, *_code_warnings(job, code)])


def _code_warnings(job: JobSpec, code: Code) -> list[Problem]:
    if job.resume_from is None:
        return []
    from hpc_train.snapshot.compare import resume_warning

    message = resume_warning(job.resume_from, code)
    return [Problem(JOB, "resume_from", message)] if message else []


def _load_template(plan: JobPlan, resolved: ResolvedSite, plugins: Plugins) -> None:
    import jinja2

    from hpc_train.config.loader import display_path
    from hpc_train.submission.renderer import environment, template_dirs_for

    dirs = template_dirs_for(plan, plugins.template_dirs(plan.site))
    source, line = resolved.provenance.get("template", (display_path(resolved.path), None))
    try:
        environment(dirs).get_template(plan.site.template)
    except jinja2.TemplateNotFound as exc:
        searched = ", ".join([*dirs, "the built-in templates"])
        raise TemplateError(
            Problem(source, "template", f"template {exc.name!r} not found", line, f"searched {searched}")
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            Problem(exc.filename or exc.name or plan.site.template, "", f"template syntax error: {exc.message}", exc.lineno)
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(Problem(source, "template", f"cannot read template {plan.site.template!r}: {exc}", line)) from None


def plan_job(
    job: JobSpec,
    plugins: Plugins | None = None,
    kind: Literal["script", "function"] = "script",
    function_name: str | None = None,
    submitting: bool = False,
) -> JobPlan:
    """Find the site, check the script, plan: the steps ``render`` takes, in its order."""
    plugins = plugins or default_plugins()
    resolved = site_for(job, plugins, training=submitting and kind == "script")
    if kind == "script":
        check_script(job)
    code = code_for(submitting=submitting)
    return checked_plan(job, resolved, plugins, code, kind=kind, function_name=function_name)


def render_plan(plan: JobPlan, plugins: Plugins | None = None) -> str:
    """The script; a site template that fails while rendering is the site's error, not a traceback."""
    import jinja2

    from hpc_train.submission.renderer import render as render_template

    plugins = plugins or default_plugins()
    try:
        return render_template(plan, plugins.template_dirs(plan.site))
    except HpcTrainError:
        raise
    except jinja2.TemplateError as exc:
        raise TemplateError(Problem(plan.site.template, "", f"template error: {exc.message}")) from None
    except Exception as exc:  # the template is the site's code: `{{ 1 + "a" }}` fails in there
        raise TemplateError(Problem(plan.site.template, "", f"the template failed: {type(exc).__name__}: {exc}")) from None
