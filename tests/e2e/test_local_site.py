"""The `local` site: the same plan runs on this machine through submitit's local executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "train_ddp.py"


def test_local_ddp_job_runs_to_completion(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "local",
            "--procs-per-node",
            "2",
            "--job-root",
            str(tmp_path),
            "--follow",
            str(EXAMPLE),
            "--",
            "--steps",
            "30",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step   30/30" in out.stdout  # --follow streamed the progress
    job_id = out.stdout.split()[2]
    reports = [json.loads(p.read_text()) for p in (tmp_path / job_id).glob("rank*.json")]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert {r["allreduce_sum"] for r in reports} == {3.0}
    assert len({round(r["param_checksum"], 9) for r in reports}) == 1


def _square(x: int) -> int:
    return x * x


def test_local_function_job_result(tmp_path):
    import hpc_train

    handle = hpc_train.submit(_square, 7, site="local", job_root=str(tmp_path))
    assert handle.result() == 49
    assert handle.state == "COMPLETED"


def test_submit_says_the_sites_warnings_like_render_does(tmp_path, site_dir):
    # a debug-only NCCL variable left on in a site's environment: worth a warning, not worth refusing the job
    (site_dir / "noisy.yaml").write_text("extends: local\nenv:\n  NCCL_DEBUG: INFO\n")
    script = tmp_path / "hello.py"
    script.write_text("print('hello from the job')\n")
    env = {**os.environ, "HPC_TRAIN_SITE_PATH": str(site_dir)}
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", "submit", "--site", "noisy", "--job-root", str(tmp_path), "--wait", str(script)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "warning: " in out.stderr and "NCCL_DEBUG" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "ConfigWarning" not in out.stderr  # said like our errors, once


def test_local_job_profiles_the_chosen_steps_on_the_default_ranks(tmp_path):
    # --profile torch end to end: submitted as a user would, traces in the job folder, `report` reads them
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "local",
            "--procs-per-node",
            "2",
            "--job-root",
            str(tmp_path),
            "--profile",
            "torch:wait=3,warmup=1,active=2",
            "--wait",
            str(REPO / "examples" / "train.py"),
            "--",
            "--steps",
            "12",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split()[2]
    run = tmp_path / job_id / "profile" / "run-1"
    found = {int(p.name.split(".")[0].removeprefix("rank-")): p for p in run.glob("rank-*.pt.trace.json")}
    assert sorted(found) == [0, 1]  # rank 0 and the last rank, one trace each
    for path in found.values():
        events = json.loads(path.read_text())["traceEvents"]
        steps = sorted(int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#"))
        assert steps == [4, 5]  # wait 3 + warm-up 1: the run's steps 4 and 5 only
    report = subprocess.run(
        [sys.executable, "-m", "hpc_train", "report", str(tmp_path / job_id), "--no-plots", "--no-goodput"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "run 1 rank 0: steps 4-5, communication" in report.stdout and "run 1 rank 1: steps 4-5" in report.stdout
    assert "top operators" in report.stdout and "aten::" in report.stdout


def test_local_job_redoes_an_out_of_memory_step_with_half_the_micro_batch(tmp_path):
    # --micro-batch end to end: submitted as a user would, the ranks under the memory limit the job's
    # script sets (tests/unit/test_memory.py), the allocator's real error, `report` telling what it chose
    from tests.unit.test_memory import BUDGET_MB, SCRIPT

    script = tmp_path / "memory_job.py"
    script.write_text(SCRIPT)
    budget = [f"TEST_MEMORY_BUDGET_MB={BUDGET_MB}", "MALLOC_ARENA_MAX=2", "OMP_NUM_THREADS=1"]
    command = [sys.executable, "-m", "hpc_train", "submit", "--site", "local", "--procs-per-node", "2"]
    command += ["--micro-batch", "2048", *[w for e in budget for w in ("-e", e)], "--job-root", str(tmp_path / "jobs")]
    out = subprocess.run([*command, "--follow", str(script)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "micro-batch 1024 of the batch of 2048 (2 per step; out of memory with 2048)" in out.stdout
    job_id = out.stdout.split()[2]
    ranks = [json.loads(p.read_text()) for p in (tmp_path / "jobs" / job_id).glob("rank*.json")]
    assert len(ranks) == 2 and {r["steps"] for r in ranks} == {4} and len({r["checksum"] for r in ranks}) == 1
    report = subprocess.run(
        [sys.executable, "-m", "hpc_train", "report", str(tmp_path / "jobs" / job_id)], capture_output=True, text=True, cwd=REPO
    )
    assert report.returncode == 0, report.stderr
    assert "(rank 1)" in report.stdout.split("peak memory", 1)[1].splitlines()[0]
    assert f"micro-batch     {ranks[0]['micro_batch']} of 2048" in report.stdout
