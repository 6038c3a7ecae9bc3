"""Garbage collection of the store: trees no job still needs, then the content no tree holds.

Which trees a job still needs (pending, running, requeued) is the caller's to say: ``keep``. An object's
link count says whether any tree holds it (a tree is hard links), so nothing is scanned to find out.
What a submit is making right now is young: trees and objects younger than ``min_age_s`` stay, so a
collection beside a submit never takes the content that submit has just stored and not yet linked.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_train.snapshot.store import Store

MIN_AGE_S = 3600.0


@dataclass(frozen=True)
class Collected:
    trees: int
    objects: int
    freed_bytes: int


def collect(store: Store, keep: set[str], min_age_s: float = MIN_AGE_S) -> Collected:
    """Remove the trees not in ``keep`` (digests) and older than ``min_age_s``, then every object no tree
    holds any more; leftovers of interrupted submits (``.tmp-*``) go once they are as old."""
    before = time.time() - min_age_s
    trees = 0
    for tree in list_dir(store.trees):
        if tree.name not in keep and old(tree, before):
            shutil.rmtree(tree, ignore_errors=True)
            trees += not tree.exists()
    objects = freed = 0
    for folder in list_dir(store.objects):
        for obj in list_dir(folder) if folder.is_dir() else [folder]:
            st = os.lstat(obj)
            unused = st.st_nlink == 1 or obj.name.startswith(".tmp-")
            if unused and st.st_mtime < before:
                os.unlink(obj)
                objects, freed = objects + 1, freed + st.st_size
    return Collected(trees, objects, freed)


def list_dir(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except FileNotFoundError:
        return []


def old(path: Path, before: float) -> bool:
    try:
        return path.lstat().st_mtime < before
    except FileNotFoundError:
        return False
