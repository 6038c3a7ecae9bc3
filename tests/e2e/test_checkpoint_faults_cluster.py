"""Damaged checkpoints, a full disk and a finished job restored at its end, on the real cluster.

Each fault is made for real between or during runs: bytes overwritten in a committed checkpoint, files
truncated, a job root on a small tmpfs that every node mounts. Jobs are 2 nodes x 1 process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpc_train import scontrol
from tests.conftest import write
from tests.e2e.test_requeue_cluster import (
    SCRIPT,
    assert_identical,
    final_params,
    hpc,
    log_text,
    progress,
    state,
    wait_for,
)

pytestmark = pytest.mark.e2e
STEPS = 300
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture
def site(slurm_cluster, tmp_path) -> Path:
    """The sandbox site, aimed at the cluster these tests run (HPC_TRAIN_SANDBOX_DIR may name another
    than the one site_configs/sandbox.yaml's slurm_conf points at). Its torchrun starts the ranks without
    the agent: the checkpoints are the subject here, and the agent's import of torch cost each node of each
    run ~2 s of CPU (the agent's own part in requeues: test_requeue_cluster, test_failures_cluster)."""
    return write(
        tmp_path / "sites" / "fault-sandbox.yaml",
        textwrap.dedent(f"""\
        description: the sandbox cluster of this test session
        extends: sandbox
        slurm_conf: {slurm_cluster.slurm_conf}
        job_root: {slurm_cluster.jobs_dir}
        backends:
          torchrun:
            agent: false
        """),
    )


def submit(
    site: Path, job_root: Path, *extra: str, script: Path = SCRIPT, steps: int = STEPS, script_args: tuple[str, ...] = ()
) -> str:
    out = hpc(
        "submit",
        "--site",
        str(site),
        "--job-root",
        str(job_root),
        "--nodes",
        "2",
        "--procs-per-node",
        "1",
        "--parsable",
        *extra,
        str(script),
        "--",
        "--steps",
        str(steps),
        *script_args,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def controller_state(job: str) -> str:
    return scontrol.show("job", job).get("JobState", "")


def finish(job: str, timeout: float = 400) -> str:
    return wait_for(lambda: (now := state(job)) in FINAL and now, timeout, f"job {job} to end", release=job)


def stop_at(job_root: Path, job: str, step: int) -> None:
    """The scheduler's warning once run 1 has trained past ``step``: every rank saves, rank 0 requeues."""
    wait_for(lambda: progress(job_root, job, 1) >= step, 300, f"job {job}'s run 1 to train")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)


def held_checkpoints(job_root: Path, job: str) -> list[Path]:
    """Once run 1 is over and run 2 not started (Slurm holds a requeued job ~2 minutes and nothing
    here releases it): the committed checkpoints, newest first."""
    wait_for(
        lambda: "requeued job" in log_text(job_root, job) and controller_state(job) == "PENDING", 240, f"job {job} to be requeued"
    )
    folder = job_root / job / "checkpoints"
    return sorted((p for p in folder.glob("step-*") if (p / "COMMIT").is_file()), reverse=True)


def test_bytes_changed_in_the_newest_checkpoint_resume_from_the_one_before(site, sandbox_job_root):
    reference = submit(site, sandbox_job_root, "--no-requeue")
    job = submit(
        site, sandbox_job_root, "--checkpoint-every", "25", "--max-restarts", "3", script_args=("--step-seconds", "0.04")
    )
    stop_at(sandbox_job_root, job, 60)
    newest, previous = held_checkpoints(sandbox_job_root, job)[:2]
    state_file = newest / "hpc_train.pt"
    size = state_file.stat().st_size
    with open(state_file, "r+b") as f:  # 256 bytes in place: the size the commit recorded still matches
        f.seek(size // 2)
        f.write(bytes(256))
    assert state_file.stat().st_size == size
    assert finish(job) == "COMPLETED", log_text(sandbox_job_root, job)[-3000:]
    text = log_text(sandbox_job_root, job)
    assert f"checkpoint {newest} is unreadable (hpc_train.pt digest mismatch" in text
    assert f"run 2: restored step {int(previous.name[5:])} from {previous}" in text
    assert (newest.parent / f"{newest.name}.damaged-2").is_dir()  # set aside, not deleted
    assert finish(reference) == "COMPLETED"
    assert_identical(final_params(sandbox_job_root, reference), final_params(sandbox_job_root, job))


def test_when_no_checkpoint_loads_the_job_fails_unless_it_may_start_over(site, sandbox_job_root):
    jobs = {
        flag: submit(site, sandbox_job_root, "--checkpoint-every", "25", *flag, script_args=("--step-seconds", "0.04"))
        for flag in ((), ("--restart-from-scratch",))
    }
    for job in jobs.values():
        stop_at(sandbox_job_root, job, 60)
    damaged = {}
    for flag, job in jobs.items():
        checkpoints = held_checkpoints(sandbox_job_root, job)
        assert len(checkpoints) == 2  # --keep-checkpoints 2: both are damaged, nothing is left to fall back to
        for path in checkpoints:
            with open(path / "hpc_train.pt", "r+b") as f:
                f.truncate(12)
        damaged[flag] = [int(p.name[5:]) for p in checkpoints]
    failing, fresh = jobs[()], jobs[("--restart-from-scratch",)]
    assert finish(failing) == "FAILED"
    text = log_text(sandbox_job_root, failing)
    newer, older = damaged[()]
    assert f"step {newer}: hpc_train.pt has 12 bytes, the commit recorded" in text, text[-3000:]
    assert f"; step {older}: hpc_train.pt has 12 bytes, the commit recorded" in text
    assert "resubmit with --restart-from-scratch" in text
    assert "starting at step 0" not in text.split("hpc_train: run 2 of job")[1]  # it did not train from 0
    assert finish(fresh) == "COMPLETED", log_text(sandbox_job_root, fresh)[-3000:]
    text = log_text(sandbox_job_root, fresh).split("hpc_train: run 2 of job")[1]
    assert "restart from scratch requested: starting over from step 0" in text
    assert "starting at step 0 of" in text and f"done: {STEPS} steps" in text


FILLER = """\
import argparse
import torch
from torch.utils.data import TensorDataset
import hpc_train.runtime as rt

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
args, _ = parser.parse_known_args()
ctx = rt.init()
torch.manual_seed(0)
x = torch.randn(512, 16)
y = x.sum(1, keepdim=True)
model = torch.nn.Linear(16, 1)
model, optimizer = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
ckpt = ctx.checkpointer()
ckpt.track("ballast", {"data": torch.zeros(1 << 20)})  # 4 MiB a checkpoint: one fits on the disk, two do not
step = ckpt.restore()
for xb, yb in ctx.batches(ctx.loader(TensorDataset(x, y), batch_size=16), start=step, total=args.steps):
    ctx.backward(torch.nn.functional.mse_loss(model(xb), yb))
    ctx.step()
    step += 1
    ckpt.step(step)
ckpt.close()
ctx.print(f"done: {args.steps} steps")
ctx.shutdown()
"""

# open_tree + move_mount: a clone of the host's tmpfs mount put into a node's mount namespace, so the
# host and every node see one filesystem (a mount made on the host now would not reach the nodes:
# their namespaces were copied at start with private propagation)
INJECT = """\
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
source, pid, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tree = libc.syscall(428, -100, source.encode(), 1 | 0o2000000)  # open_tree(AT_FDCWD, OPEN_TREE_CLONE|CLOEXEC)
if tree < 0:
    sys.exit(f"open_tree {source}: {os.strerror(ctypes.get_errno())}")
if libc.setns(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY), 0x00020000) != 0:  # CLONE_NEWNS
    sys.exit(f"setns into pid {pid}: {os.strerror(ctypes.get_errno())}")
if libc.syscall(429, tree, b"", -100, target.encode(), 4) < 0:  # move_mount(..., MOVE_MOUNT_F_EMPTY_PATH)
    sys.exit(f"move_mount onto {target}: {os.strerror(ctypes.get_errno())}")
"""


@pytest.fixture
def small_job_root(slurm_cluster, sandbox_job_root):
    """A 6 MiB tmpfs as the job root, the same filesystem on the host and on every node."""
    mount = sandbox_job_root / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=755", "tmpfs", str(mount)], check=True)
    pids = [int(p.read_text()) for p in sorted((slurm_cluster.sandbox_dir / "run").glob("slurmd-*.pid"))]
    assert pids, "no slurmd pid files in the sandbox"
    try:
        for pid in pids:
            out = subprocess.run([sys.executable, "-c", INJECT, str(mount), str(pid), str(mount)], capture_output=True, text=True)
            assert out.returncode == 0, f"cannot mount the tmpfs inside node (slurmd pid {pid}): {out.stderr}"
        for pid in pids:  # what a node writes the host reads: one filesystem
            subprocess.run(["nsenter", "--target", str(pid), "--mount", "touch", str(mount / f"seen-{pid}")], check=True)
        assert sorted(p.name for p in mount.iterdir()) == sorted(f"seen-{pid}" for pid in pids)
        for p in mount.iterdir():
            p.unlink()
        yield mount
    finally:
        for pid in pids:
            subprocess.run(["nsenter", "--target", str(pid), "--mount", "umount", "-l", str(mount)], check=False)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_once_and_says_so(site, small_job_root, sandbox_job_root):
    script = write(sandbox_job_root / "fill.py", FILLER)
    job = submit(
        site,
        small_job_root,
        "--checkpoint-every",
        "20",
        "--on-failure",
        "requeue",
        "--max-restarts",
        "3",
        "--no-metrics",
        script=script,
        steps=200,
    )
    assert finish(job) == "FAILED", log_text(small_job_root, job)[-3000:]
    text = log_text(small_job_root, job)
    # the rank that ran out names itself: every rank writes its share of the state
    assert re.search(r"saving step 40 failed \(rank \d writing its share\): no space left on device", text), text[-3000:]
    assert "after removing the partial write, the checkpoint needs about 4.0 MiB; checkpoint step 20 is intact" in text
    assert "not requeueing: it would fail the same way" in text
    assert int((small_job_root / job / "runs").read_text()) == 1  # no requeue loop
    assert "no space left on device" in (small_job_root / job / "no_retry").read_text()
    assert [p.name for p in (small_job_root / job / "checkpoints").iterdir()] == ["step-00000020"]
    print("\n" + "\n".join(line for line in text.splitlines() if "no space" in line and "requeue" in line))


def test_a_job_restored_at_its_last_step_finishes(site, sandbox_job_root):
    done = submit(site, sandbox_job_root, "--checkpoint-every", "50", steps=100)
    assert finish(done) == "COMPLETED"
    # its checkpoints given to a job that starts held: its first run restores step 100 of 100
    again = submit(site, sandbox_job_root, "--checkpoint-every", "50", "--sbatch", "hold", steps=100)
    shutil.copytree(sandbox_job_root / done / "checkpoints", sandbox_job_root / again / "checkpoints")
    subprocess.run(["scontrol", "release", again], check=True)
    assert finish(again, timeout=240) == "COMPLETED", log_text(sandbox_job_root, again)[-3000:]
    text = log_text(sandbox_job_root, again)
    assert "restored step 100" in text and "starting at step 100 of 100" in text
    assert "step    20/" not in text and "done: 100 steps" in text  # no step trained, and the loop ended
    assert_identical(final_params(sandbox_job_root, done), final_params(sandbox_job_root, again))
