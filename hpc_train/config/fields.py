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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar


class Model:
    """Base of every config model: unknown keys are errors (a typo must never be ignored)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}


def setting(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Callable[[], Any] | None = None) -> Any:
    """A field with a description (shown by ``backends``, ``site show`` and the docs)."""
    metadata = {"description": doc} if doc else {}
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


def field_names(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(getattr(cls, "model_fields", {}))
