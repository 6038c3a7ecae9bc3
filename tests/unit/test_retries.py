"""Each retry decision leaves its reason in the job folder (hpc_train.runtime.supervise.retries), written the way the
batch script writes it: through ``python -m hpc_train.runtime.supervise.between_runs decided`` after ``health start``/``failed``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train import contract
from hpc_train.runtime.lifecycle.no_retry import refuse_retry
from hpc_train.runtime.supervise import retries
from hpc_train.runtime.supervise.between_runs import decided, no_progress, record_start


def env_of(job: Path, run: int, max_restarts: int = 10) -> dict[str, str]:
    """What the batch script exports for run ``run`` (templates/sbatch/base.sh.j2)."""
    return {
        contract.ENV_JOB_FOLDER: str(job),
        contract.ENV_RUN: str(run),
        contract.ENV_MAX_RESTARTS: str(max_restarts),
        contract.ENV_NO_RETRY_FILE: str(job / contract.NO_RETRY),
        contract.ENV_REQUEUED_FILE: str(job / contract.REQUEUE_REQUESTED),
    }


def lines(job: Path) -> list[dict]:
    return [json.loads(line) for line in (job / contract.RETRIES).read_text().splitlines()]


def commit(job: Path, step: int) -> None:
    folder = job / contract.CHECKPOINTS / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / contract.COMMIT).write_text("{}")


def test_a_requeue_records_the_step_the_run_began_from_and_the_budget(tmp_path):
    commit(tmp_path, 20)
    record_start(tmp_path, 2)
    decided(tmp_path, 2, env_of(tmp_path, 2), "requeued", "failed", 1)
    [line] = lines(tmp_path)
    assert {k: line[k] for k in ("run", "status", "action", "reason", "detail", "start_step", "max_restarts")} == {
        "run": 2,
        "status": 1,
        "action": "requeued",
        "reason": "failed",
        "detail": None,
        "start_step": 20,
        "max_restarts": 10,
    }


def test_the_no_progress_rules_reason_is_told_from_a_ranks_fault(tmp_path):
    env = env_of(tmp_path, 2)
    record_start(tmp_path, 2)  # no checkpoint: the restart began from the start and got nowhere
    reason = no_progress(tmp_path, 2)
    assert reason
    (tmp_path / contract.NO_RETRY).write_text(reason + "\n")  # as health failed writes it
    decided(tmp_path, 2, env, "not_retried", "no_retry", 1)
    refuse_retry(env[contract.ENV_NO_RETRY_FILE], "training diverged: 3 optimizer step(s) in a row ...")
    decided(tmp_path, 2, env, "not_retried", "no_retry", 1)
    progress, fault = lines(tmp_path)
    assert (progress["reason"], progress["detail"]) == ("no_progress", reason)
    assert (fault["reason"], fault["detail"]) == ("no_retry", "training diverged: 3 optimizer step(s) in a row ...")


def test_a_fault_that_would_repeat_is_named_over_on_failure_fail(tmp_path):
    env = env_of(tmp_path, 1)
    decided(tmp_path, 1, env, "not_retried", "on_failure", 1)
    refuse_retry(env[contract.ENV_NO_RETRY_FILE], "no checkpoint in /x loads (step 5: truncated)")
    decided(tmp_path, 1, env, "not_retried", "on_failure", 1)
    plain, fault = lines(tmp_path)
    assert (plain["reason"], plain["detail"]) == ("on_failure", None)
    assert (fault["reason"], fault["detail"]) == ("no_retry", "no checkpoint in /x loads (step 5: truncated)")


def test_the_batch_scripts_command_line_records_the_decision(tmp_path):
    env = {**os.environ, **env_of(tmp_path, 3, max_restarts=2)}
    cmd = [sys.executable, "-m", "hpc_train.runtime.supervise.between_runs"]
    assert subprocess.run([*cmd, "start"], env=env, timeout=60).returncode == 0
    out = subprocess.run(
        [*cmd, "decided", "not_retried", "restart_budget", "--status", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    [line] = lines(tmp_path)
    assert (line["run"], line["action"], line["reason"], line["max_restarts"], line["start_step"]) == (
        3,
        "not_retried",
        "restart_budget",
        2,
        -1,
    )


def test_record_refuses_what_the_login_side_could_not_explain(tmp_path):
    with pytest.raises(ValueError):
        retries.record(tmp_path, retries.Decision(1, 1, "retried", "failed"), environ={})
    with pytest.raises(ValueError):
        retries.record(tmp_path, retries.Decision(1, 1, "requeued", "because"), environ={})


def test_rank_zeros_decision_is_recorded_only_inside_a_requeueing_job(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("HPC_TRAIN_"):
            monkeypatch.delenv(name)
    retries.record_here(0, "requeued", "stopped", "the time limit is near")
    assert not (tmp_path / contract.RETRIES).exists()  # no job folder: a local run, nothing to decide
    for name, value in env_of(tmp_path, 4, max_restarts=3).items():
        monkeypatch.setenv(name, value)
    retries.record_here(3, "not_retried", "restart_budget", "restart budget exhausted (3 restarts); step 90 is saved")
    [line] = lines(tmp_path)
    assert (line["run"], line["status"], line["reason"], line["detail"]) == (
        4,
        3,
        "restart_budget",
        "restart budget exhausted (3 restarts); step 90 is saved",
    )
