"""Self-tests of the Slurm sandbox: three nodes (two for a job, one spare), accounting, shared job folders."""

import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
NODES = {"n1", "n2", "n3"}


def test_srun_spans_every_node(slurm_cluster):
    out = slurm_cluster.run(["srun", "-N3", "-n3", "hostname"], timeout=60).stdout
    assert set(out.split()) == NODES


def test_sbatch_job_completes_in_sacct(slurm_cluster, sandbox_job_root):
    job_id = slurm_cluster.run(
        [
            "sbatch",
            "--parsable",
            "--chdir",
            str(sandbox_job_root),
            "--output",
            str(sandbox_job_root / "slurm-%j.out"),
            "--wrap",
            "hostname",
        ]
    ).stdout.strip()
    job_id = job_id.split(";")[0]
    assert job_id.isdigit(), job_id
    deadline = time.monotonic() + 30
    state = ""
    while time.monotonic() < deadline:
        out = slurm_cluster.run(["sacct", "-o", "JobID,State,NodeList", "--parsable2", "-n", "-j", job_id], check=False).stdout
        rows = [line.split("|") for line in out.splitlines() if line]
        state = next((r[1] for r in rows if r[0] == job_id), "")
        if state == "COMPLETED":
            break
        time.sleep(0.3)
    assert state == "COMPLETED", f"sacct state of job {job_id}: {state!r}"
    out_file = sandbox_job_root / f"slurm-{job_id}.out"
    assert out_file.read_text().strip() in NODES


def test_job_root_shared_and_python_runs_on_nodes(slurm_cluster, sandbox_job_root):
    # every node writes into the job root with this interpreter; the host must see every file
    code = f"import os, socket; open(os.path.join({str(sandbox_job_root)!r}, socket.gethostname()), 'w').write('ok')"
    slurm_cluster.run(["srun", "-N3", "-n3", sys.executable, "-c", code], timeout=60)
    assert {p.name for p in Path(sandbox_job_root).iterdir()} == NODES


def test_fake_gpus_in_gpu_partition(slurm_cluster):
    out = slurm_cluster.run(["srun", "-p", "gpu", "-N1", "--gres=gpu:2", "printenv", "CUDA_VISIBLE_DEVICES"], timeout=60).stdout
    assert out.strip() == "0,1"


def test_srun_pmix_across_nodes(slurm_cluster):
    code = "import os, socket; print(socket.gethostname(), os.environ['PMIX_RANK'])"
    out = slurm_cluster.run(["srun", "-N2", "-n2", "--mpi=pmix", sys.executable, "-c", code], timeout=60).stdout
    # whichever two nodes are free (the suite's other workers share the cluster): one rank on each, ranks
    # numbered in the allocation's node order
    placed = sorted(line.split() for line in out.splitlines() if line)
    hosts = {host for host, _ in placed}
    assert len(placed) == len(hosts) == 2 and hosts < NODES, out
    assert [rank for _, rank in placed] == ["0", "1"], out
