"""--resume-from on the login side: a job id, name or folder found, checked and passed to the job as one folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.jobs.resume_source import resolve
from tests.conftest import REPO, write
from tests.unit.test_resume_shape import shape


def checkpoint(job_folder: Path, step: int, saved: dict | None = None) -> Path:
    path = job_folder / "checkpoints" / f"step-{step:08d}"
    write(path / "hpc_train.pt", "x")
    if saved is not None:
        write(path / "shape.json", json.dumps(saved))
    write(path / "COMMIT", json.dumps({"step": step, "files": {"hpc_train.pt": 1}}))
    return path


def test_a_job_folder_its_checkpoint_folder_an_id_and_a_name_name_the_same_folder(tmp_path, monkeypatch):
    job = tmp_path / "jobs" / "4242"
    checkpoint(job, 10)
    wanted = str((job / "checkpoints").resolve())
    assert resolve(str(job)) == resolve(str(job / "checkpoints")) == wanted
    monkeypatch.setenv("HPC_TRAIN_STATE_DIR", str(tmp_path / "state"))
    for job_id, name, when in (("4241", "pretrain", 1.0), ("4242", "pretrain", 2.0)):
        write(
            tmp_path / "state" / "jobs" / f"{job_id}.json",
            json.dumps({"folder": str(tmp_path / "jobs" / job_id), "job_name": name, "submitted_at": when}),
        )
    assert resolve("4242") == wanted
    assert resolve("pretrain") == wanted  # the newest job of that name


def test_what_cannot_be_resumed_is_refused_with_what_was_found(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(ValueError, match="does not exist"):
        resolve(str(tmp_path / "nowhere"))
    (tmp_path / "job" / "checkpoints" / "step-00000010.tmp-1").mkdir(parents=True)
    with pytest.raises(
        ValueError, match=r"has no committed checkpoint \(found step-00000010.tmp-1; a checkpoint is committed once its COMMIT"
    ):
        resolve(str(tmp_path / "job"))
    with pytest.raises(ValueError, match="no job 999 submitted through hpc_train"):
        resolve("999")
    with pytest.raises(ValueError, match="is one checkpoint; give the folder that holds it"):
        resolve(str(checkpoint(tmp_path / "other", 5)))


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train", "render", "--site", "sandbox", *args, "examples/train_resumable.py"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip


def test_render_exports_the_folder_and_refuses_a_shape_that_cannot_continue(tmp_path):
    job = tmp_path / "job"
    checkpoint(job, 10, shape())  # 4 processes, global batch 16
    ok = render("--nodes", "1", "--procs-per-node", "2", "--resume-from", str(job))
    assert ok.returncode == 0, ok.stderr
    assert f"export HPC_TRAIN_RESUME_FROM={(job / 'checkpoints').resolve()}" in ok.stdout
    bad = render("--nodes", "1", "--procs-per-node", "3", "--resume-from", str(job))
    assert bad.returncode == 78, bad.stderr
    assert "--resume-from" in bad.stderr and "does not divide among 3 data-parallel ranks" in bad.stderr
    assert "Traceback" not in bad.stderr
    empty = render("--resume-from", str(tmp_path / "nothing-here"))
    assert empty.returncode == 78 and "--resume-from" in empty.stderr and "Traceback" not in empty.stderr
