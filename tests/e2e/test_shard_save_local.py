"""Sharded async saves through a real submission on the `local` site: what the sandbox test checks with
Slurm (tests/e2e/test_shard_save_cluster.py), minus the requeue, which needs Slurm."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from hpc_train.runtime import shard_save
from hpc_train.runtime.checkpoint import COMMIT, STATE_FILE
from tests.conftest import REPO
from tests.unit.test_checkpoint import make

EXAMPLE = REPO / "examples" / "train_resumable.py"


def test_a_local_two_rank_job_commits_async_shards_that_load(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "local",
            "--procs-per-node",
            "2",
            "--job-root",
            str(tmp_path),
            "--async-checkpoint",
            "--checkpoint-every",
            "10",
            "--wait",
            str(EXAMPLE),
            "--",
            "--steps",
            "40",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job = tmp_path / out.stdout.split()[2]
    folder = job / "checkpoints" / "step-00000040"
    files = json.loads((folder / COMMIT).read_text())["files"]
    assert set(files) == {STATE_FILE, shard_save.shard_name(0), shard_save.shard_name(1)}  # each rank wrote one
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["step-00000030", "step-00000040"]
    _, _, ckpt = make(job / "checkpoints")
    assert ckpt.verify(folder) is None  # every shard's size and digest as committed
    payload = shard_save.assemble(torch.load(folder / STATE_FILE, weights_only=True), folder)
    final = torch.load(job / "final.pt", weights_only=True)
    saved = payload["runtime"]["model"]
    assert saved.keys() == final.keys() and all(torch.equal(saved[k], final[k]) for k in final)
