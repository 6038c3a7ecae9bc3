"""``--resume-from JOB|FOLDER`` on the login side: the checkpoint folder it names, found and checked without torch.

JOB is a job id or name submitted through hpc_train on this machine (found in the job index, as
``status`` and ``report`` find a job); FOLDER is a job folder or its ``checkpoints`` folder. The job
gets the absolute checkpoint folder; a value that names no folder, or one without a committed
checkpoint, is refused before submission with what was found there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpc_train import contract
from hpc_train.contract import COMMIT, committed
from hpc_train.jobs.handle import state_dir

JOB_ID_CHARS = set("0123456789_")


def resolve(value: str) -> str:
    """The absolute checkpoint folder ``value`` names; ValueError saying what was found otherwise."""
    text = value.strip()
    if not text:
        raise ValueError("expected a job id, a job name or a folder, got an empty value")
    path = Path(text).expanduser()
    if path.is_dir():
        folder = _checkpoint_folder(path.resolve())
    elif os.sep in text or text.startswith("."):
        raise ValueError(f"{text} does not exist (give a job folder, its {contract.CHECKPOINTS} folder, or a job id)")
    else:
        folder = _job_folder(text) / contract.CHECKPOINTS
    if not committed(folder):
        raise ValueError(f"{folder} has no committed checkpoint ({_found(folder)}); nothing to resume from")
    return str(folder)


def _checkpoint_folder(path: Path) -> Path:
    """A job folder's checkpoint folder, or ``path`` itself when it holds the checkpoints."""
    if path.name.startswith("step-") and (path / COMMIT).is_file():
        raise ValueError(
            f"{path} is one checkpoint; give the folder that holds it ({path.parent}): the newest committed one is resumed"
        )
    inner = path / contract.CHECKPOINTS
    if not committed(path) and inner.is_dir():
        return inner
    return path


def _job_folder(job: str) -> Path:
    records = state_dir() / "jobs"
    if set(job) <= JOB_ID_CHARS:
        path = records / f"{job}.json"
        if not path.is_file():
            raise ValueError(f"no job {job} submitted through hpc_train on this machine (records in {records}); give its folder")
        return Path(json.loads(path.read_text())["folder"])
    named = []
    for path in records.glob("*.json") if records.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("job_name") == job:
            named.append((float(record.get("submitted_at") or 0), record["folder"]))
    if not named:
        raise ValueError(f"{job!r} is no folder and no job name submitted through hpc_train here (records in {records})")
    return Path(max(named)[1])  # the newest job of that name: the one a user resubmitting after it means


def _found(folder: Path) -> str:
    """What a folder without a committed checkpoint holds, for the message."""
    if not folder.is_dir():
        return "no such folder"
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        return "it is empty"
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"found {shown}; a checkpoint is committed once its {COMMIT} marker is written"
