"""End to end on the real Slurm sandbox: hpc_train submits, Slurm runs, we assert on what happened."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, write

pytestmark = pytest.mark.e2e
EXAMPLE = REPO / "examples" / "train_ddp.py"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def submit(job_root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli("submit", "--site", "sandbox", "--job-root", str(job_root), *args, timeout=timeout)


def job_id_of(out: subprocess.CompletedProcess) -> str:
    first = out.stdout.splitlines()[0]
    assert first.startswith("Submitted job "), out.stdout + out.stderr
    return first.split()[2]


def test_two_node_torchrun_ddp_trains_and_agrees(slurm_cluster, sandbox_job_root):
    out = submit(
        sandbox_job_root,
        "--backend",
        "torchrun",
        "--nodes",
        "2",
        "--procs-per-node",
        "2",
        "--wait",
        str(EXAMPLE),
        "--",
        "--steps",
        "40",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = job_id_of(out)
    assert f"{sandbox_job_root / job_id / (job_id + '_0_log.out')}" in out.stdout
    assert "COMPLETED (exit 0)" in out.stderr

    reports = [json.loads(p.read_text()) for p in sorted((sandbox_job_root / job_id).glob("rank*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert {r["world_size"] for r in reports} == {4}
    hosts = {r["host"] for r in reports}
    per_host = sorted(r["host"] for r in reports)  # one torchrun per node, two workers each
    assert len(hosts) == 2 and per_host.count(per_host[0]) == 2, per_host
    assert {r["allreduce_sum"] for r in reports} == {10.0}  # 1+2+3+4 across both nodes over gloo
    assert all(r["final_loss"] < 0.5 * r["first_loss"] for r in reports)
    assert len({round(r["param_checksum"], 9) for r in reports}) == 1  # DDP replicas identical

    logs = cli("logs", job_id)
    assert logs.returncode == 0 and "world size 4; all-reduce of ranks 1..4 = 10" in logs.stdout
    rank3_host = next(r["host"] for r in reports if r["rank"] == 3)
    rank3 = cli("logs", job_id, "--rank", "3")
    assert f"rank 3/4 on {rank3_host}" in rank3.stdout
    status = cli("status", job_id, "--json")
    data = json.loads(status.stdout)
    assert data["state"] == "COMPLETED" and re.fullmatch(r"n\[\d[-,]\d\]", data["node_list"]), data


def test_function_job_returns_its_result(slurm_cluster, sandbox_job_root):
    import cloudpickle

    import hpc_train
    from tests.e2e import jobs

    cloudpickle.register_pickle_by_value(jobs)
    try:
        handle = hpc_train.submit(jobs.where_am_i, "hello", site="sandbox", nodes=2, job_root=str(sandbox_job_root))
        result = handle.result()
    finally:
        cloudpickle.unregister_pickle_by_value(jobs)
    assert result["tag"] == "hello" and result["SLURM_PROCID"] == "0"
    assert result["SLURM_NTASKS"] == "2" and result["SLURM_JOB_NUM_NODES"] == "2"
    assert re.fullmatch(r"n\d", result["MASTER_ADDR"]) and result["HPC_TRAIN_SITE"] == "sandbox"
    assert handle.wait(timeout_s=120) == "COMPLETED"  # task 0's result can land before the job ends
    assert hpc_train.job(handle.job_id).record.kind == "function"


def test_failing_script_fails_the_wait(slurm_cluster, sandbox_job_root, tmp_path):
    script = write(tmp_path / "fail.py", "import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    out = submit(sandbox_job_root, "--nodes", "2", "--wait", str(script))
    assert out.returncode != 0
    job_id = job_id_of(out)
    assert "FAILED" in out.stderr
    assert "about to fail" in cli("logs", job_id).stdout


def test_parsable_follow_and_cancel(slurm_cluster, sandbox_job_root, tmp_path):
    script = write(
        tmp_path / "slow.py", "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.5)\n"
    )
    out = submit(sandbox_job_root, "--parsable", str(script))
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    assert job_id.isdigit() and out.stdout == f"{job_id}\n"  # only the id, like sbatch --parsable
    log = sandbox_job_root / job_id / f"{job_id}_0_log.out"
    deadline = time.time() + 60
    while time.time() < deadline and "tick 2" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    assert "tick 2" in log.read_text()
    follower = subprocess.Popen(
        [sys.executable, "-m", "hpc_train", "logs", job_id, "--follow"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    time.sleep(2)
    assert cli("cancel", job_id).returncode == 0
    followed, _ = follower.communicate(timeout=60)  # --follow returns once the job has ended
    assert "tick 0" in followed
    assert json.loads(cli("status", job_id, "--json").stdout)["state"] == "CANCELLED"


def test_gpu_partition_gres_reaches_the_tasks(slurm_cluster, sandbox_job_root, tmp_path):
    script = write(tmp_path / "gpus.py", "import os\nprint('CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''), flush=True)\n")
    out = submit(sandbox_job_root, "--partition", "gpu", "--gpus-per-node", "2", "--wait", str(script))
    assert out.returncode == 0, out.stdout + out.stderr
    text = cli("logs", job_id_of(out)).stdout
    assert text.count("CVD=0,1") == 2  # two workers, one per GPU, both see the allocated devices


def test_scheduler_rejection_is_reported_with_its_stderr(slurm_cluster, sandbox_job_root):
    out = submit(sandbox_job_root, "--sbatch", "nodelist=n9", str(EXAMPLE))
    assert out.returncode == 69
    assert "Traceback" not in out.stderr
    assert "sbatch" in out.stderr and "node" in out.stderr.lower()
