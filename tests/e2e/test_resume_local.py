"""--resume-from through the `local` site, the sandbox test's path on this machine: a job of 4 processes to
step S, continued by job id as 2 processes; its losses and samples match the uninterrupted 4-process job's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.e2e.test_resume_cluster import SCRIPT, STEPS, STOP, steps


def submit(job_root: Path, procs: int, *extra: str, script_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train", "submit", "--site", "local", "--job-root", str(job_root),
         "--procs-per-node", str(procs), "--wait", *extra, str(SCRIPT), "--", "--steps", str(STEPS),
         "--batch-size", "4", *script_args],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip


def job_id(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split()[2]


def test_a_local_4_process_job_resumed_by_id_as_2_processes_matches_the_uninterrupted_job(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_STATE_DIR", str(tmp_path / "state"))  # the job index the id is found in
    straight = steps(tmp_path, job_id(submit(tmp_path, 4)))
    first = job_id(submit(tmp_path, 4, script_args=("--stop-at", str(STOP))))
    resumed = steps(tmp_path, job_id(submit(tmp_path, 2, "--resume-from", first)))
    assert sorted(resumed) == list(range(STOP + 1, STEPS + 1))
    for step, row in resumed.items():
        assert (row["world_size"], row["per_rank_batch"]) == (2, 8)
        assert row["samples"] == straight[step]["samples"], step
        assert abs(row["loss"] - straight[step]["loss"]) <= 1e-5 * abs(straight[step]["loss"]) + 1e-7, (step, row)
    refused = submit(tmp_path, 3, "--resume-from", first)
    assert refused.returncode == 78 and "does not divide among 3 data-parallel ranks" in refused.stderr, refused.stderr
