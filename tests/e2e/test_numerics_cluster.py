"""Bad numerics on the sandbox: a NaN on one rank of a 2-node job is skipped on every rank (torchrun and
mpi), recorded and reported; NaN from some step on stops the run with --max-bad-steps, and --on-failure
requeue does not requeue it. (The same paths run on the local site in tests/unit/test_numerics.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from hpc_train import contract
from tests.conftest import REPO
from tests.e2e.test_requeue_cluster import hpc, log_text, no_agent, state

pytestmark = pytest.mark.e2e
SCRIPT = REPO / "tests" / "e2e" / "nan_train.py"
STEPS = 40


def submit(job_root: Path, backend: str, *extra: str, script_args: tuple[str, ...] = ()) -> str:
    out = hpc(
        "submit",
        "--site",
        "sandbox",
        "--job-root",
        str(job_root),
        "--backend",
        backend,
        *no_agent(backend),  # the numerics are the subject, not torchrun's agent
        "--nodes",
        "2",
        "--procs-per-node",
        "1",
        "--parsable",
        *extra,
        str(SCRIPT),
        "--",
        "--steps",
        str(STEPS),
        *script_args,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def wait_done(job_id: str, timeout: float = 300) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        current = state(job_id)
        if current in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return current
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not end within {timeout} s")


def params(job_root: Path, job_id: str, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(job_root / job_id / f"final-rank{rank}.pt", weights_only=True)


@pytest.mark.parametrize("backend", ["torchrun", "mpi"])
def test_a_nan_on_one_rank_is_skipped_on_every_rank_across_nodes(slurm_cluster, sandbox_job_root, backend):
    job_id = submit(sandbox_job_root, backend, script_args=("--nan-rank", "1", "--nan-steps", "7"))
    assert wait_done(job_id) == "COMPLETED", log_text(sandbox_job_root, job_id)[-3000:]
    ranks = [params(sandbox_job_root, job_id, r) for r in (0, 1)]
    for key in ranks[0]:
        assert torch.isfinite(ranks[0][key]).all() and torch.equal(ranks[0][key], ranks[1][key]), key
    lines = [json.loads(x) for x in (sandbox_job_root / job_id / "metrics" / contract.STEPS).read_text().splitlines()]
    bad = [e for e in lines if e.get("event") == "bad_step"]
    assert [(e["step"], e["ranks"], e["action"]) for e in bad] == [(8, [1], "skipped")]
    rows = [r for r in lines if "event" not in r]
    assert len(rows) == STEPS and sum(1 for r in rows if r.get("nonfinite")) == 1
    assert all(r["grad_norm"] > 0 for r in rows if not r.get("nonfinite"))
    summary = hpc("report", job_id, "--no-plots")
    assert summary.returncode == 0, summary.stderr
    assert "bad steps       1 skipped for a non-finite loss or gradient (steps 8)" in summary.stdout
    assert "step 8 (run 1): loss not finite on rank 1; skipped" in summary.stdout
    assert "hpc_train numerics: step 8 skipped on every rank: non-finite loss on rank 1" in log_text(sandbox_job_root, job_id)


def test_a_diverging_run_stops_and_is_not_requeued(slurm_cluster, sandbox_job_root):
    nan_steps = ",".join(str(s) for s in range(10, STEPS))
    job_id = submit(
        sandbox_job_root,
        "torchrun",
        "--max-bad-steps",
        "3",
        "--on-failure",
        "requeue",
        "--max-restarts",
        "3",
        script_args=("--nan-rank", "0", "--nan-steps", nan_steps),
    )
    assert wait_done(job_id) == "FAILED"
    folder = sandbox_job_root / job_id
    message = "training diverged: 3 optimizer step(s) in a row had a non-finite loss or gradient (steps 11-13)"
    assert message in (folder / contract.NO_RETRY).read_text()
    assert (folder / contract.RUNS).read_text().strip() == "1"  # no second run
    text = log_text(sandbox_job_root, job_id)
    assert "not requeueing: it would fail the same way" in text and "DivergenceError" in text
    status = hpc("status", job_id)
    assert message in status.stdout + status.stderr
