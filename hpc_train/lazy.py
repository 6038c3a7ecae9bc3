"""A package's names that load on first use (PEP 562), for packages whose callers often need none of them:
``hpc_train.config`` (a command that reads no site file skips the YAML loader) and ``hpc_train.runtime``
(the batch shell's tools skip the training library). Imports nothing of hpc_train's."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: dict[str, Any], where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``package``: each name in
    ``where`` is imported from its module when first asked for, then kept in the package."""
    name_of_package = package["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {name_of_package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        package[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*package, *where})

    return __getattr__, __dir__
