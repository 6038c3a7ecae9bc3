"""``validate [--site NAME]``: check site files (all of them by default); every problem at once.

``validate``, ``render``, ``submit`` and the Python API share one check (:func:`checked_plan`): a site
``validate`` passes renders and submits, and a site it refuses does neither. ``validate`` plans and renders a job with every default on the site
to find what only rendering finds (the template and what it uses).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from hpc_train.errors import EXIT_CONFIG, HpcTrainError

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.config.resolved import ResolvedSite
    from hpc_train.plugin.manager import Plugins
    from hpc_train.submission.job_plan import JobPlan


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("validate", help="check site files and report every problem")
    parser.add_argument("--site", action="append", help="site name or path (repeatable; default: all sites)")
    return parser


def checked_plan(job: JobSpec, resolved: ResolvedSite, plugins: Plugins, code: Any = None) -> JobPlan:
    """The shared check (hpc_train.submission.prepare.checked_plan), imported when used: building
    the parser must stay cheap. ``code``: what takes the snapshot the script runs from (render)."""
    from hpc_train.submission.prepare import checked_plan as check

    return check(job, resolved, plugins, code)


def render_checked(plan: JobPlan, plugins: Plugins) -> str:
    from hpc_train.submission.prepare import render_plan

    return render_plan(plan, plugins)


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
