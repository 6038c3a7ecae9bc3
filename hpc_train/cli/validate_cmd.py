"""``validate [--site NAME]``: check site files (all of them by default); every problem at once."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("validate", help="check site files and report every problem")
    parser.add_argument("--site", action="append", help="site name or path (repeatable; default: all sites)")
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.api import site_registry
    from hpc_train.errors import ConfigError, HpcTrainError, Problem, did_you_mean
    from hpc_train.plugin.manager import default_plugins

    plugins = default_plugins()
    registry = site_registry(plugins)
    names = args.site or registry.names()
    failed = 0
    for name in names:
        try:
            resolved = registry.load(name)
            problems = [
                Problem(str(resolved.path), f"backends.{backend}", "no such backend", None,
                        did_you_mean(backend, plugins.backends, "backend"))
                for backend in resolved.config.backends if backend not in plugins.backends
            ]
            for backend, options in resolved.config.backends.items():
                if backend in plugins.backends:
                    from hpc_train.config.errors import problems_from_validation
                    from hpc_train.config.validate import ValidationError, validate

                    cls = plugins.backends[backend]
                    try:
                        validate(cls.Options, options)
                    except ValidationError as exc:
                        problems += problems_from_validation(exc, cls.Options, str(resolved.path), prefix=("backends", backend))
            if problems:
                raise ConfigError(problems)
            print(f"ok: {resolved.name} ({resolved.path})")
        except HpcTrainError as exc:
            failed += 1
            print(f"error: {exc.message}", file=sys.stderr)
            if exc.hint:
                print(f"  hint: {exc.hint}", file=sys.stderr)
    return 78 if failed else 0
