"""Checkpoints in one process and in real subprocesses: atomic, found again, never half-loaded."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpc_train.runtime.checkpoint.manager import (
    COMMIT,
    STATE_FILE,
    Checkpointer,
    CheckpointError,
)
from hpc_train.runtime.context import Context
from hpc_train.runtime.data import DistributedLoader, batches
from hpc_train.runtime.engine.backend import BackendRuntime
from hpc_train.runtime.launch.environment import detect
from hpc_train.runtime.lifecycle.preemption import StopWatcher
from hpc_train.runtime.options import RuntimeOptions
from tests.conftest import REPO


def make(folder: Path, size: int = 8, **kwargs) -> tuple[Context, torch.nn.Module, Checkpointer]:
    env = detect({})
    runtime = BackendRuntime(env, RuntimeOptions())
    ctx = Context(env, "torchrun", runtime)
    torch.manual_seed(0)
    model = torch.nn.Linear(size, size)
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    return ctx, model, ctx.checkpointer(folder, **kwargs)


def train_one(ctx: Context, model: torch.nn.Module) -> None:
    ctx.backward(model(torch.randn(4, model.in_features)).pow(2).mean())
    ctx.step()


def test_save_commit_restore_and_keep(tmp_path):
    ctx, model, ckpt = make(tmp_path, keep=2)
    counters = ckpt.track("counters", {"tokens": 0})
    for step in range(1, 4):
        train_one(ctx, model)
        counters["tokens"] += 100
        ckpt.save(step)
    assert [s for s, _ in ckpt.complete()] == [3, 2]  # step 1 deleted after 3 was committed
    assert all((p / COMMIT).is_file() for _, p in ckpt.complete())
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    rng_after_save = torch.rand(3)

    ctx2, model2, ckpt2 = make(tmp_path)
    counters2 = ckpt2.track("counters", {})
    assert ckpt2.restore() == 3
    assert all(torch.equal(saved[k], v) for k, v in model2.state_dict().items())
    assert counters2 == {"tokens": 300}
    assert ctx2.runtime.optimizer.state_dict()["state"]  # momentum buffers came back
    assert torch.equal(torch.rand(3), rng_after_save)  # the RNG continues where it was saved


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


def test_async_save_commits_in_the_background(tmp_path):
    ctx, model, ckpt = make(tmp_path, size=256, async_save=True)
    ckpt.save(1)
    train_one(ctx, model)  # training continues while the writer runs
    ckpt.wait()
    assert [s for s, _ in ckpt.complete()] == [1]


def test_loader_resumes_mid_epoch_at_the_same_batch():
    data = torch.utils.data.TensorDataset(torch.arange(40).float())
    straight = [b[0].tolist() for _, b in zip(range(13), batches(DistributedLoader(data, 4, 0, 2, seed=1)))]
    resumed = [b[0].tolist() for _, b in zip(range(6), batches(DistributedLoader(data, 4, 0, 2, seed=1), start=7))]
    assert resumed == straight[7:13]  # crosses into the second epoch the same way


def test_batches_end_at_total_counted_from_the_first_batch(tmp_path):
    data = torch.utils.data.TensorDataset(torch.arange(40).float())
    straight = [b[0].tolist() for _, b in zip(range(13), batches(DistributedLoader(data, 4, 0, 2, seed=1)))]
    assert [b[0].tolist() for b in batches(DistributedLoader(data, 4, 0, 2, seed=1), total=13)] == straight
    resumed = [b[0].tolist() for b in batches(DistributedLoader(data, 4, 0, 2, seed=1), start=7, total=13)]
    assert resumed == straight[7:13]
    assert list(batches(DistributedLoader(data, 4, 0, 2, seed=1), start=13, total=13)) == []  # restored at the end
    ctx, _, _ = make(tmp_path)
    assert len(list(ctx.batches(ctx.loader(data, 4), start=3, total=25))) == 22  # 10 per epoch: crosses two epochs
    with pytest.raises(ValueError, match="cannot be negative"):
        next(batches(DistributedLoader(data, 4, 0, 2), start=-1))


def test_the_documented_loop_is_the_example_loop():
    docs = (REPO / "docs" / "checkpointing.md").read_text()
    block = docs.split("```python\n", 1)[1].split("```", 1)[0]
    loop = block[block.index("ckpt = ctx.checkpointer()") :]
    wanted = [line.split("  #")[0].strip() for line in loop.splitlines() if line.strip()]
    example = [line.strip() for line in (REPO / "examples" / "train_resumable.py").read_text().splitlines()]
    at = 0
    for line in wanted:  # every line of the documented loop, in order, in the example
        assert line in example[at:], f"examples/train_resumable.py lacks the documented loop's line {line!r}"
        at = example.index(line, at) + 1


def test_stop_watcher_sources(tmp_path):
    flag = tmp_path / "stop"
    watcher = StopWatcher({"HPC_TRAIN_STOP_FILE": str(flag)}, poll_s=0.05).start()
    assert not watcher.requested
    flag.touch()
    time.sleep(0.3)
    assert watcher.requested and "stop requested" in watcher.reason
    watcher.close()
    clock = StopWatcher({"HPC_TRAIN_DEADLINE": str(time.time() + 0.1)}, poll_s=0.05).start()
    time.sleep(0.4)
    assert clock.requested and "time limit" in clock.reason
    clock.close()
    sig = StopWatcher({}).start()
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(0.05)
    assert sig.requested and "SIGUSR2" in sig.reason
    sig.close()


SAVER = """
import sys, torch
sys.path.insert(0, {repo!r})
from tests.unit.test_checkpoint import make
ctx, model, ckpt = make(__import__("pathlib").Path({folder!r}), size=1500)
ckpt.save(1)
print("first saved", flush=True)
for step in range(2, 1000):
    ckpt.save(step)
"""


def test_kill_9_while_writing_keeps_the_previous_checkpoint(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", SAVER.format(repo=str(REPO), folder=str(tmp_path))], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "first saved"
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob("step-*.tmp-*/hpc_train.pt")):
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)  # in the middle of writing the next checkpoint
    proc.wait()
    assert list(tmp_path.glob("step-*.tmp-*"))  # it really died mid-write
    _, _, ckpt = make(tmp_path, size=1500)
    step = ckpt.restore()
    assert step >= 1 and (tmp_path / f"step-{step:08d}" / COMMIT).is_file()


@pytest.fixture
def tiny_filesystem(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    assert out.returncode == 0, f"cannot mount a small tmpfs (needs root): {out.stderr}"
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_is_a_clear_error_and_the_previous_checkpoint_survives(tiny_filesystem, monkeypatch):
    marker = tiny_filesystem / "no_retry"  # in the job folder, on the same full disk
    monkeypatch.setenv("HPC_TRAIN_NO_RETRY_FILE", str(marker))
    _ctx, _model, ckpt = make(tiny_filesystem, keep=5)
    blob = ckpt.track("blob", {"data": torch.arange(10_000.0)})  # ~40 KB
    ckpt.save(1)
    blob["data"] = torch.zeros(1_000_000)  # 3.8 MiB: more than the filesystem holds
    with pytest.raises(CheckpointError) as info:
        ckpt.save(2)
    message = str(info.value)
    assert "saving step 2 failed: no space left on device" in message and "checkpoint step 1 is intact" in message
    free = float(re.search(r"([0-9.]+) MiB free in ", message).group(1))
    assert free > 1.0  # measured after the partial write was removed, not the 0.0 of a full disk
    assert "the checkpoint needs about 3.8 MiB" in message
    assert "enforce fail" not in message and "unexpected pos" not in message
    assert info.value.repeats and marker.read_text().strip() == message
    assert not list(tiny_filesystem.glob("step-*.tmp-*"))  # the partial write was removed
    _, _, again = make(tiny_filesystem)
    restored = again.track("blob", {})
    assert again.restore() == 1
    assert torch.equal(restored["data"], torch.arange(10_000.0))


def test_a_failed_background_write_surfaces_at_the_next_step(tiny_filesystem):
    _ctx, _model, ckpt = make(tiny_filesystem, every=10, async_save=True)
    ckpt.track("blob", {"data": torch.zeros(1_000_000)})  # 3.8 MiB on a 2 MiB filesystem
    for step in range(1, 11):
        ckpt.step(step)  # step 10 starts the background write and returns
    ckpt._writer.join()  # let it fail now; without this the next step() may run before it did
    with pytest.raises(CheckpointError, match="saving step 10 failed: no space left on device") as info:
        ckpt.step(11)  # not at the next save (step 20)
    assert info.value.repeats
    ckpt.step(12)  # reported once: training may catch it and go on without checkpoints
    ckpt.close()


def save_two(folder: Path, **kwargs) -> tuple[Context, torch.nn.Module, Checkpointer, dict[str, torch.Tensor]]:
    """Checkpoints at steps 10 and 20 with a recognisable tensor; the state saved at 10."""
    ctx, model, ckpt = make(folder, keep=3, **kwargs)
    blob = ckpt.track("blob", {"data": torch.arange(4096.0)})
    ckpt.save(10)
    at_ten = {k: v.clone() for k, v in model.state_dict().items()}
    train_one(ctx, model)
    blob["data"] = blob["data"] * 2
    ckpt.save(20)
    return ctx, model, ckpt, at_ten


def overwrite_in_place(file: Path, pattern: bytes, count: int = 256) -> None:
    """256 bytes of a tensor's data changed, the file's size kept: torch.load alone loads it silently."""
    data = bytearray(file.read_bytes())
    offset = data.index(pattern) + 64
    data[offset : offset + count] = os.urandom(count)
    file.write_bytes(bytes(data))


def test_commit_records_a_digest_of_every_file(tmp_path):
    _, _, ckpt, _ = save_two(tmp_path)
    path = tmp_path / "step-00000020"
    commit = json.loads((path / COMMIT).read_text())
    # shape.json too: --resume-from trusts it to refuse a shape before the job is submitted
    assert commit["digest"] == "sha256" and set(commit["digests"]) == set(commit["files"]) == {STATE_FILE, "shape.json"}
    assert commit["digests"]["shape.json"] == hashlib.sha256((path / "shape.json").read_bytes()).hexdigest()
    assert commit["digests"][STATE_FILE] == hashlib.sha256((path / STATE_FILE).read_bytes()).hexdigest()
    assert commit["files"][STATE_FILE] == (path / STATE_FILE).stat().st_size  # what older readers check
    assert ckpt.verify(path) is None


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


def test_observers_hear_of_saves_commits_and_restores_in_order_and_of_a_failed_save_too(tmp_path):
    from hpc_train.runtime.checkpoint.events import CheckpointObserver

    class Heard(CheckpointObserver):
        def __init__(self) -> None:
            self.events: list[tuple[str, int]] = []

        def before_save(self, step: int) -> None:
            self.events.append(("before_save", step))

        def after_save(self, step: int) -> None:
            self.events.append(("after_save", step))

        def after_commit(self, step: int) -> None:
            self.events.append(("after_commit", step))

        def after_restore(self, step: int) -> None:
            self.events.append(("after_restore", step))

    ctx, model, ckpt = make(tmp_path, async_save=True)
    heard = Heard()
    ckpt.subscribe(heard)
    train_one(ctx, model)
    ckpt.save(1)  # in the background: committed by the next collective call
    assert heard.events == [("before_save", 1), ("after_save", 1)]
    ckpt.wait()
    ckpt.save(2, wait=True)
    assert heard.events[2:] == [("after_commit", 1), ("before_save", 2), ("after_commit", 2), ("after_save", 2)]
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    ckpt.folder = blocked  # a folder that is a file: the save fails, and the range around it still ends
    with pytest.raises(NotADirectoryError):
        ckpt.save(3, wait=True)
    assert heard.events[-2:] == [("before_save", 3), ("after_save", 3)]
    ctx.shutdown()

    ctx2, _, restoring = make(tmp_path)
    restoring.subscribe(heard)
    assert restoring.restore() == 2 and heard.events[-1] == ("after_restore", 2)
    ctx2.shutdown()
