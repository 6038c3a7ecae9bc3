"""MPI and Horovod keep rank 0's full state (no engine of their own): a run of 2 mpirun processes to step S
continues as 1 process with --resume-from, matching the uninterrupted 2-process run at every later step.
DeepSpeed's engine state continues at the world size that saved it, and is refused at another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "tests" / "e2e" / "resume_train.py"  # the sandbox test's loop: losses and samples per step
STEPS, STOP = 10, 5


def launch(
    tmp: Path, name: str, backend: str, procs: int, *args: str, resume_from: Path | None = None
) -> subprocess.CompletedProcess:
    folder = tmp / name
    folder.mkdir()
    env = {
        **os.environ,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMP_NUM_THREADS": "1",
        "HPC_TRAIN_BACKEND": backend,
        "HPC_TRAIN_METRICS": "0",
        "HPC_TRAIN_JOB_FOLDER": str(folder),
        "HPC_TRAIN_CHECKPOINT_DIR": str(folder / "checkpoints"),
    }
    if resume_from is not None:
        env["HPC_TRAIN_RESUME_FROM"] = str(resume_from)
    command = ["mpirun", "--oversubscribe", "-np", str(procs), sys.executable, str(SCRIPT), "--steps", str(STEPS), *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


def run(tmp: Path, name: str, backend: str, procs: int, *args: str, resume_from: Path | None = None) -> dict[int, dict]:
    out = launch(tmp, name, backend, procs, *args, resume_from=resume_from)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    rows = (tmp / name / "resume_steps.jsonl").read_text().splitlines()
    return {row["step"]: row for row in map(json.loads, rows)}


@pytest.mark.parametrize("backend", ["mpi", "horovod"])
def test_a_2_process_run_continues_as_1_process_with_the_same_samples_and_losses(tmp_path, backend):
    straight = run(tmp_path, "straight", backend, 2, "--batch-size", "8")
    run(tmp_path, "first", backend, 2, "--batch-size", "8", "--stop-at", str(STOP))
    resumed = run(tmp_path, "resumed", backend, 1, "--batch-size", "8", resume_from=tmp_path / "first" / "checkpoints")
    assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
    for step, row in resumed.items():
        assert (row["world_size"], row["per_rank_batch"]) == (1, 16)  # the global batch of 16 kept
        assert row["samples"] == straight[step]["samples"], step
        assert abs(row["loss"] - straight[step]["loss"]) <= 1e-5 * abs(straight[step]["loss"]) + 1e-7, (step, row)


def test_deepspeed_resumes_at_its_own_world_size_and_refuses_another_before_loading(tmp_path):
    straight = run(tmp_path, "straight", "deepspeed", 2, "--batch-size", "8")
    run(tmp_path, "first", "deepspeed", 2, "--batch-size", "8", "--stop-at", str(STOP))
    source = tmp_path / "first" / "checkpoints"
    resumed = run(tmp_path, "same", "deepspeed", 2, "--batch-size", "8", resume_from=source)
    assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
    for step, row in resumed.items():
        assert row["samples"] == straight[step]["samples"], step
        assert abs(row["loss"] - straight[step]["loss"]) <= 1e-5 * abs(straight[step]["loss"]) + 1e-7, (step, row)
    refused = launch(tmp_path, "one", "deepspeed", 1, "--batch-size", "8", resume_from=source)
    assert refused.returncode != 0
    assert "cannot be resharded to 1: DeepSpeed's engine checkpoint is partitioned per rank (ZeRO)" in refused.stderr
    assert not (tmp_path / "one" / "resume_steps.jsonl").exists()  # refused before the first step
    # and before submission, from the shape.json the checkpoint committed (no torch on the login side)
    render = subprocess.run(
        [sys.executable, "-m", "hpc_train", "render", "--site", "sandbox", "--backend", "deepspeed", "--procs-per-node", "1",
         "--resume-from", str(source), str(SCRIPT)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert render.returncode == 78 and "--resume-from" in render.stderr and "cannot be resharded" in render.stderr, render.stderr
