"""Tensor and pipeline parallel layouts on the real cluster, 2 nodes x 2 processes, against one process.

Two jobs run at once: dp=2 x tp=2, stopped in its first run as a preemption would stop it, requeued
by Slurm and resumed from its sharded checkpoint; and dp=2 x pp=2 with a 1F1B schedule. Meanwhile
the test process trains the same model in one process. Every step's loss must agree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e
SCRIPT = REPO / "examples" / "train_parallel.py"
STEPS, STOP_AT = 12, 6
TOLERANCE = 1e-4  # float reductions in another order; a wrong shard or gradient is off by far more


def submit(job_root: Path, layout: str, *script_args: str) -> subprocess.Popen:
    return subprocess.Popen(
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
            "--parallel",
            layout,
            "-o",
            "agent=false",  # the layouts are the subject: torchrun's ranks without its agent (~2 s of CPU a node)
            "--wait",
            str(SCRIPT),
            "--",
            "--steps",
            str(STEPS),
            *script_args,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen, job_root: Path) -> tuple[str, str, list[dict]]:
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, out + err
    job_id = out.split()[2]
    reports = [json.loads(p.read_text()) for p in sorted((job_root / job_id).glob("rank*.json"))]
    return job_id, (job_root / job_id / f"{job_id}_0_log.out").read_text(), reports


def reference(tmp_path: Path) -> dict[int, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_TRAIN_", "RANK", "WORLD_SIZE", "SLURM_"))}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(tmp_path)],
        cwd=tmp_path,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return {int(k): v for k, v in json.loads((tmp_path / "rank0.json").read_text())["losses"].items()}


def assert_close(losses: dict[int, float], ref: dict[int, float], what: str) -> None:
    assert losses, what
    worst = max(abs(losses[s] - ref[s]) for s in losses)
    assert worst < TOLERANCE, f"{what}: losses differ from the single process by {worst:.2e}: {losses} vs {ref}"


def assert_one_node_each(reports: list[dict], axis: str) -> None:
    """The ranks sharing a coordinate on ``axis`` sit on one node, a different node per coordinate."""
    hosts: dict[int, set[str]] = {}
    for r in reports:
        hosts.setdefault(r[axis], set()).add(r["host"])
    assert sorted(hosts) == [0, 1] and all(len(h) == 1 for h in hosts.values()), hosts
    assert len(set.union(*hosts.values())) == 2, hosts


@pytest.fixture
def single_process(tmp_path: Path) -> dict[int, float]:
    """The same model trained by one process: what every layout must match."""
    ref = reference(tmp_path)
    assert ref[STEPS] < 0.6 * ref[1], ref  # the model learns
    return ref


# the tensor- and pipeline-parallel jobs are two tests (they were one of 62 s): each its own job, beside the others
def test_tp_layout_matches_one_process_and_resumes_after_a_requeue(slurm_cluster, sandbox_job_root, single_process):
    tp_job = submit(sandbox_job_root, "dp=2,tp=2", "--stop-at", str(STOP_AT))
    ref = single_process
    # dp x tp: stopped at STOP_AT in run 1 (saved, requeued by rank 0), resumed in run 2
    job_id, log, reports = finished(tp_job, sandbox_job_root)
    assert int((sandbox_job_root / job_id / "runs").read_text()) == 2, log[-3000:]
    run1_log = log.split("hpc_train: run 2 of job")[0]
    run1 = {int(s): float(v) for s, v in re.findall(r"step +(\d+)/\d+ +loss ([\d.]+)", run1_log)}
    assert sorted(run1) == list(range(1, STOP_AT + 1)), log[-3000:]
    assert_close(run1, {s: round(v, 5) for s, v in ref.items()}, "dp=2 x tp=2, run 1")
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    for r in reports:
        assert r["run"] == 2 and r["start"] == STOP_AT and r["layout"] == "dp=2,tp=2,pp=1"
        assert_close({int(s): v for s, v in r["losses"].items()}, ref, f"dp=2 x tp=2 after the requeue, rank {r['rank']}")
    assert_one_node_each(reports, "dp_rank")  # each tensor-parallel pair on one node
    assert len({r["params"] for r in reports}) == 1 and reports[0]["params"] < 27808  # sharded, not replicated


def test_pp_layout_matches_one_process_with_one_stage_per_node(slurm_cluster, sandbox_job_root, single_process):
    pp_job = submit(sandbox_job_root, "dp=2,pp=2", "--schedule", "1f1b")
    # dp x pp: one stage per node, each with its own layers
    _, _log, reports = finished(pp_job, sandbox_job_root)
    for r in reports:
        assert r["run"] == 1 and r["start"] == 0 and r["layout"] == "dp=2,tp=1,pp=2"
        assert_close({int(s): v for s, v in r["losses"].items()}, single_process, f"dp=2 x pp=2, rank {r['rank']}")
    assert_one_node_each(reports, "stage")
    assert sum({r["stage"]: r["params"] for r in reports}.values()) == 27808  # the stages split the model


def test_invalid_layouts_are_rejected_before_submission(slurm_cluster, sandbox_job_root):
    def submit_now(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "hpc_train",
                "submit",
                "--site",
                "sandbox",
                "--job-root",
                str(sandbox_job_root),
                "--nodes",
                "2",
                "--procs-per-node",
                "2",
                *args,
                str(SCRIPT),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    wrong_size = submit_now("--parallel", "dp=2,tp=4")
    assert wrong_size.returncode == 78, wrong_size.stderr
    assert "dp=2,tp=4,pp=1 is 8 processes, but the job has 4 (2 nodes x 2 per node)" in wrong_size.stderr
    across_nodes = submit_now("--partition", "gpu", "--gpus-per-node", "2", "--parallel", "tp=4")
    assert across_nodes.returncode == 78
    assert "tensor parallel must stay inside a node" in across_nodes.stderr
    typo = submit_now("--parallel", "dp=2,tq=2")
    assert typo.returncode == 78 and "did you mean 'tp'" in typo.stderr
    assert not any(sandbox_job_root.iterdir())  # nothing reached Slurm
