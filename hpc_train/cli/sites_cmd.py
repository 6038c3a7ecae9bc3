"""``sites``: every site on the search path, where it comes from, what it is."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return sub.add_parser("sites", help="list the sites on the search path")


def run(args: argparse.Namespace) -> int:
    from hpc_train.api import site_registry
    from hpc_train.config.loader import display_path
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
            about, kind = f"INVALID: {exc.message.splitlines()[0]}", "?"
        rows.append((name, kind, source.origin, about, display_path(source.path)))
    width = max((len(r[0]) for r in rows), default=4)
    for name, kind, origin, about, path in rows:
        print(f"{name:<{width}}  {kind:<5}  {about}")
        print(f"{'':<{width}}  {'':<5}  {path} ({origin})")
    for shadowed, winner in registry.shadowed:
        print(f"note: {display_path(shadowed.path)} is hidden by {display_path(winner.path)}")
    for failure in plugins.failures:
        lost = f"; its sites are unavailable: {', '.join(failure.sites)}" if failure.sites else ""
        print(f"note: {failure.origin} failed to load ({failure.error}){lost}")
    return 0
