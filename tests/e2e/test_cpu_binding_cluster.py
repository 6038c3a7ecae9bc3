"""A job asks Slurm for the CPUs its processes use, and gets them where tasks are bound.

The sandbox itself does not bind tasks (its nodes are shared by the tests' jobs), so this module starts
a small twin that does: 2 nodes of 2 CPUs (the host's 2 cores: real CPU ids), TaskPlugin=task/affinity.
With Slurm's default of one CPU per task, a torchrun task's two workers would share CPU 0 and an MPI rank
that may use the whole node would get one core; every process here records ``os.sched_getaffinity(0)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_train import scontrol
from tests.cluster.harness import SandboxCluster
from tests.conftest import REPO

# serial: its own binding sandbox lost a pid file while four workers ran beside it (make test runs these after the parallel part)
pytestmark = [pytest.mark.e2e, pytest.mark.serial]
PROBE = REPO / "tests" / "e2e" / "affinity_probe.py"
HOST_CPUS = sorted(os.sched_getaffinity(0))[:2]
KNOBS = {
    "HPC_TRAIN_SANDBOX_NET": "10.78.0",
    "HPC_TRAIN_SANDBOX_PREFIX": "htb",
    "HPC_TRAIN_SANDBOX_PORT": "16917",
    "HPC_TRAIN_SANDBOX_ACCOUNTING": "0",
    "HPC_TRAIN_SANDBOX_NODES": "2",
    "HPC_TRAIN_SANDBOX_CPUS": str(len(HOST_CPUS)),
    "HPC_TRAIN_SANDBOX_GPUS": "0",
    "HPC_TRAIN_SANDBOX_TASK_PLUGIN": "task/affinity",
}


@pytest.fixture(scope="module")
def binding_cluster(tmp_path_factory):
    assert len(HOST_CPUS) == 2, f"the binding twin wants 2 host CPUs, this machine has {HOST_CPUS}"
    cluster = SandboxCluster("/tmp/hpc_train-bind", extra_env=KNOBS)
    # a twin already up is reused and left up (HPC_TRAIN_SANDBOX_KEEP=1); one started here is taken down
    # here, KEEP or not: make test keeps only the sandbox it brings down itself
    reused = os.environ.get("HPC_TRAIN_SANDBOX_KEEP") == "1" and cluster.is_up()
    if not reused:
        cluster.up()
    sites = tmp_path_factory.mktemp("sites")
    (sites / "bind.yaml").write_text(
        f"""description: the sandbox's twin that binds tasks to CPUs
extends: sandbox
slurm_conf: {cluster.slurm_conf}
job_root: {cluster.jobs_dir}
partitions:
  cpu:
    gpus_per_node: 0
    cpus_per_node: 2
    cpu_bind: cores
    max_nodes: 2
"""
    )
    try:
        yield cluster, sites
    finally:
        if not reused:
            cluster.down()


def submit(cluster: SandboxCluster, sites: Path, root: Path, backend: str, procs: int, *extra: str) -> Path:
    env = {**os.environ, "HPC_TRAIN_SITE_PATH": str(sites), **cluster.env()}
    args = ["submit", "--site", "bind", "--job-root", str(root), "--backend", backend, "--nodes", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", *args, "--procs-per-node", str(procs), *extra, "--parsable", str(PROBE)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job = out.stdout.strip()
    deadline = time.time() + 240
    while time.time() < deadline:
        state = scontrol.first(cluster.run(["scontrol", "show", "job", "-o", job], check=False).stdout).get("JobState", "")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        time.sleep(1)
    folder = root / job
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(folder.glob("*_log.*")))
    assert state == "COMPLETED", f"job {job} ended {state}\n{logs}"
    return folder


def records(folder: Path, world: int) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((folder / "affinity").glob("rank-*.json"))]
    assert sorted(r["rank"] for r in found) == list(range(world)), found
    return found


def by_host(found: list[dict]) -> dict[str, list[dict]]:
    hosts: dict[str, list[dict]] = {}
    for record in found:
        hosts.setdefault(record["host"], []).append(record)
    assert sorted(hosts) == ["n1", "n2"], hosts
    return hosts


@pytest.mark.parametrize(("backend", "procs"), [("mpi", 1), ("deepspeed", 1), ("horovod", 2)])
def test_one_task_per_process_gets_its_share_of_the_node(binding_cluster, tmp_path, backend, procs):
    cluster, sites = binding_cluster
    root = Path(cluster.jobs_dir) / tmp_path.name
    root.mkdir(parents=True, exist_ok=True)
    found = records(submit(cluster, sites, root, backend, procs), 2 * procs)
    share = 2 // procs  # cpus_per_node / tasks per node
    for ranks in by_host(found).values():
        cpus = [set(r["cpus"]) for r in ranks]
        assert all(len(c) == share for c in cpus), ranks  # Slurm's default would be one CPU each
        assert set().union(*cpus) <= set(HOST_CPUS) and sum(map(len, cpus)) == len(set().union(*cpus)), ranks  # disjoint
        assert all(r["slurm_cpus_per_task"] == str(share) for r in ranks), ranks
        assert all(r["omp_num_threads"] == str(share) and r["torch_threads"] == share for r in ranks), ranks


def test_torchrun_workers_share_the_cpus_of_their_task(binding_cluster, tmp_path):
    cluster, sites = binding_cluster
    root = Path(cluster.jobs_dir) / tmp_path.name
    root.mkdir(parents=True, exist_ok=True)
    found = records(submit(cluster, sites, root, "torchrun", 2), 4)
    for ranks in by_host(found).values():
        # one task per node holding both CPUs (not Slurm's one), its two workers one thread each
        assert all(r["cpus"] == HOST_CPUS and r["slurm_cpus_per_task"] == "2" for r in ranks), ranks
        assert all(r["omp_num_threads"] == "1" and r["torch_threads"] == 1 for r in ranks), ranks
        assert sorted(r["local_rank"] for r in ranks) == [0, 1]


def test_a_smaller_request_is_what_the_task_gets(binding_cluster, tmp_path):
    cluster, sites = binding_cluster
    root = Path(cluster.jobs_dir) / tmp_path.name
    root.mkdir(parents=True, exist_ok=True)
    found = records(submit(cluster, sites, root, "torchrun", 2, "--cpus-per-task", "1"), 4)
    for ranks in by_host(found).values():
        assert len({tuple(r["cpus"]) for r in ranks}) == 1 and len(ranks[0]["cpus"]) == 1, ranks
        assert all(r["slurm_cpus_per_task"] == "1" and r["omp_num_threads"] == "1" for r in ranks), ranks
