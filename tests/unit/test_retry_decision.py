"""Why a job was not retried, or how often it was and from which step, read back on the login side
(hpc_train.jobs.retry_decision) from job folders laid out by the runtime's own writers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpc_train import contract
from hpc_train.cli import status_cmd
from hpc_train.jobs.handle import JobHandle, JobRecord
from hpc_train.jobs.retry_decision import story
from hpc_train.runtime.lifecycle.no_retry import refuse_retry
from hpc_train.runtime.supervise.between_runs import decided, no_progress, record_start
from tests.unit.test_retries import env_of


def start(job: Path, run: int) -> None:
    """What the batch script does as run ``run`` begins: count it, clear the no-retry file, record where it begins."""
    (job / contract.RUNS).write_text(f"{run}\n")
    (job / contract.NO_RETRY).unlink(missing_ok=True)
    record_start(job, run)


def commit(job: Path, step: int) -> None:
    folder = job / contract.CHECKPOINTS / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / contract.COMMIT).write_text("{}")


def crash_loop(job: Path) -> str:
    """Run 1 crashes before its first checkpoint and is requeued; run 2 gets no further: the no-progress rule."""
    start(job, 1)
    decided(job, 1, env_of(job, 1), "requeued", "failed", 1)
    start(job, 2)
    reason = no_progress(job, 2)
    assert reason
    (job / contract.NO_RETRY).write_text(reason + "\n")  # health failed, as the script calls it
    decided(job, 2, env_of(job, 2), "not_retried", "no_retry", 1)
    return reason


def test_a_crash_loop_says_the_no_progress_rule_stopped_it_and_why(tmp_path):
    reason = crash_loop(tmp_path)
    told = story(tmp_path, "FAILED", requeue=True)
    assert told.not_retried is not None and told.not_retried.reason == "no_progress"
    assert told.why == (
        "retried 1 time: run 2 from the start (requeued after a failure); "
        f"not retried after run 2: the no-progress rule stopped a crash loop: {reason}"
    )


def test_a_fault_that_would_repeat_is_named_with_its_message(tmp_path):
    start(tmp_path, 1)
    refuse_retry(env_of(tmp_path, 1)[contract.ENV_NO_RETRY_FILE], "rank 0: out of memory in the optimizer step (SGD)")
    decided(tmp_path, 1, env_of(tmp_path, 1), "not_retried", "no_retry", 1)
    assert story(tmp_path, "FAILED", requeue=True).why == (
        "not retried after run 1: the failure would repeat on a retry: rank 0: out of memory in the optimizer step (SGD)"
    )


def test_a_spent_restart_budget_names_the_budget_and_each_retrys_step(tmp_path):
    start(tmp_path, 1)
    commit(tmp_path, 20)
    decided(tmp_path, 1, env_of(tmp_path, 1, 1), "requeued", "failed", 1)
    start(tmp_path, 2)
    decided(tmp_path, 2, env_of(tmp_path, 2, 1), "not_retried", "restart_budget", 1)
    told = story(tmp_path, "FAILED", requeue=True)
    assert [(r.run, r.how, r.after, r.from_step) for r in told.retries] == [(2, "requeued", "failed", 20)]
    assert told.why == (
        "retried 1 time: run 2 from step 20 (requeued after a failure); "
        "not retried after run 2: the restart budget is spent (--max-restarts 1)"
    )


def test_on_failure_fail_and_requeue_off_say_so(tmp_path):
    start(tmp_path, 1)
    decided(tmp_path, 1, env_of(tmp_path, 1), "not_retried", "on_failure", 1)
    assert "--on-failure is fail" in (story(tmp_path, "FAILED", requeue=True).why or "")
    off = tmp_path / "off"
    off.mkdir()  # requeue off: the script has no requeue block and writes no record
    assert story(off, "FAILED", requeue=False).why == (
        "not retried after run 1: requeue is off for this job (--no-requeue, or the site's default)"
    )


def test_a_retried_job_that_completed_or_still_runs_says_only_how_often_and_from_where(tmp_path):
    start(tmp_path, 1)
    commit(tmp_path, 50)
    decided(tmp_path, 1, env_of(tmp_path, 1), "restarted", "failed", 1)  # spare nodes: inside the allocation
    start(tmp_path, 2)  # running now: its own start is all there is
    running = story(tmp_path, "RUNNING", requeue=True)
    assert running.not_retried is None
    assert running.why == "retried 1 time: run 2 from step 50 (restarted inside the allocation after a failure)"
    assert story(tmp_path, "COMPLETED", requeue=True).why == running.why


def test_a_run_the_budget_refused_at_its_start_is_no_retry(tmp_path):
    start(tmp_path, 1)
    (tmp_path / contract.RUNS).write_text("2\n")  # time-limit requeue by rank 0 used the budget of 0
    decided(tmp_path, 1, env_of(tmp_path, 1, 0), "requeued", "stopped", 0)
    start(tmp_path, 2)
    decided(tmp_path, 2, env_of(tmp_path, 2, 0), "not_started", "restart_budget", 1)
    told = story(tmp_path, "FAILED", requeue=True)
    assert told.retries == [] and told.why == "not retried after run 2: the restart budget is spent (--max-restarts 0)"


def test_a_job_with_one_run_and_no_record_has_nothing_to_say(tmp_path):
    start(tmp_path, 1)
    assert story(tmp_path, "CANCELLED", requeue=True).why is None
    assert story(tmp_path, "COMPLETED", requeue=False).as_dict() == {"why": None, "retries": [], "not_retried": None}


def test_status_json_and_text_carry_why_and_retries(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(contract.ENV_STATE_DIR, str(tmp_path / "state"))
    job = tmp_path / "4242"
    job.mkdir()
    reason = crash_loop(job)
    JobRecord(
        job_id="4242", folder=str(job), scheduler="slurm", kind="script", site="sandbox", backend="torchrun",
        nodes=2, procs_per_node=1, tasks_per_node=1, job_name="t", requeue=True,
    ).save()  # fmt: skip
    monkeypatch.setattr(JobHandle, "state", property(lambda self: "FAILED"))
    monkeypatch.setattr(JobHandle, "accounting", lambda self: {"ExitCode": "1:0"})
    assert status_cmd.run(argparse.Namespace(job_id="4242", json=True, watch=False)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["not_retried"] == {"run": 2, "reason": "no_progress", "detail": reason, "max_restarts": 10}
    assert data["retries"] == [{"run": 2, "how": "requeued", "after": "failed", "from_step": -1}]
    assert data["why"].startswith("retried 1 time: run 2 from the start")
    assert status_cmd.run(argparse.Namespace(job_id="4242", json=False, watch=False)) == 0
    assert f"  why: {data['why']}\n" in capsys.readouterr().out
