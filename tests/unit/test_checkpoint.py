"""Checkpoints in one process and in real subprocesses: atomic, found again, never half-loaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpc_train.runtime.base import BackendRuntime
from hpc_train.runtime.checkpoint import COMMIT, CheckpointError, Checkpointer
from hpc_train.runtime.context import Context
from hpc_train.runtime.data import DistributedLoader, batches
from hpc_train.runtime.environment import detect
from hpc_train.runtime.options import RuntimeOptions
from hpc_train.runtime.preemption import StopWatcher
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
    proc = subprocess.Popen([sys.executable, "-c", SAVER.format(repo=str(REPO), folder=str(tmp_path))],
                            stdout=subprocess.PIPE, text=True)
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
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True, text=True)
    assert out.returncode == 0, f"cannot mount a small tmpfs (needs root): {out.stderr}"
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_is_a_clear_error_and_the_previous_checkpoint_survives(tiny_filesystem):
    ctx, model, ckpt = make(tiny_filesystem, keep=5)
    blob = ckpt.track("blob", {"data": torch.zeros(10_000)})  # ~40 KB
    ckpt.save(1)
    blob["data"] = torch.zeros(400_000)  # ~1.6 MB: more than the filesystem holds
    with pytest.raises(CheckpointError) as info:
        ckpt.save(2)
    message = str(info.value)
    assert "saving step 2 failed" in message and "checkpoint step 1 is intact" in message
    assert "MiB free" in message
    assert not list(tiny_filesystem.glob("step-*.tmp-*"))  # the partial write was removed
    _, _, again = make(tiny_filesystem)
    again.track("blob", {})
    assert again.restore() == 1
