"""Whether a checkpoint was saved by the code a job is about to run: every checkpoint records the snapshot
its job ran (``code`` in its shape.json, hpc_train.runtime.checkpoint.reshape), and two snapshots' manifests
name the files that differ. A job that resumes another's checkpoint (``--resume-from``) with other code is
allowed (fixing a bug and resuming is common) but said, with the files, before it is queued."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpc_train import contract
from hpc_train.resume_shape import read_shape
from hpc_train.snapshot.code import Code
from hpc_train.snapshot.store import MANIFEST

SHOWN = 8


def resume_warning(resume_from: str, code: Code) -> str | None:
    """What differs between the code that saved ``resume_from``'s newest checkpoint and ``code``; None when
    they are the same, or the checkpoint does not say (saved in place, or by an older hpc_train)."""
    found = contract.committed(Path(resume_from))
    shape = read_shape(found[0][1]) if found else None
    saved = shape.get("code") if shape else None
    if not isinstance(saved, str) or not saved or os.path.basename(saved) == code.digest:
        return None
    changed = changed_files(Path(saved), Path(code.tree))
    if changed is None:
        what = f"snapshot {os.path.basename(saved)[:12]}, which is gone from its store, so the changed files cannot be named"
    else:
        listed = ", ".join(changed[:SHOWN]) + (f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else "")
        what = f"other code: {listed} changed since"
    return f"{found[0][1]} was saved by {what}; this job resumes it with snapshot {code.digest[:12]}"


def changed_files(old: Path, new: Path) -> list[str] | None:
    """The paths added, removed or changed from tree ``old`` to tree ``new``, sorted; None when one is gone."""
    try:
        before, after = (manifest(tree) for tree in (old, new))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


def manifest(tree: Path) -> dict[str, str]:
    files = json.loads((tree / MANIFEST).read_text())["files"]
    return {item["path"]: item.get("object") or f"-> {item.get('link')}" for item in files}
