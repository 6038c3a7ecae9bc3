"""``validate [--site NAME]``: check site files (all of them by default); every problem at once.

``validate`` and ``render`` share one check (:func:`checked_plan`): a site ``validate`` passes renders,
and a site it refuses does not. ``validate`` plans and renders a job with every default on the site
to find what only rendering finds (the template and what it uses).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from hpc_train.errors import EXIT_CONFIG, ConfigError, HpcTrainError, Problem, TemplateError

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.config.loader import ResolvedSite
    from hpc_train.plugin.manager import Plugins
    from hpc_train.submission.plan import JobPlan


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("validate", help="check site files and report every problem")
    parser.add_argument("--site", action="append", help="site name or path (repeatable; default: all sites)")
    return parser


def checked_plan(job: JobSpec, resolved: ResolvedSite, plugins: Plugins) -> JobPlan:
    """The job's plan on this site, after everything about the site the plan does not look at itself
    (every backend's options, the template), each problem with its file:line."""
    from hpc_train.config.site_check import backend_problems
    from hpc_train.submission.plan import build_plan

    problems = backend_problems(resolved, plugins.backends)
    if problems:
        raise ConfigError(sorted(problems, key=Problem.sort_key))
    plan = build_plan(job, resolved, plugins)
    _load_template(plan, resolved, plugins)
    return plan


def render_checked(plan: JobPlan, plugins: Plugins) -> str:
    """The script; a site template that fails while rendering is the site's error, not a traceback."""
    import jinja2

    from hpc_train.submission.prepare import render_plan

    try:
        return render_plan(plan, plugins)
    except HpcTrainError:
        raise
    except jinja2.TemplateError as exc:
        raise TemplateError(Problem(plan.site.template, "", f"template error: {exc.message}")) from None
    except Exception as exc:  # the template is the site's code: `{{ 1 + "a" }}` fails in there
        raise TemplateError(Problem(plan.site.template, "", f"the template failed: {type(exc).__name__}: {exc}")) from None


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
        raise TemplateError(Problem(source, "template", f"template {exc.name!r} not found", line,
                                    f"searched {searched}")) from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(Problem(exc.filename or exc.name or plan.site.template, "",
                                    f"template syntax error: {exc.message}", exc.lineno)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(Problem(source, "template", f"cannot read template {plan.site.template!r}: {exc}", line)) from None


def _probe(resolved: ResolvedSite) -> JobSpec:
    """A job that takes every default of the site: what `render --site S train.py` plans."""
    from hpc_train.config.job import JobSpec
    from hpc_train.config.validate import validate

    return validate(JobSpec, {"site": str(resolved.path), "script": "train.py"})


def _check(name: str, registry: Any, plugins: Plugins) -> ResolvedSite:
    from hpc_train.config.site_check import site_warnings

    resolved: ResolvedSite = registry.load(name)
    render_checked(checked_plan(_probe(resolved), resolved, plugins), plugins)
    for warning in site_warnings(resolved):
        print(f"warning: {warning}", file=sys.stderr)
    return resolved


def run(args: argparse.Namespace) -> int:
    from hpc_train.api import site_registry
    from hpc_train.plugin.manager import default_plugins

    plugins = default_plugins()
    registry = site_registry(plugins)
    codes = []
    for name in args.site or registry.names():
        try:
            resolved = _check(name, registry, plugins)
            print(f"ok: {resolved.name} ({resolved.path})")
        except HpcTrainError as exc:
            codes.append(exc.exit_code)
            print(f"error: {exc.message}", file=sys.stderr)
            if exc.hint:
                print(f"  hint: {exc.hint}", file=sys.stderr)
    # the code `render` gives for the same error; a config error outranks a usage one among many sites
    return (EXIT_CONFIG if EXIT_CONFIG in codes else max(codes)) if codes else 0
