"""``plugins``: every plugin, where it came from, its hooks and sites, and the ones that failed."""

from __future__ import annotations

import argparse

from hpc_train import contract


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return sub.add_parser(
        "plugins",
        help="list plugins, their hooks and sites, and any that failed to load",
        description="List every plugin: distribution and version, where it came from, the hooks "
        "it implements and the sites it serves. Exits 1 when a plugin failed to load.",
    )


def run(args: argparse.Namespace) -> int:
    from hpc_train.plugin.hookspecs import SITE_SCOPED_HOOKS
    from hpc_train.plugin.manager import default_plugins, disabled_plugins

    plugins = default_plugins()
    for info in plugins.info():
        origin = f"{info.distribution} {info.version}" if info.distribution else "registered in-process"
        print(f"{info.name} ({origin})")
        where = f"entry point {info.entry_point}" if info.entry_point else f"module {info.module}"
        print(f"    from:  {where}" + (f" ({info.path})" if info.path else ""))
        print(f"    hooks: {', '.join(info.hooks) or '-'}")
        if set(info.hooks) & {*SITE_SCOPED_HOOKS, "hpc_train_site_dirs", "hpc_train_site_names"}:
            print(f"    sites: {', '.join(info.sites) if info.sites is not None else 'all (it names none)'}")
    for name in sorted(disabled_plugins()):
        print(f"{name}: disabled by {contract.ENV_DISABLE_PLUGINS}")
    for failure in plugins.failures:
        dist = f"{failure.distribution} {failure.version or ''}".rstrip() if failure.distribution else "unknown distribution"
        print(f"{failure.name} ({dist}): FAILED to load: {failure.error}")
        if failure.entry_point:
            print(f"    from:  entry point {failure.entry_point}")
        if failure.sites:
            print(f"    sites: {', '.join(failure.sites)} (unavailable until it loads)")
    for conflict in plugins.site_conflicts():
        print(f"error: {conflict}")
    return 1 if plugins.failures or plugins.site_conflicts() else 0
