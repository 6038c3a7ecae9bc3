"""``sites``: every site on the search path, where it comes from, what it is."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return sub.add_parser("sites", help="list the sites on the search path")


def run(args: argparse.Namespace) -> int:
    from hpc_train.api import site_registry
    from hpc_train.config.loader import display_path
    from hpc_train.config.text import printable
    from hpc_train.errors import HpcTrainError
    from hpc_train.plugin.manager import default_plugins

    plugins = default_plugins()
    registry = site_registry(plugins)
    rows = []
    for name, source in sorted(registry.sources.items()):
        try:
            resolved = registry.load(name)
            about = resolved.config.description or ""
            kind: str = resolved.config.scheduler
        except HpcTrainError as exc:
            about, kind = f"INVALID: {_first_problem(exc)}", "?"
        # a file name is whatever someone saved on the shared path: shown escaped, like every value
        rows.append((printable(name), kind, source.origin, printable(about), printable(display_path(source.path))))
    width = max((len(r[0]) for r in rows), default=4)
    for name, kind, origin, about, path in rows:
        print(f"{name:<{width}}  {kind:<5}  {about}")
        print(f"{'':<{width}}  {'':<5}  {path} ({origin})")
    for shadowed, winner in registry.shadowed:
        print(f"note: {printable(display_path(shadowed.path))} is hidden by {printable(display_path(winner.path))}")
    for failure in plugins.failures:
        lost = f"; its sites are unavailable: {', '.join(failure.sites)}" if failure.sites else ""
        print(f"note: {failure.origin} failed to load ({failure.error}){lost}")
    return 0


def _first_problem(exc: Exception) -> str:
    problems = getattr(exc, "problems", None)  # a ConfigError: the first of its problems, and how many more
    if problems and len(problems) > 1:
        return f"{problems[0]} (and {len(problems) - 1} more)"
    return str(getattr(exc, "message", exc)).splitlines()[0]
