"""Each backend, 2 nodes x 2 processes on the real sandbox cluster, one training script for all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e
EXAMPLES = REPO / "examples"


def run_job(job_root: Path, *args: str) -> tuple[str, list[dict]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "sandbox",
            "--job-root",
            str(job_root),
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--wait",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split()[2]
    reports = [json.loads(p.read_text()) for p in sorted((job_root / job_id).glob("rank*.json"))]
    return job_id, reports


def assert_trained_together(reports: list[dict], backend: str) -> None:
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert {r["world_size"] for r in reports} == {4}
    hosts = sorted(r["host"] for r in reports)  # 2 nodes x 2 processes, on any two of the sandbox's nodes
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    if "allreduce_sum" in reports[0]:
        assert {r["allreduce_sum"] for r in reports} == {10.0}
    assert all(r["final_loss"] < 1.0 and r["final_loss"] < r["first_loss"] / 5 for r in reports), reports
    assert len({round(r["param_checksum"], 9) for r in reports}) == 1, f"{backend}: replicas differ"


@pytest.mark.parametrize("backend", ["torchrun", "deepspeed", "horovod", "mpi"])
def test_same_script_trains_under_every_backend_and_sees_exactly_its_arguments(slurm_cluster, sandbox_job_root, backend):
    # a user's own --local_rank=0 and a word with a space are theirs: both arrive as given, and under
    # deepspeed the launch's --local_rank=N (for scripts written for DeepSpeed's launcher) is taken off again
    given = ["--steps", "40", "--local_rank=0", "two words"]
    _, reports = run_job(sandbox_job_root, "--backend", backend, str(EXAMPLES / "train.py"), "--", *given)
    assert_trained_together(reports, backend)
    assert {r["backend"] for r in reports} == {backend}
    assert {r["launcher"] for r in reports} == {"torchrun" if backend == "torchrun" else "srun"}
    assert all(r["argv"] == given for r in reports), [r["argv"] for r in reports]


def test_training_options_from_the_job(slurm_cluster, sandbox_job_root):
    _, reports = run_job(
        sandbox_job_root,
        "--backend",
        "torchrun",
        "--precision",
        "bf16",
        "--grad-accum",
        "2",
        "--grad-clip",
        "5.0",
        "--comm-hook",
        "fp16",
        str(EXAMPLES / "train.py"),
        "--",
        "--steps",
        "60",
    )
    assert_trained_together(reports, "torchrun+bf16")


def test_deepspeed_launcher_script_runs_unchanged(slurm_cluster, sandbox_job_root):
    job_id, reports = run_job(
        sandbox_job_root,
        "--backend",
        "deepspeed",
        str(EXAMPLES / "train_deepspeed.py"),
        "--",
        "--deepspeed",
        "--deepspeed_config",
        str(EXAMPLES / "ds_config.json"),
    )
    assert_trained_together(reports, "deepspeed launcher script")
    assert sorted(r["local_rank_arg"] for r in reports) == [0, 0, 1, 1]  # --local_rank as the launcher passes it
    merged = json.loads((sandbox_job_root / job_id / "ds_config.json").read_text())
    assert {r["config"] for r in reports} == {str(sandbox_job_root / job_id / "ds_config.json")}
    assert merged["optimizer"]["type"] == "SGD" and merged["zero_optimization"]["stage"] == 1  # the user's file
    assert merged["gradient_clipping"] == 0.0  # hpc_train's default under it
    assert not list(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*"))  # cleaned up on exit
