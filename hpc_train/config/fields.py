"""The vocabulary of config models: plain dataclasses that pydantic validates.

Models are stdlib dataclasses (frozen, keyword-only) deriving from :class:`Model`, whose
``__pydantic_config__`` makes pydantic reject unknown keys. Constraints and validators are
``Annotated`` markers that describe themselves to pydantic (``__get_pydantic_core_schema__``), so
defining a model imports nothing from pydantic: a login-side command that finds the compiled
validator in its cache (``hpc_train.config.validate``) never imports pydantic at all.

    @dataclass(frozen=True, kw_only=True)
    class Options(Model):
        stage: Annotated[int, Ge(0), Le(3)] = setting(2, "ZeRO stage")
        name: Annotated[str, After(check_name)] = "x"

A JobSpec field is declared once: ``setting(..., cli=Flag(group), env=...)`` also makes it a flag of
``submit``/``render`` and a variable the job reads (:class:`Flag`, :func:`to_env`, :func:`from_env`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin


class Model:
    """Base of every config model: unknown keys are errors (a typo must never be ignored)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}


@dataclass(frozen=True)
class Flag:
    """How a field is given on ``submit`` and ``render``; hpc_train.cli.options makes the flag."""

    group: str  # the --help heading it is listed under
    flag: str | None = None  # None: from the field's name, grad_clip -> --grad-clip
    short: str | None = None  # "-N"
    metavar: str | None = None
    help: str | None = None  # a % is a percent sign here, not argparse's format
    negatable: bool = True  # a bool: --x / --no-x; False: --x alone (store_true)


def setting(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    cli: Flag | None = None,
    env: str | None = None,
) -> Any:
    """A field with a description (shown by ``backends``, ``site show`` and the docs).

    With ``cli``, the field is a flag of ``submit``/``render`` too (its ``help`` defaults to ``doc``);
    its type, choices and action come from the annotation (:func:`value_kind`). With ``env`` (a
    hpc_train.contract name), the plan exports the field's value under that variable and the job reads
    it back (:func:`to_env`, :func:`from_env`).
    """
    metadata: dict[str, Any] = {"description": doc} if doc else {}
    if cli is not None:
        metadata["cli"] = cli if cli.help is not None or not doc else dataclasses.replace(cli, help=doc)
    if env is not None:
        metadata["env"] = env
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class _Bound:
    key: ClassVar[str]

    def __init__(self, value: float) -> None:
        self.value = value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        schema = handler(source)
        schema[self.key] = self.value  # int and float schemas check these in pydantic-core
        return schema

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"


class Ge(_Bound):
    key = "ge"


class Gt(_Bound):
    key = "gt"


class Le(_Bound):
    key = "le"


class Pattern:
    """A str must match this regular expression."""

    def __init__(self, regex: str) -> None:
        self.regex = regex

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        schema = handler(source)
        schema["pattern"] = self.regex
        return schema


class Before:
    """Run ``fn`` on the raw input before the type is checked (a module-level function: it is cached by name)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(self.fn, handler(source))


class After:
    """Run ``fn`` on the checked value; it returns the value to keep or raises ValueError (the message is the user's)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(self.fn, handler(source))


def default_of(f: dataclasses.Field[Any]) -> Any:
    """A dataclass field's default (a fresh one from its factory); None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def descriptions(cls: type) -> dict[str, tuple[Any, str]]:
    """``{field: (default, description)}`` of a config model (a dataclass, or a pydantic model from a plugin)."""
    if dataclasses.is_dataclass(cls):
        return {f.name: (default_of(f), f.metadata.get("description", "")) for f in dataclasses.fields(cls)}
    fields = getattr(cls, "model_fields", {})
    return {name: (f.get_default(call_default_factory=True), f.description or "") for name, f in fields.items()}


def flag_of(cls: type, key: str) -> str:
    """A problem's key as the CLI spells the option: ``spare_nodes`` -> ``--spare-nodes``,
    ``backend_options.zero_stage`` -> ``--option zero_stage``; a key that is no flag of ``cls`` stays."""
    name, _, rest = key.partition(".")
    found = {f.name: f for f in dataclasses.fields(cls)}.get(name) if dataclasses.is_dataclass(cls) else None
    if found is None or "cli" not in found.metadata:
        return key
    flag = found.metadata["cli"].flag or "--" + name.replace("_", "-")
    return f"{flag} {rest}" if rest else flag


def field_names(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(getattr(cls, "model_fields", {}))


@dataclass(frozen=True)
class Kind:
    """What a field takes, as text spells it (a flag's value, an environment variable)."""

    type: type  # bool, int, float, str, list or dict
    choices: tuple[str, ...] | None = None  # a Literal's values
    # a Before validator reads the text itself (a duration, a Slurm time): it is passed on as given
    text: bool = False


def value_kind(annotation: Any) -> Kind:
    """The :class:`Kind` of an annotation: ``Annotated`` markers and ``| None`` looked through."""
    markers: list[Any] = []
    while True:
        if get_origin(annotation) is Annotated:
            markers.extend(annotation.__metadata__)
            annotation = annotation.__origin__
            continue
        members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
        rest = [m for m in members if m is not type(None)]
        if len(members) == len(rest) + 1 == 2:
            annotation = rest[0]
            continue
        break
    text = any(isinstance(m, Before) for m in markers)
    origin = get_origin(annotation) or annotation
    if origin is Literal:
        return Kind(str, tuple(str(choice) for choice in get_args(annotation)), text)
    return Kind(origin if origin in (bool, int, float, list, dict) else str, None, text)


@functools.cache
def field_kinds(cls: type) -> dict[str, Kind]:
    """``{field: Kind}`` of a config dataclass (its annotations evaluated once per process)."""
    return {name: value_kind(hint) for name, hint in typing.get_type_hints(cls, include_extras=True).items()}


def env_text(value: Any) -> str:
    """A value as the job reads it from its environment: a bool is 1 or 0, a float its repr."""
    if isinstance(value, bool):
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def from_text(kind: Kind, raw: str) -> Any:
    """:func:`env_text`'s value back: what the field's kind takes (raises ValueError when it is not that)."""
    if kind.type is bool:
        return raw.lower() in ("1", "true", "yes")
    return kind.type(raw) if kind.type in (int, float) else raw


def to_env(obj: Any) -> dict[str, str]:
    """``{variable: text}`` of a model instance's ``env`` fields that are set (None: not exported)."""
    values = {f.metadata["env"]: getattr(obj, f.name) for f in dataclasses.fields(obj) if "env" in f.metadata}
    return {var: env_text(value) for var, value in values.items() if value is not None}


def from_env(cls: type, environ: Mapping[str, str], names: Collection[str] | None = None) -> dict[str, Any]:
    """The ``env`` fields of ``cls`` (only ``names``, when given) that ``environ`` sets, typed; "" is unset."""
    kinds = field_kinds(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        var = f.metadata.get("env")
        if var is not None and (names is None or f.name in names) and environ.get(var):
            out[f.name] = from_text(kinds[f.name], environ[var])
    return out
