"""hpc_train.runtime.checkpoint.failures: a failed save or drain in words a user can act on. The real
full disks (a tiny tmpfs, every rank) are in test_checkpoint.py, test_checkpoint_shares.py and test_local_tier.py;
here each rule of the message on its own, against a real folder and real COMMIT markers."""

from __future__ import annotations

import errno
import json
import shutil

from hpc_train.contract import COMMIT
from hpc_train.runtime.checkpoint.failures import drain_failure, needed, save_failure


def committed_step(folder, step, sizes):
    path = folder / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / COMMIT).write_text(json.dumps({"step": step, "files": sizes}))
    return (step, path)


def test_a_full_disk_says_the_space_left_what_the_checkpoint_needs_and_what_is_intact(tmp_path):
    error = save_failure(12, OSError(errno.ENOSPC, "No space left on device"), 3 * 2**20, tmp_path, [(10, tmp_path)], "rank 1")
    text = str(error)
    assert text.startswith("saving step 12 failed (rank 1): no space left on device: ")
    assert f"MiB free in {tmp_path} after removing the partial write" in text
    assert "the checkpoint needs about 3.0 MiB" in text and text.endswith("checkpoint step 10 is intact")
    assert error.repeats  # running again would fill the disk again: not requeued


def test_torchs_write_failure_is_a_full_disk_only_where_the_space_left_is_less_than_needed(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    words = RuntimeError(
        "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/0: file write failed"
    )
    full = save_failure(5, words, free * 2, tmp_path, [])
    assert "no space left on device" in str(full) and full.repeats
    other = save_failure(5, words, 1024, tmp_path, [])
    assert "no space left" not in str(other) and not other.repeats
    assert f"MiB free in {tmp_path})" in str(other) and str(other).endswith("no earlier checkpoint exists")


def test_another_error_keeps_its_own_words_and_may_be_retried(tmp_path):
    error = save_failure(5, PermissionError(errno.EACCES, "Permission denied"), 0, tmp_path / "gone", [])
    assert str(error) == "saving step 5 failed: Permission denied; no earlier checkpoint exists"  # no free space: no folder
    assert not error.repeats


def test_what_a_checkpoint_needs_is_its_tensors_or_the_newest_checkpoints_files_if_more(tmp_path):
    newest = committed_step(tmp_path, 20, {"hpc_train.pt": 5000, "engine/rank0.pt": 7000})
    older = committed_step(tmp_path, 10, {"hpc_train.pt": 10**9})
    assert needed(100, [newest, older]) == 12000  # only the newest counts
    assert needed(50000, [newest]) == 50000
    (newest[1] / COMMIT).write_text("{not json")
    assert needed(100, [newest]) == 100  # an unreadable marker is no estimate
    assert needed(100, []) == 100


def test_a_failed_drain_says_the_step_is_safe_on_the_nodes_and_what_shared_storage_holds(tmp_path):
    error = drain_failure(OSError(errno.ENOSPC, "No space left on device"), 30, tmp_path, [(20, tmp_path)])
    text = str(error)
    assert "copying step 30 from " in text and f"to its partner node or to {tmp_path} failed: " in text
    assert f"step 30 is committed on node-local storage, and {tmp_path}: step 20 is the newest there" in text
    assert error.repeats
    assert not drain_failure(ConnectionResetError("peer gone"), 30, tmp_path, []).repeats
    assert str(drain_failure(ConnectionResetError("peer gone"), 30, tmp_path, [])).endswith("it holds no checkpoint yet")
