"""A checkpoint folder made complete: renamed into place, then its COMMIT marker written last.

The one rule for shared storage, whoever commits (the Checkpointer after every rank's share is
durable; the node-local tier's drain once every node's files are copied): COMMIT keeps ``files`` as
``{name: size}``, what markers before digests held, so older readers still load newer checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from hpc_train.contract import COMMIT
from hpc_train.runtime.checkpoint.shares import fsync_dir

DIGEST = "sha256"


def write_json(path: Path, obj: Any) -> None:
    """``obj`` written to ``path`` whole or not at all, and fsynced."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_tree_dirs(path: Path) -> None:
    for folder in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(folder)
    fsync_dir(path)


def commit(tmp: Path, final: Path, step: int, sizes: dict[str, int], digests: dict[str, str]) -> None:
    """``tmp`` (every file durable) renamed to ``final`` and committed. Raises; the caller cleans up."""
    fsync_dir(tmp)
    if final.exists():  # the same step saved again (a stop right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_json(
        final / COMMIT,
        {"step": step, "files": sizes, "digest": DIGEST, "digests": digests, "committed_at": time.time()},
    )
    fsync_dir(final)
    fsync_dir(final.parent)
