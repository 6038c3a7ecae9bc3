"""The one end rule: an ended-looking state is final when the last run says so, else once it lasts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.jobs.poll import (
    CONFIRM_S,
    REQUEUED_CONFIRM_S,
    Backoff,
    EndRule,
    RunOutcome,
)


def job_folder(tmp_path: Path, runs: int, last_run: str | None) -> Path:
    (tmp_path / "runs").write_text(f"{runs}\n")
    if last_run is not None:
        (tmp_path / "last_run").write_text(last_run + "\n")
    return tmp_path


def test_the_last_runs_own_word_ends_the_job_at_once(tmp_path):
    folder = job_folder(tmp_path, 3, "3 0 ended")
    assert EndRule(requeue=True).final("COMPLETED", folder, now=0.0)
    assert RunOutcome.read(folder) == RunOutcome(3, 0, False)


@pytest.mark.parametrize(
    "last_run, runs, wait",
    [
        ("3 0 requeued", 3, REQUEUED_CONFIRM_S),  # the run requeued: the job comes back
        ("2 0 ended", 3, CONFIRM_S),  # run 3 was killed before it could say (time limit, cancel, node failure)
        (None, 1, CONFIRM_S),  # a job folder from before the rule, or a run killed at once
    ],
)
def test_an_end_without_the_runs_word_is_believed_only_once_it_lasts(tmp_path, last_run, runs, wait):
    rule = EndRule(requeue=True)
    folder = job_folder(tmp_path, runs, last_run)
    assert not rule.final("FAILED", folder, now=100.0)
    assert rule.confirm_in(now=100.0) == wait
    assert not rule.final("FAILED", folder, now=100.0 + wait - 0.1)
    assert rule.final("FAILED", folder, now=100.0 + wait)


def test_a_job_seen_active_again_starts_the_confirmation_over(tmp_path):
    rule = EndRule(requeue=True)
    folder = job_folder(tmp_path, 1, None)
    assert not rule.final("FAILED", folder, now=0.0)
    assert not rule.final("PENDING", folder, now=CONFIRM_S)  # it was requeueing itself
    assert rule.confirm_in(now=CONFIRM_S) is None
    assert not rule.final("COMPLETED", folder, now=CONFIRM_S + 1)
    assert rule.final("COMPLETED", folder, now=2 * CONFIRM_S + 1)


def test_without_requeue_an_end_is_an_end(tmp_path):
    assert EndRule(requeue=False).final("FAILED", tmp_path, now=0.0)
    assert not EndRule(requeue=False).final("RUNNING", tmp_path, now=0.0)


def test_backoff_grows_while_nothing_changes_and_never_sleeps_past_a_pending_confirmation():
    backoff = Backoff(poll_s=1.0, max_s=10.0)
    waits = [backoff.next(changed=False) for _ in range(8)]
    assert waits == sorted(waits) and waits[-1] == 10.0
    assert backoff.next(changed=True) == 1.0
    assert Backoff(poll_s=1.0).next(changed=False, confirm_in=0.2) == 0.5  # soon, but not a busy loop
