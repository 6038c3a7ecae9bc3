"""Resolved sites kept in the user's cache, so a command does not parse and validate YAML again
until something it was made from changes.

An entry is used only when, byte for byte, every file of the site's ``extends`` chain is the same,
the site files visible on the search path are the same (a new file could change what ``extends: x``
finds), and hpc_train's config code is unchanged. Only sites that loaded without error are kept.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train._resources import cache_dir, file_stamp, write_atomic

if TYPE_CHECKING:
    from hpc_train.config.resolved import ResolvedSite

FORMAT = 1
# the code a resolved site depends on: the config package and the NCCL catalogue its checks use
_CODE = [*sorted(Path(__file__).parent.glob("*.py")), Path(__file__).parent.parent / "fabric" / "nccl.py"]


def _entry(path: Path) -> Path | None:
    folder = cache_dir("sites")
    if folder is None:
        return None
    from hpc_train.version import __version__

    # display paths in messages are relative to the working folder, so it is part of the key
    key = "\0".join([str(path.resolve()), os.getcwd(), sys.version, __version__, str(FORMAT)])
    return folder / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.pickle"


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _fingerprint(digests: dict[str, str], visible: dict[str, Path]) -> dict[str, Any]:
    return {
        "chain": digests,
        "visible": sorted((name, str(p)) for name, p in visible.items()),
        "code": [(str(f), file_stamp(f)) for f in _CODE],
    }


def read(path: Path, visible: dict[str, Path]) -> ResolvedSite | None:
    entry = _entry(path)
    if entry is None:
        return None
    try:
        with open(entry, "rb") as f:
            stored = pickle.load(f)
        resolved: ResolvedSite = stored["resolved"]
        on_disk = {str(file): digest(file.read_bytes()) for file in resolved.chain}
        if stored["format"] != FORMAT or stored["fingerprint"] != _fingerprint(on_disk, visible):
            return None
        return resolved
    except Exception:  # missing, damaged, a chain file gone, or naming code that moved: load it again
        return None


def write(resolved: ResolvedSite, visible: dict[str, Path]) -> None:
    entry = _entry(resolved.path)
    if entry is None:
        return
    try:
        # the digests of what was parsed, not of the files now: an edit made meanwhile must not be hidden
        data = pickle.dumps(
            {"format": FORMAT, "fingerprint": _fingerprint(resolved.digests, visible), "resolved": resolved},
            protocol=pickle.HIGHEST_PROTOCOL,
        )
    except Exception:
        return
    write_atomic(entry, data)
