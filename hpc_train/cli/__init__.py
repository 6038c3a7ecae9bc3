"""``python -m hpc_train``: one small module per subcommand; errors become messages here, once."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hpc_train import __version__
from hpc_train.errors import HpcTrainError

# Each module defines ``register(subparsers)`` and ``run(args) -> int``.
COMMANDS = (
    "render", "submit", "status", "logs", "cancel",
    "sites", "site", "backends", "plugins", "validate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train",
        description="Take a PyTorch training script to a Slurm cluster and keep it running there.",
    )
    parser.add_argument("--version", action="version", version=f"hpc_train {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"hpc_train.cli.{name}_cmd")
        command = module.register(sub)
        command.set_defaults(_run=module.run)
    return parser


def split_script_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Everything after the first ``--`` belongs to the training script, untouched."""
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    own, rest = split_script_args(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    args.after_dashdash = rest
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except HpcTrainError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
