"""``backends``: the installed backends, their plugins and options."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return sub.add_parser("backends", help="list the distributed backends and their options")


def run(args: argparse.Namespace) -> int:
    from hpc_train.config.fields import descriptions
    from hpc_train.plugin.manager import default_plugins

    plugins = default_plugins()
    for name, cls in sorted(plugins.backends.items()):
        print(f"{name}: {cls.summary}")
        for field_name, (default, description) in descriptions(cls.Options).items():
            about = f"  {description}" if description else ""
            print(f"    -o {field_name}=...  (default {default!r}){about}")
    for failure in plugins.failures:
        print(
            f"warning: plugin {failure.name!r} ({failure.distribution or 'unknown distribution'}) failed to load: {failure.error}"
        )
    return 0
