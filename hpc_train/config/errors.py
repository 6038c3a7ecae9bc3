"""Turn pydantic's validation errors into Problems that name file, dotted key, line and a fix."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from hpc_train.errors import Problem, did_you_mean

Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that owns the last element of ``loc`` (to suggest its field names)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:
            # dict[str, Model] / list[Model]: step into the value type, skipping the key or index
            args = typing.get_args(current)
            current = args[-1] if args else None
        current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    # Optional[Model] and Annotated[...] hide the model class one level down (dicts and lists do not).
    if typing.get_origin(annotation) in (dict, list, tuple):
        return annotation
    for arg in typing.get_args(annotation) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation


def _expected(error: dict[str, Any]) -> str:
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
        return f"expected one of {ctx.get('expected')}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return error["msg"][0].lower() + error["msg"][1:]


def problems_from_validation(
    exc: ValidationError,
    model: type[BaseModel],
    source: str | Callable[[Loc], str],
    line_of: Callable[[Loc], int | None] = lambda loc: None,
    prefix: Loc = (),
) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc: Loc = tuple(part for part in error["loc"] if not str(part).startswith("function-"))
        key = dotted(prefix + loc)
        src = source(loc) if callable(source) else source
        if error["type"] == "extra_forbidden":
            owner = _model_at(model, loc)
            hint = did_you_mean(str(loc[-1]), owner.model_fields, "key") if owner else None
            problems.append(Problem(src, key, "unknown key", line_of(loc), hint))
            continue
        message = _expected(error)
        if error["type"] not in ("missing", "value_error") and "input" in error:
            message += f", got {error['input']!r}"
        problems.append(Problem(src, key, message, line_of(loc)))
    return problems
