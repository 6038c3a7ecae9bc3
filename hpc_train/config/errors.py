"""Turn pydantic's validation errors into Problems that name file, dotted key, line and a fix."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

from hpc_train.config.fields import field_names
from hpc_train.config.text import shorten
from hpc_train.config.validate import ValidationError
from hpc_train.errors import Problem, did_you_mean

Loc = tuple[str | int, ...]
UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")  # a model's, a dataclass's


def dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


def _is_model(cls: Any) -> bool:
    return isinstance(cls, type) and (dataclasses.is_dataclass(cls) or hasattr(cls, "model_fields"))


def _field_type(model: type, name: str) -> Any:
    if dataclasses.is_dataclass(model):
        return typing.get_type_hints(model).get(name)  # resolves the string annotations, drops Annotated
    field = getattr(model, "model_fields", {}).get(name)
    return field.annotation if field is not None else None


def _model_at(model: type, loc: Loc) -> type | None:
    """The model class that owns the last element of ``loc`` (to suggest its field names)."""
    current: Any = model
    for part in loc[:-1]:
        if _is_model(current):
            current = _field_type(current, str(part))
            if current is None:
                return None
        else:
            # dict[str, Model] / list[Model]: step into the value type, skipping the key or index
            args = typing.get_args(current)
            current = args[-1] if args else None
        current = _unwrap(current)
    return current if _is_model(current) else None


def _unwrap(annotation: Any) -> Any:
    # Optional[Model] and Annotated[...] hide the model class one level down (dicts and lists do not).
    if typing.get_origin(annotation) in (dict, list, tuple):
        return annotation
    for arg in typing.get_args(annotation) or ():
        if _is_model(arg):
            return arg
    return annotation


def _expected(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    simple = {
        "int_parsing": "expected an integer",
        "int_type": "expected an integer",
        "int_from_float": "expected an integer",
        "float_parsing": "expected a number",
        "float_type": "expected a number",
        "bool_parsing": "expected true or false",
        "bool_type": "expected true or false",
        "string_type": "expected a string",
        "dict_type": "expected a mapping (key: value)",
        "list_type": "expected a list",
        "model_type": "expected a mapping (key: value)",
        "dataclass_type": "expected a mapping (key: value)",
        "missing": "required key is missing",
    }
    if kind in simple:
        return simple[kind]
    if kind == "greater_than_equal":
        return f"expected a number ≥ {ctx.get('ge')}"
    if kind == "greater_than":
        return f"expected a number > {ctx.get('gt')}"
    if kind == "less_than_equal":
        return f"expected a number ≤ {ctx.get('le')}"
    if kind == "literal_error":
        expected = str(ctx.get("expected"))
        return f"expected {expected}" if " or " not in expected and "," not in expected else f"expected one of {expected}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return error["msg"][0].lower() + error["msg"][1:]


def problems_from_validation(
    exc: ValidationError,
    model: type,
    source: str | Callable[[Loc], str],
    line_of: Callable[[Loc], int | None] = lambda loc: None,
    prefix: Loc = (),
) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        # "[key]": the error is about a mapping's key, whose own line is the one to show
        loc: Loc = tuple(part for part in error["loc"] if not str(part).startswith("function-") and part != "[key]")
        key = dotted(prefix + loc)
        src = source(loc) if callable(source) else source
        if error["type"] in UNKNOWN_KEY:
            owner = _model_at(model, loc)
            hint = did_you_mean(str(loc[-1]), field_names(owner), "key") if owner else None
            problems.append(Problem(src, key, "unknown key", line_of(loc), hint))
            continue
        message = _expected(error)
        if error["type"] not in ("missing", "value_error") and "input" in error:
            message += f", got {error['input']!r}"
        problems.append(Problem(src, key, shorten(message, 400), line_of(loc), _close_choice(error)))  # a value may be a megabyte
    return problems


def _close_choice(error: Mapping[str, Any]) -> str | None:
    """'did you mean ...?' for a value that is not one of a fixed set (cpu_bind: core -> 'cores')."""
    if error["type"] != "literal_error" or not isinstance(error.get("input"), str):
        return None
    choices = re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))
    hint = did_you_mean(error["input"], choices) if choices else None
    return hint if hint and hint.startswith("did you mean") else None
