"""--restart-from-scratch and the no-retry marker, from the command line to the batch script's shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write


def render(*args: str, script: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", "render", "--site", "sandbox", *args, str(script)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return write(tmp_path / "train.py", "print('hi')\n")


def test_restart_from_scratch_reaches_the_job(script):
    assert "export HPC_TRAIN_RESTART_FROM_SCRATCH=1  # job" in render("--restart-from-scratch", script=script)
    assert "HPC_TRAIN_RESTART_FROM_SCRATCH" not in render(script=script)  # unset: restore() fails loudly
    help_text = subprocess.run(
        [sys.executable, "-m", "hpc_train", "submit", "--help"], capture_output=True, text=True, cwd=REPO
    ).stdout
    assert "--restart-from-scratch" in help_text


def on_failure_branch(text: str) -> str:
    """The rendered lines that decide whether a failed run is requeued (from whether it may be retried)."""
    start = text.index("hpc_train_retry=")
    decision = text.index('if [ "${status}" -ne 0 ] && [ ! -e "${HPC_TRAIN_STOP_FILE}" ] && [ "${hpc_train_retry}" = 1 ]; then')
    decided = text[text.index("hpc_train_decided() {") :].split("\n", 1)[0]  # records each decision (retries.jsonl)
    return decided + "\n" + text[start : text.index("\nfi\n", decision) + 4]


def run_branch(branch: str, folder: Path, run: int = 1) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_CONF": str(folder / "no-such-slurm.conf"),
        "SLURM_JOB_ID": "0",
        "HPC_TRAIN_JOB_FOLDER": str(folder),
        "HPC_TRAIN_RUN": str(run),
        "HPC_TRAIN_MAX_RESTARTS": "5",
        "HPC_TRAIN_STOP_FILE": str(folder / "stop_requested"),
        "HPC_TRAIN_REQUEUED_FILE": str(folder / "requeue_requested"),
        "HPC_TRAIN_NO_RETRY_FILE": str(folder / "no_retry"),
    }
    return subprocess.run(["bash", "-c", f"status=1\n{branch}"], env=env, capture_output=True, text=True, timeout=60)


def test_a_failure_that_would_repeat_is_not_requeued(script, tmp_path):
    text = render("--on-failure", "requeue", script=script)
    assert 'export HPC_TRAIN_NO_RETRY_FILE="${HPC_TRAIN_JOB_FOLDER}/no_retry"' in text
    assert 'rm -f "${HPC_TRAIN_STOP_FILE}" "${HPC_TRAIN_REQUEUED_FILE}" "${HPC_TRAIN_NO_RETRY_FILE}"' in text
    branch = on_failure_branch(text)
    reason = "saving step 40 failed: no space left on device: 0.2 MiB free in /x; checkpoint step 20 is intact"
    (tmp_path / "no_retry").write_text(reason + "\n")
    out = run_branch(branch, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr == f"hpc_train: run 1 failed (exit 1): {reason}; not requeueing: it would fail the same way\n"
    assert not (tmp_path / "requeue_requested").exists()
    decision = json.loads((tmp_path / "retries.jsonl").read_text().splitlines()[-1])
    assert (decision["action"], decision["reason"], decision["detail"]) == ("not_retried", "no_retry", reason)
    (tmp_path / "no_retry").unlink()
    out = run_branch(branch, tmp_path, run=6)  # any other failure goes on as before (past the budget: no scontrol)
    assert out.stderr == "hpc_train: run 6 failed (exit 1); restart budget exhausted (5 restarts)\n"
