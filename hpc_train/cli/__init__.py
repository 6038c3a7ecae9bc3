"""``python -m hpc_train``: one small module per subcommand; errors become messages here, once."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from hpc_train import contract
from hpc_train.errors import EXIT_USAGE, ConfigWarning, HpcTrainError
from hpc_train.version import __version__

_python_showwarning = warnings.showwarning

# Each module defines ``register(subparsers)`` and ``run(args) -> int``.
COMMANDS = (
    "render",
    "submit",
    "status",
    "logs",
    "cancel",
    "resubmit",
    "sites",
    "site",
    "backends",
    "plugins",
    "validate",
    "report",
    "diagnose",
    "doctor",
    "preflight",
    "gc",
)


# what --remote (or the user's remote.host) runs on a login node over ssh (hpc_train.remote.client.COMMANDS)
REMOTE_COMMANDS = ("submit", "status", "logs", "cancel", "report")


class _Parser(argparse.ArgumentParser):
    """A usage mistake is one line and where to read more: submit's usage block is 33 lines, and
    the line that says what was wrong came last, under it."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        print(f"  see: {self.prog} --help", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI; with ``command`` (a built-in one), only that subcommand: the other thirteen and
    the plugins' commands cost a login node tens of milliseconds to set up, for nothing."""
    parser = _Parser(  # subcommands' parsers (plugins' too) are made of the same class
        prog="python -m hpc_train",
        description="Take a PyTorch training script to a Slurm cluster and keep it running there.",
    )
    parser.add_argument("--version", action="version", version=f"hpc_train {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if command is None else (command,):
        module = importlib.import_module(f"hpc_train.cli.{name}_cmd")
        module.register(sub).set_defaults(_run=module.run)
    if command is None:
        add_plugin_commands(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our own warnings read like our errors; anyone else's keep Python's format."""
    if issubclass(category, ConfigWarning):
        print(f"warning: {message}", file=sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands from ``hpc_train_cli_commands``; a broken plugin is a warning, never a broken CLI."""
    try:
        from hpc_train.plugin.manager import default_plugins

        commands = default_plugins().cli_commands(on_error=_warn)
    except Exception as exc:  # the built-in commands (plugins, sites) must stay usable to diagnose it
        _warn(f"plugin commands are unavailable: {type(exc).__name__}: {exc}")
        return
    owners: dict[str, str] = {}
    for owner, command in commands:
        name = command.name
        if name in sub.choices:
            taken_by = f"plugin {owners[name]!r}" if name in owners else "a built-in command"
            _warn(
                f"plugin {owner!r}: command {name!r} is already provided by {taken_by}; skipped "
                f"({contract.ENV_DISABLE_PLUGINS}={owner} switches the plugin off)"
            )
            continue
        try:
            parser = command.register(sub)
            if sub.choices.get(name) is not parser:
                raise TypeError(f"register() must return the parser it added as {name!r}")
            parser.set_defaults(_run=command.run)
        except Exception as exc:
            sub.choices.pop(name, None)
            sub._choices_actions[:] = [a for a in sub._choices_actions if a.dest != name]  # its --help line
            _warn(f"plugin {owner!r}: could not add command {name!r}: {type(exc).__name__}: {exc}")
            continue
        owners[name] = owner


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def split_script_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Everything after the first ``--`` belongs to the training script, untouched."""
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    own, rest = split_script_args(sys.argv[1:] if argv is None else argv)
    parser = build_parser(own[0] if own and own[0] in COMMANDS else None)
    args, unknown = parser.parse_known_args(own)
    if unknown:  # the subcommand's parser says it, so the hint names that command's --help
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.after_dashdash = rest
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    warnings.showwarning = _show_warning
    try:
        if args.command in REMOTE_COMMANDS:
            from hpc_train.remote.client import host_of, run

            host = host_of(args)
            if host is not None:
                return run(args, own, rest, host)
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
