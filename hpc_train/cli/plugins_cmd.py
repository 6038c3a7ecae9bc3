"""``plugins``: every plugin, its distribution and version, the hooks it implements, and failures."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return sub.add_parser("plugins", help="list plugins, their hooks, and any that failed to load")


def run(args: argparse.Namespace) -> int:
    from hpc_train.plugins import default_plugins, disabled_plugins

    plugins = default_plugins()
    for info in plugins.info():
        origin = f"{info.distribution} {info.version}" if info.distribution else "registered in-process"
        print(f"{info.name} ({origin}): {info.module}")
        print(f"    hooks: {', '.join(info.hooks) or '-'}")
    for name in sorted(disabled_plugins()):
        print(f"{name}: disabled by HPC_TRAIN_DISABLE_PLUGINS")
    for failure in plugins.failures:
        print(f"{failure.name} ({failure.distribution or 'unknown distribution'}): FAILED to load: {failure.error}")
    return 1 if plugins.failures else 0
