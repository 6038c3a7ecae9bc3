"""Where the built-in data folders are, in a checkout, an editable install or a wheel alike.

setup.cfg maps the top-level ``templates/`` and ``site_configs/`` folders into the package as
``hpc_train.templates`` and ``hpc_train.site_configs``; the import system knows where they are.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path


@functools.cache
def builtin_dir(name: str) -> Path:
    spec = importlib.util.find_spec(f"hpc_train.{name}")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if Path(location).is_dir():
                return Path(location)
    # Running from a source tree that was never installed: the folders sit beside the package.
    fallback = Path(__file__).resolve().parent.parent / name
    if fallback.is_dir():
        return fallback
    raise RuntimeError(f"hpc_train's built-in {name!r} folder is missing; reinstall hpc_train")
