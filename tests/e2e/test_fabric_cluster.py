"""Fabric on the real sandbox: preflight measures gloo all-reduce across 2 nodes (and proves the NCCL
profile reached every task's environment); doctor --submit reports from each compute node."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpc_train.config.models import Preflight
from hpc_train.fabric.preflight import evaluate
from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout, check=False
    )


def test_preflight_two_nodes_with_a_profile_and_the_debug_overlay(slurm_cluster, sandbox_job_root):
    out = cli(
        "preflight",
        "--site",
        "sandbox",
        "--nodes",
        "2",
        "--nccl-profile",
        "sandbox-tcp",
        "--nccl-debug",
        "--job-root",
        str(sandbox_job_root),
        "--json",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    result = data["result"]
    assert data["passed"] is True and result["backend"] == "gloo"
    assert len(set(result["nodes"])) == 2 == len(result["nodes"]) and result["world_size"] == 2
    assert [row["bytes"] for row in result["sizes"]] == [1 << 20, 4 << 20, 16 << 20]  # the sandbox's max_size 16M
    assert all(row["busbw_gbs"] > 0 and row["time_us"] > 0 for row in result["sizes"])
    for row in result["sizes"]:  # n = 2: busbw = algbw * 2(n-1)/n = algbw
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"])
    [pair] = result["pairs"]
    assert pair["nodes"] == result["nodes"] and pair["busbw_gbs"] > 0
    assert any("pair check: 1 pair(s) ok" in line for line in data["findings"])

    # the verdict follows the figure: the same real result fails against an InfiniBand-class bar
    assert evaluate(result, Preflight(busbw_gbs=0.001)).passed
    assert not evaluate(result, Preflight(busbw_gbs=1000.0)).passed
    assert not evaluate(result, Preflight(busbw_gbs=0.001, pair_busbw_gbs=1000.0)).passed

    # the profile (sandbox-tcp, extending safe) and the debug overlay reached every task on both nodes
    ranks = result["ranks"]
    assert sorted(r["host"] for r in ranks) == sorted(result["nodes"])
    for r in ranks:
        env = r["env"]
        assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_DISABLE"] == "1"  # sandbox-tcp
        assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "600"  # inherited from safe
        assert env["NCCL_DEBUG"] == "INFO" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"  # the debug overlay
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"  # the site's env
    script = next((sandbox_job_root / data["job_id"]).glob("*submission.sh")).read_text()
    assert "export NCCL_SOCKET_IFNAME=eth0  # nccl profile sandbox-tcp" in script
    assert "export TORCH_NCCL_ENABLE_MONITORING=1  # nccl profile sandbox-tcp (from safe)" in script
    assert "export NCCL_DEBUG=INFO  # nccl overlay debug" in script


def test_doctor_submit_reports_from_each_compute_node(slurm_cluster, sandbox_job_root):
    out = cli("doctor", "--site", "sandbox", "--submit", "--nodes", "2", "--job-root", str(sandbox_job_root), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    reports = json.loads(out.stdout)
    assert len({r["host"] for r in reports}) == 2 == len(reports)
    for report in reports:
        assert report["context"].startswith("compute node (job ")
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["gpus"]["summary"].startswith("no GPU on this machine")
        assert checks["slurm"]["status"] == "ok" and "cpu: up" in " ".join(checks["slurm"]["details"])
        assert checks["interface GLOO_SOCKET_IFNAME"]["status"] == "ok"  # eth0 inside the node's namespace
        assert report["status"] == "ok"
