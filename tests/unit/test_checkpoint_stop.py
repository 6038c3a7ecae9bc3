"""hpc_train.runtime.checkpoint.stop: what rank 0 decides once a stopping run's last step is saved. A
requeue Slurm takes is checked on the sandbox (tests/e2e/test_requeue_cluster.py); here the two ways a
stopped run ends without one, with the record the login side reads and the line goodput parses."""

from __future__ import annotations

import json

import pytest

from hpc_train import contract, log_lines
from hpc_train.runtime.checkpoint.stop import EXIT_STOPPED, requeue_or_stop


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv(contract.ENV_JOB_FOLDER, str(tmp_path))
    monkeypatch.setenv(contract.ENV_REQUEUED_FILE, str(tmp_path / contract.REQUEUE_REQUESTED))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return tmp_path


def decisions(folder):
    return [json.loads(line) for line in (folder / contract.RETRIES).read_text().splitlines()]


def test_a_spent_restart_budget_ends_the_run_with_the_code_that_says_resubmit(job, monkeypatch, capfd):
    monkeypatch.setenv(contract.ENV_RUN, "3")
    code = requeue_or_stop(3, 2, 40, "time limit", job / "ckpt")
    assert code == EXIT_STOPPED != 0
    [decision] = decisions(job)
    assert (decision["run"], decision["status"], decision["action"], decision["reason"]) == (
        3,
        3,
        "not_retried",
        "restart_budget",
    )
    assert f"step 40 is saved in {job / 'ckpt'}" in decision["detail"]
    err = capfd.readouterr().err
    assert log_lines.STOPPING.parse(err) == {"run": 3, "step": 40, "reason": "time limit"}
    assert not (job / contract.REQUEUE_REQUESTED).exists()  # the batch script must not wait for a requeue


def test_a_run_outside_slurm_cannot_requeue_and_says_so(job, capfd):
    code = requeue_or_stop(1, None, 7, "stop file", job / "ckpt")
    assert code == EXIT_STOPPED
    [decision] = decisions(job)
    assert (decision["action"], decision["reason"]) == ("not_retried", "requeue_failed")
    assert "resubmit the job to continue" in decision["detail"] and "resubmit the job to continue" in capfd.readouterr().err
    assert not (job / contract.REQUEUE_REQUESTED).exists()
