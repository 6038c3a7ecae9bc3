"""Job options shared by ``render`` and ``submit``, made from their declarations.

Each JobSpec field with a ``group`` (hpc_train.config.fields.Flag) is a flag whose type, choices and
action follow its annotation, and :func:`job_options` reads it back under the field's name. What is
not one flag for one field stays here: the script, ``--nccl-debug`` and the KEY=VALUE readers of the
mapping fields. Each backend's own flags (``Backend.cli_options``) get a heading of their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from hpc_train import contract
from hpc_train.config.fields import Flag, Kind, default_of, field_kinds
from hpc_train.config.job import GROUPS, JobSpec
from hpc_train.errors import UsageError

BACKEND_GROUP = "backend options"


@dataclasses.dataclass(frozen=True)
class _BackendFlag:
    flag: str  # "--deepspeed-config"
    backend: str  # the backend it belongs to
    option: str  # the key of backend_options it sets
    dest: str


@dataclasses.dataclass(frozen=True)
class _Declared:
    """What add_job_options made, for job_options to read back (a parser default: ``args._job_options``)."""

    spec: type  # JobSpec, or a model extending it
    fields: tuple[tuple[str, Flag, Kind], ...]
    backend_flags: tuple[_BackendFlag, ...]


def _cli_fields(spec: type) -> tuple[tuple[str, Flag, Kind], ...]:
    kinds = field_kinds(spec)
    return tuple((f.name, f.metadata["cli"], kinds[f.name]) for f in dataclasses.fields(spec) if "cli" in f.metadata)


def _flag_name(name: str, flag: Flag) -> str:
    return flag.flag or "--" + name.replace("_", "-")


def add_job_options(parser: argparse.ArgumentParser, backends: Mapping[str, Any] | None = None, spec: type = JobSpec) -> None:
    """The job's flags: the script, a flag per field of ``spec`` with a ``group``, the backends' own flags
    (``backends``: name -> Backend class; None: the registered backends)."""
    parser.add_argument("script", help="training script (its arguments go after --)")
    parser.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
    fields = _cli_fields(spec)
    titles = [GROUPS[0], BACKEND_GROUP, *GROUPS[1:]]  # a backend's flags next to --backend and --option
    titles += [t for t in dict.fromkeys(flag.group for _, flag, _ in fields) if t not in titles]
    backend_flags: tuple[_BackendFlag, ...] = ()
    for title in titles:  # added heading by heading: the usage line lists flags in the order they were added
        group = parser.add_argument_group(title)
        if title == BACKEND_GROUP:
            backend_flags = _add_backend_flags(group, _registered_backends() if backends is None else backends)
        for name, flag, kind in fields:
            if flag.group != title:
                continue
            _add_field(group, name, flag, kind)
            if name == "nccl_profile":
                group.add_argument(
                    "--nccl-debug",
                    action="store_true",
                    help="add the site's debug overlay (NCCL_DEBUG=INFO, flight recorder, ...)",
                )
    parser.set_defaults(_job_options=_Declared(spec, fields, backend_flags))


def _add_field(group: argparse._ArgumentGroup, name: str, flag: Flag, kind: Kind) -> None:
    names = [_flag_name(name, flag), *([flag.short] if flag.short else [])]
    help_text = flag.help.replace("%", "%%") if flag.help else None  # argparse formats help with %
    if kind.type is bool:
        action: Any = argparse.BooleanOptionalAction if flag.negatable else "store_true"
        group.add_argument(*names, dest=name, action=action, default=None, help=help_text)
    elif kind.type in (list, dict):  # repeatable: list items, or KEY=VALUE pairs
        group.add_argument(*names, dest=name, action="append", default=[], metavar=flag.metavar, help=help_text)
    else:
        convert: Any = kind.type if kind.type in (int, float) and not kind.text else None  # None: the text as given
        group.add_argument(*names, dest=name, type=convert, choices=kind.choices, metavar=flag.metavar, help=help_text)


def _registered_backends() -> Mapping[str, Any]:
    try:
        from hpc_train.plugin.manager import default_plugins

        return default_plugins().backends
    except Exception:  # a broken plugin set fails the command itself with its message; parsing must not
        return {}


def _add_backend_flags(group: argparse._ArgumentGroup, backends: Mapping[str, Any]) -> tuple[_BackendFlag, ...]:
    added = []
    for backend, cls in sorted(backends.items()):
        for option in getattr(cls, "cli_options", ()):
            try:
                dest = f"backend_flag:{backend}:{option.option}"  # not an attribute name: no clash with a field's
                group.add_argument(
                    option.flag,
                    dest=dest,
                    metavar=option.metavar or option.option.upper(),
                    help=f"({backend}) {option.help}".replace("%", "%%"),
                )
                added.append(_BackendFlag(option.flag, backend, option.option, dest))
            except Exception as exc:  # a flag already taken, or not a CliOption: only that flag is lost
                print(f"warning: backend {backend!r}: flag {getattr(option, 'flag', option)!r} not added: {exc}", file=sys.stderr)
    return tuple(added)


def add_sweep_options(parser: argparse.ArgumentParser) -> None:
    """``submit``'s sweep options: one job becomes a job array over these values (hpc_train.sweeps.arrays)."""
    s = parser.add_argument_group("sweeps (Slurm job arrays)")
    s.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help=f"run once per value, as --NAME V and ${contract.ENV_SWEEP_PREFIX}NAME (repeatable: a grid)",
    )
    s.add_argument(
        "--max-concurrent",
        "--array-parallelism",
        type=int,
        metavar="N",
        dest="max_concurrent",
        help="at most N sweep tasks run at once (the array's %%N)",
    )


# the numbers, true/false and null of YAML 1.2's core schema (decimal only): what YAML 1.1 also reads
# (1:30 in base 60, yes/on, 0o17, 1_000) stays the text given
_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_NULL = ("null", "Null", "NULL", "~")


def typed_value(text: str) -> Any:
    """A ``-o`` value: an int, a float, true/false (any case) or null; anything else the text itself."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return None if text in _NULL else text


def _pairs(values: list[str], flag: str, typed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = typed_value(value) if typed and value else value
    return out


def _sbatch(values: list[str], flag: str) -> dict[str, Any]:
    """``--sbatch OPTION=VALUE``, or a bare ``--sbatch OPTION`` for a switch (``exclusive``)."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        out[key.lstrip("-")] = value if sep else True
    return out


def _backend_options(values: list[str], flag: str) -> dict[str, Any]:
    return _pairs(values, flag, typed=True)  # typed: a backend's options are numbers and switches as often as text


# how a mapping field's repeated KEY=VALUE items become its value; a field not named here takes them as text
_MAPPINGS: dict[str, Callable[[list[str], str], dict[str, Any]]] = {"sbatch": _sbatch, "backend_options": _backend_options}


def job_options(args: argparse.Namespace) -> dict[str, Any]:
    """JobSpec keyword arguments from parsed options (None means: not given, use defaults)."""
    declared: _Declared = args._job_options
    options: dict[str, Any] = {"script": args.script, "script_args": [*args.script_args, *args.after_dashdash]}
    for name, flag, kind in declared.fields:
        value = getattr(args, name)
        if kind.type is dict:
            value = _MAPPINGS.get(name, _pairs)(value, _flag_name(name, flag))
        elif kind.type is list:
            value = list(value) or None
        options[name] = value
    if getattr(args, "nccl_debug", False):  # the debug overlay over the profile asked for, else the partition's
        options["nccl_profile"] = (options.get("nccl_profile") or "") + "+debug"
    backend = options.get("backend") or _default(declared.spec, "backend")
    options["backend_options"] = {**options.get("backend_options", {}), **_backend_flag_values(args, declared, backend)}
    return {k: v for k, v in options.items() if v is not None}


def _default(spec: type, name: str) -> Any:
    return next(default_of(f) for f in dataclasses.fields(spec) if f.name == name)


def _backend_flag_values(args: argparse.Namespace, declared: _Declared, backend: str) -> dict[str, Any]:
    """The backend flags given, as backend options; one of another backend's is a mistake, not ignored."""
    values: dict[str, Any] = {}
    for owned in declared.backend_flags:
        value = getattr(args, owned.dest, None)
        if value is None:
            continue
        if owned.backend != backend:
            raise UsageError(
                f"{owned.flag} is an option of backend {owned.backend!r}; this job's backend is {backend!r}",
                hint=f"use --backend {owned.backend}, or drop {owned.flag}",
            )
        values[owned.option] = value
    return values
