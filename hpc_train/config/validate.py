"""Validate config models with pydantic, keeping each compiled validator in the user's cache.

Building a validator means importing pydantic and generating its schema: about 0.2 s on a login
node, more than everything else ``render`` does. What pydantic generates (its *core schema*) is plain
data plus references to our own model classes and validator functions, so it is pickled once, and
later runs build the same validator from it with pydantic-core alone: same rules, same errors.

An entry records the source files its schema came from (size and mtime); an edit, a new
pydantic-core, Python or hpc_train version, or an unreadable entry means pydantic builds it again.
``HPC_TRAIN_NO_CACHE=1`` always builds. The cache lives in the user's own folder (0700), the same
trust as their site files.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pickle
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic_core import SchemaValidator, ValidationError
from pydantic_core import __version__ as CORE_VERSION

from hpc_train._resources import cache_dir, file_stamp, write_atomic
from hpc_train.config.fields import default_of

__all__ = ["ValidationError", "dump", "validate", "validator"]

T = TypeVar("T")
FORMAT = 2  # bump when the entry layout changes


def validate(cls: type[T], data: Any) -> T:
    """``data`` (a mapping) as an instance of ``cls``; raises :class:`ValidationError` with every problem.

    ``cls`` is a config dataclass (hpc_train.config.fields) or, from a third-party plugin, a pydantic model.
    """
    if not dataclasses.is_dataclass(cls):
        return cls.model_validate(data)  # type: ignore[attr-defined]
    return validator(cls).validate_python(data)  # type: ignore[no-any-return]


def dump(obj: Any) -> Any:
    """JSON-ready data of a model instance (config values are JSON types already)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj.model_dump(mode="json")


def defaults(cls: type[T]) -> T:
    """An instance with every default (None where a field has none), unvalidated: to go on planning
    after an error has been recorded, so that every problem is reported at once."""
    if not dataclasses.is_dataclass(cls):
        return cls.model_construct()  # type: ignore[attr-defined]
    obj = object.__new__(cls)
    for f in dataclasses.fields(cls):
        object.__setattr__(obj, f.name, default_of(f))  # frozen dataclasses too
    return obj  # type: ignore[return-value]


@functools.cache
def validator(cls: type) -> SchemaValidator:
    entry = _entry_path(cls)
    schema = _read(entry) if entry is not None else None
    if schema is None:
        schema, files = _build(cls)
        if entry is not None:
            _write(entry, schema, files)
    return SchemaValidator(schema)


def _module_file(name: str) -> str | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    return os.path.abspath(file) if file else None


def _entry_path(cls: type) -> Path | None:
    folder = cache_dir("validators")
    if folder is None:
        return None
    from hpc_train.version import __version__

    key = "\0".join(
        [cls.__module__, cls.__qualname__, str(_module_file(cls.__module__)), CORE_VERSION, sys.version, __version__, str(FORMAT)]
    )
    return folder / f"{cls.__qualname__}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.pickle"


def _read(entry: Path) -> dict[str, Any] | None:
    try:
        with open(entry, "rb") as f:
            stored = pickle.load(f)
        if stored["format"] != FORMAT:
            return None
        if any(file_stamp(path) != tuple(stamp) for path, stamp in stored["files"].items()):
            return None
        schema: dict[str, Any] = stored["schema"]
        return schema
    except Exception:  # missing, truncated, from an older layout, or naming code that moved: rebuild
        return None


def _write(entry: Path, schema: dict[str, Any], files: dict[str, tuple[int, int]]) -> None:
    try:
        data = pickle.dumps({"format": FORMAT, "files": files, "schema": schema}, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # unpicklable (a lambda in a plugin's validator): validated, just not cached
        return
    write_atomic(entry, data)


def _build(cls: type) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    from pydantic import TypeAdapter

    schema = _strip(TypeAdapter(cls).core_schema)
    modules = {cls.__module__, __name__, "hpc_train.config.fields"}
    _collect_modules(schema, modules)
    files = {}
    for name in sorted(modules):
        path = _module_file(name)
        stamp = file_stamp(path) if path else None
        if path and stamp:
            files[path] = stamp
    return schema, files


def no_bool_int(value: Any) -> Any:
    """pydantic takes ``true`` for 1 and 8.0 for 8 where a count is wanted: a count is never a yes, and
    ``-o zero_stage=8.0`` or ``micro_batch: 2.5`` is a mistake to show, not to round."""
    if isinstance(value, (bool, float)):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def no_bool_float(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


_SIMPLE = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true/false", "none": "null"}


def _one_error(union: dict[str, Any]) -> dict[str, Any]:
    """A union of plain types fails once, saying what would do ("expected a string, an integer or
    true/false"), not once per member under keys like ``account.str``; richer unions keep their errors."""
    names = []
    for choice in union["choices"]:
        schema = choice[0] if isinstance(choice, (tuple, list)) else choice
        while schema.get("type", "").startswith("function-") and "schema" in schema:
            schema = schema["schema"]
        if schema.get("type") not in _SIMPLE:
            return union
        names.append(_SIMPLE[schema["type"]])
    listed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    return {**union, "custom_error_type": "union_mismatch", "custom_error_message": f"expected {listed}"}


def _strip(node: Any) -> Any:
    # "metadata" holds pydantic's JSON-schema hooks (closures into pydantic); validation never reads it
    if isinstance(node, dict):
        stripped = {k: (_strip(v) if k != "serialization" else v) for k, v in node.items() if k != "metadata"}
        if stripped.get("type") in ("int", "float"):
            check = no_bool_int if stripped["type"] == "int" else no_bool_float
            return {"type": "function-before", "function": {"type": "no-info", "function": check}, "schema": stripped}
        if stripped.get("type") == "union" and "custom_error_type" not in stripped:
            return _one_error(stripped)
        return stripped
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _collect_modules(node: Any, out: set[str]) -> None:
    """Modules whose classes and functions the schema names: an edit to one invalidates the entry."""
    if isinstance(node, dict):
        for value in node.values():
            _collect_modules(value, out)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _collect_modules(value, out)
    elif callable(node):
        module = getattr(node, "__module__", None)
        if isinstance(module, str):
            out.add(module)
