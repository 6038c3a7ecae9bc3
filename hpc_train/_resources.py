"""Where the built-in data folders are, in a checkout, an editable install or a wheel alike.

setup.cfg maps the top-level ``templates/`` and ``site_configs/`` folders into the package as
``hpc_train.templates`` and ``hpc_train.site_configs``; the import system knows where they are.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

from hpc_train import contract


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


def cache_dir(kind: str) -> Path | None:
    """This user's cache folder for ``kind`` (compiled templates, validators), or None when caching
    is off (``HPC_TRAIN_NO_CACHE=1``) or the folder cannot be made. Caches only ever save time."""
    import os

    if os.environ.get(contract.ENV_NO_CACHE, "") not in ("", "0"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(base) / "hpc_train" / kind
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return folder


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(mtime in ns, size) of a file, None when it is gone: what cache entries check their sources by."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def write_atomic(path: Path, data: bytes) -> bool:
    """Write a cache entry so readers see the old one or the whole new one; False when it could not be."""
    # unique even among nodes sharing a home folder, where two writers can have the same pid
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return True
    except OSError:  # read-only home, full disk: the cache only ever saves time
        try:
            tmp.unlink()
        except OSError:
            pass
        return False
