"""hpc_train.runtime.checkpoint.restore: which checkpoint a run continues from. Real checkpoints written by
a real Checkpointer (tests/unit/test_checkpoint.py's helpers), then damaged on disk as a killed writer or
a bad disk leaves them: truncated, changed in place, unfinished, with an old marker."""

from __future__ import annotations

import json
import re

import pytest
import torch

from hpc_train.runtime.checkpoint.manager import COMMIT, STATE_FILE, CheckpointError
from tests.unit.test_checkpoint import make, overwrite_in_place, save_two, train_one


def test_fresh_job_starts_at_zero_and_ignores_unfinished_saves(tmp_path):
    (tmp_path / "step-00000050.tmp-1").mkdir()
    (tmp_path / "step-00000060").mkdir()  # renamed but never committed
    _, _, ckpt = make(tmp_path)
    assert ckpt.restore() == 0


def test_corrupt_newest_is_skipped_for_the_previous(tmp_path, capfd):
    ctx, model, ckpt = make(tmp_path, keep=3)
    ckpt.save(10)
    train_one(ctx, model)
    ckpt.save(20)
    state = tmp_path / "step-00000020" / "hpc_train.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated after commit
    _, _, again = make(tmp_path)
    assert again.restore() == 10
    assert "step-00000020 is unreadable" in capfd.readouterr().err


def test_bytes_changed_in_place_fall_back_to_the_previous_checkpoint(tmp_path, capfd):
    save_two(tmp_path)
    state = tmp_path / "step-00000020" / STATE_FILE
    overwrite_in_place(state, (torch.arange(4096.0) * 2).numpy().tobytes()[:64])
    assert torch.load(state, weights_only=True)["step"] == 20  # it would load, with wrong numbers
    _ctx, _model, again = make(tmp_path)
    blob = again.track("blob", {})
    assert again.restore() == 10
    assert torch.equal(blob["data"], torch.arange(4096.0))
    err = capfd.readouterr().err
    assert re.search(r"warning: checkpoint \S*step-00000020 is unreadable \(hpc_train.pt digest mismatch", err), err
    # set aside, not deleted: never tried again, and not pruned in place of the next checkpoint
    assert [s for s, _ in again.complete()] == [10]
    assert not state.exists() and (tmp_path / "step-00000020.damaged-1" / STATE_FILE).is_file()


def test_markers_without_digests_still_load(tmp_path):
    save_two(tmp_path)
    for path in tmp_path.glob("step-*"):
        commit = json.loads((path / COMMIT).read_text())
        (path / COMMIT).write_text(json.dumps({"step": commit["step"], "files": commit["files"]}))  # the old format
    _, _, again = make(tmp_path)
    blob = again.track("blob", {})
    assert again.restore() == 20 and torch.equal(blob["data"], torch.arange(4096.0) * 2)
    truncated = tmp_path / "step-00000020" / STATE_FILE
    truncated.write_bytes(truncated.read_bytes()[:100])
    _, _, third = make(tmp_path)
    assert third.restore() == 10  # old markers' sizes are still checked


def test_when_no_checkpoint_loads_every_one_is_listed_and_nothing_starts_over(tmp_path, capfd, monkeypatch):
    marker = tmp_path / "no_retry"
    monkeypatch.setenv("HPC_TRAIN_NO_RETRY_FILE", str(marker))
    save_two(tmp_path / "ckpt")
    newest = tmp_path / "ckpt" / "step-00000020" / STATE_FILE
    overwrite_in_place(newest, (torch.arange(4096.0) * 2).numpy().tobytes()[:64])
    oldest = tmp_path / "ckpt" / "step-00000010" / STATE_FILE
    size = oldest.stat().st_size
    oldest.write_bytes(oldest.read_bytes()[:12])
    _, _, ckpt = make(tmp_path / "ckpt")
    with pytest.raises(CheckpointError) as info:
        ckpt.restore()
    message = str(info.value)
    assert "step 20: hpc_train.pt digest mismatch" in message
    assert f"step 10: hpc_train.pt has 12 bytes, the commit recorded {size}" in message
    assert "--restart-from-scratch" in message and info.value.repeats
    assert marker.read_text().strip() == message
    assert [s for s, _ in ckpt.complete()] == [20, 10]  # left where they are, for a look or a repair

    monkeypatch.setenv("HPC_TRAIN_RESTART_FROM_SCRATCH", "1")
    capfd.readouterr()
    _ctx, _model, fresh = make(tmp_path / "ckpt", keep=2)
    assert fresh.restore() == 0
    assert "restart from scratch requested: starting over from step 0" in capfd.readouterr().err
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000010.damaged-1", "step-00000020.damaged-1"]
    fresh.save(5)
    fresh.save(6)
    assert [s for s, _ in fresh.complete()] == [6, 5]  # new checkpoints are not pruned for the damaged ones


def test_a_fresh_folder_starts_at_zero_without_a_warning(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_NO_RETRY_FILE", str(tmp_path / "no_retry"))
    _, _, ckpt = make(tmp_path / "ckpt")
    assert ckpt.restore() == 0
    err = capfd.readouterr().err
    assert "warning" not in err and "starting from step 0" in err
    assert not (tmp_path / "no_retry").exists()


def test_restart_from_scratch_still_resumes_from_a_checkpoint_that_loads(tmp_path):
    save_two(tmp_path)
    _, _, ckpt = make(tmp_path, restart_from_scratch=True)  # left on across requeues: must not lose progress
    assert ckpt.restore() == 20
