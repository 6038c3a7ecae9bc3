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
