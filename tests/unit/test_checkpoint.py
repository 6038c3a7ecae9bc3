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
