"""--micro-batch on the sandbox: a too-big micro-batch runs out of memory for real on 2 nodes x 2
processes, every rank halves it together and the job completes; auto under MPI; DeepSpeed refused.

The ranks run under the address-space limit the job script sets (TEST_MEMORY_BUDGET_MB, as in
tests/unit/test_memory.py), so the allocator's own error is what the runtime catches.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.e2e.test_requeue_cluster import no_agent
from tests.unit.test_memory import BUDGET_MB, SCRIPT

pytestmark = pytest.mark.e2e


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def submit(job_root, script, backend: str, micro_batch: str, procs: int = 2) -> tuple[str, subprocess.CompletedProcess]:
    out = cli(
        "submit", "--site", "sandbox", "--job-root", str(job_root), "--backend", backend, *no_agent(backend),
        "--nodes", "2", "--procs-per-node", str(procs), "--micro-batch", micro_batch,
        "-e", f"TEST_MEMORY_BUDGET_MB={BUDGET_MB}", "-e", "MALLOC_ARENA_MAX=2", "-e", "OMP_NUM_THREADS=1",
        "--wait", str(script),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split()[2], out


def job_lines(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics" / "steps.jsonl").read_text().splitlines()]


def test_an_oom_step_is_redone_with_half_on_every_rank_of_two_nodes(slurm_cluster, sandbox_job_root, tmp_path):
    script = sandbox_job_root / "memory_job.py"  # on the shared job root: every node reads it
    script.write_text(SCRIPT)
    job_id, out = submit(sandbox_job_root, script, "torchrun", "2048")
    assert f"job {job_id}: COMPLETED" in out.stderr
    folder = sandbox_job_root / job_id
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(4)]
    assert {r["steps"] for r in ranks} == {4} and len({r["checksum"] for r in ranks}) == 1  # in step
    assert len({r["micro_batch"] for r in ranks}) == 1 and ranks[0]["micro_batch"] < 2048  # agreed, halved
    lines = job_lines(folder)
    changes = [line for line in lines if line.get("event") == "micro_batch"]
    assert any(c["reason"] == "out of memory with 2048" for c in changes)
    end = [line for line in lines if line.get("event") == "run_end"][-1]
    assert len(end["peak_bytes"]) == 4 and all(p > 0 for p in end["peak_bytes"])
    log = "".join(p.read_text(errors="replace") for p in folder.glob("*_log.*"))
    assert "DefaultCPUAllocator: can't allocate memory" in log and "out of memory with 2048" in log
    report = cli("report", str(folder))
    assert report.returncode == 0, report.stderr
    assert "peak memory" in report.stdout and "(rank 3)" in report.stdout
    assert f"micro-batch     {ranks[0]['micro_batch']} of 2048" in report.stdout


def test_auto_under_mpi_chooses_and_trains(slurm_cluster, sandbox_job_root):
    script = sandbox_job_root / "memory_job.py"
    script.write_text(SCRIPT)
    job_id, _ = submit(sandbox_job_root, script, "mpi", "auto", procs=1)  # one rank a node: the search is each rank's
    lines = job_lines(sandbox_job_root / job_id)
    chosen = next(line for line in lines if line.get("event") == "micro_batch")
    assert chosen["reason"] == "auto" and 1 <= chosen["micro_batch"] < 2048
    assert [line for line in lines if line.get("event") == "run_end"][-1]["step"] == 4


def test_deepspeed_refuses_micro_batch_before_submission(sandbox_job_root):
    out = cli(
        "submit", "--site", "sandbox", "--backend", "deepspeed", "--micro-batch", "auto", str(REPO / "examples" / "train.py")
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "backend 'deepspeed' cannot change the micro-batch as it runs" in out.stderr
