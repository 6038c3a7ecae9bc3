"""MPI and Horovod keep rank 0's full state (no engine of their own): a run of 2 mpirun processes to step S
continues as 1 process with --resume-from, matching the uninterrupted 2-process run at every later step.
DeepSpeed's ZeRO partitions continue at another world size through DeepSpeed's universal checkpoint.

The uninterrupted run saves step S on its way (``--save-at``) and is the checkpoint the others resume from,
read only (a conversion is written to the resuming run's own folder): a run that stopped at S would save
the same step of the same arithmetic, at the cost of one more job of every backend's ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, once_per_run

SCRIPT = REPO / "tests" / "e2e" / "resume_train.py"  # the sandbox test's loop: losses and samples per step
STEPS, STOP = 10, 5


def launch(
    tmp: Path, name: str, backend: str, procs: int, *args: str, resume_from: Path | None = None, **extra: str
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
        "MASTER_PORT": str(free_port()),  # not the default 29500: a process another test left may still hold it
        **extra,
    }
    if resume_from is not None:
        env["HPC_TRAIN_RESUME_FROM"] = str(resume_from)
    command = ["mpirun", "--oversubscribe", "-np", str(procs), sys.executable, str(SCRIPT), "--steps", str(STEPS), *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


def run(
    tmp: Path, name: str, backend: str, procs: int, *args: str, resume_from: Path | None = None, **extra: str
) -> dict[int, dict]:
    out = launch(tmp, name, backend, procs, *args, resume_from=resume_from, **extra)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    return steps_of(tmp / name)


def steps_of(folder: Path) -> dict[int, dict]:
    rows = (folder / "resume_steps.jsonl").read_text().splitlines()
    return {row["step"]: row for row in map(json.loads, rows)}


@pytest.mark.parametrize("backend", ["mpi", "horovod"])
def test_a_2_process_run_continues_as_1_process_with_the_same_samples_and_losses(tmp_path, backend):
    straight = run(tmp_path, "straight", backend, 2, "--batch-size", "8", "--save-at", str(STOP))
    resumed = run(tmp_path, "resumed", backend, 1, "--batch-size", "8", resume_from=tmp_path / "straight" / "checkpoints")
    assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
    same_as(straight, resumed, 1)


def same_as(straight: dict[int, dict], resumed: dict[int, dict], world: int) -> None:
    """Each resumed step read the samples of the uninterrupted run's step, and its loss matches."""
    for step, row in resumed.items():
        assert (row["world_size"], row["per_rank_batch"]) == (world, 16 // world), step  # the global batch of 16 kept
        assert row["samples"] == straight[step]["samples"], step
        assert abs(row["loss"] - straight[step]["loss"]) <= 1e-5 * abs(straight[step]["loss"]) + 1e-7, (step, row)


def render_resume(source: Path, procs: int) -> subprocess.CompletedProcess:
    """The submit-side check, from the shape.json the checkpoint committed (no torch on the login side)."""
    return subprocess.run(
        [sys.executable, "-m", "hpc_train", "render", "--site", "sandbox", "--backend", "deepspeed", "--procs-per-node",
         str(procs), "--resume-from", str(source), str(SCRIPT)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


ADAM = ("--batch-size", "8", "--adam")  # the optimizer state DeepSpeed's universal checkpoint converts


@pytest.fixture(scope="module")
def adam_straight(tmp_path_factory) -> Path:
    """The uninterrupted 2-process DeepSpeed run the Adam tests compare with, which saved step S on its way:
    one for the whole run."""
    folder = once_per_run(
        tmp_path_factory,
        "deepspeed-adam-straight",
        lambda tmp: run(tmp, "straight", "deepspeed", 2, *ADAM, "--save-at", str(STOP)),
    )
    return folder / "straight"


def test_deepspeed_zero_partitions_continue_at_another_world_size_and_back(tmp_path, adam_straight):
    adam, straight = ADAM, steps_of(adam_straight)
    source = adam_straight / "checkpoints"
    assert sorted(p.name for p in source.iterdir()) == [f"step-{STOP:08d}"]
    assert len(list(source.glob("step-*/engine/engine/zero_pp_rank_*_optim_states.pt"))) == 2  # ZeRO-2: partitioned
    render = render_resume(source, 1)
    assert render.returncode == 0, render.stderr
    out = launch(tmp_path, "one", "deepspeed", 1, *adam, "--stop-at", "8", resume_from=source)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "ZeRO partitions of 2 data-parallel ranks loaded into 1 (universal checkpoint)" in out.stderr
    one = {row["step"]: row for row in map(json.loads, (tmp_path / "one" / "resume_steps.jsonl").read_text().splitlines())}
    assert sorted(one) == list(range(STOP + 1, 9))
    same_as(straight, one, 1)
    assert not (tmp_path / "one" / "checkpoints" / "universal.tmp").exists()  # the conversion is removed once loaded
    back = run(tmp_path, "back", "deepspeed", 2, *adam, resume_from=tmp_path / "one" / "checkpoints")
    assert sorted(back) == list(range(9, STEPS + 1))
    same_as(straight, back, 2)


def test_deepspeed_state_the_converter_does_not_know_keeps_its_world_size(tmp_path):
    straight = run(tmp_path, "straight", "deepspeed", 2, "--batch-size", "8", "--save-at", str(STOP))
    source = tmp_path / "straight" / "checkpoints"
    resumed = run(tmp_path, "same", "deepspeed", 2, "--batch-size", "8", resume_from=source)
    assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
    same_as(straight, resumed, 2)
    reason = "cannot be resharded to 1: its ZeRO partitions hold SGD's state (momentum_buffer)"
    refused = launch(tmp_path, "one", "deepspeed", 1, "--batch-size", "8", resume_from=source)
    assert refused.returncode != 0 and reason in refused.stderr, refused.stderr[-3000:]
    assert not (tmp_path / "one" / "resume_steps.jsonl").exists()  # refused before the first step
    render = render_resume(source, 1)
    assert render.returncode == 78 and "--resume-from" in render.stderr and reason in render.stderr, render.stderr


def test_deepspeed_async_saves_commit_the_engine_files_and_resume_as_if_uninterrupted(tmp_path, adam_straight):
    adam, straight = ADAM, steps_of(adam_straight)
    background = {"HPC_TRAIN_ASYNC_CHECKPOINT": "1", "HPC_TRAIN_CHECKPOINT_EVERY": "2", "HPC_TRAIN_KEEP_CHECKPOINTS": "3"}
    run(tmp_path, "first", "deepspeed", 2, *adam, "--stop-at", str(STOP), **background)
    source = tmp_path / "first" / "checkpoints"
    assert sorted(p.name for p in source.iterdir()) == [f"step-{s:08d}" for s in (2, 4, 5)]  # every save committed
    commit = json.loads((source / f"step-{STOP:08d}" / "COMMIT").read_text())
    engine = {name for name in commit["files"] if name.startswith("engine/engine/")}
    assert {f"engine/engine/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= engine, commit
    assert all(commit["files"][name] > 0 and commit["digests"][name] for name in engine)
    resumed = run(tmp_path, "resumed", "deepspeed", 2, *adam, resume_from=source, **background)
    assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
    same_as(straight, resumed, 2)
