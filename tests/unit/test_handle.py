from __future__ import annotations

import os
import subprocess

import pytest

from hpc_train.jobs import handle as handle_module
from hpc_train.jobs.handle import JobHandle, JobRecord, held_after_requeue
from hpc_train.submission import slurm_cmd


@pytest.mark.parametrize(
    "state,reason,held",
    [("PENDING", "BeginTime", True), ("RUNNING", "None", False), ("PENDING", "Priority", False), ("PENDING", "Resources", False)],
)
def test_only_a_begin_time_hold_is_a_requeue_hold(state, reason, held):
    assert held_after_requeue({"JobState": state, "Reason": reason}) is held


def slurm_job(folder, **record) -> JobHandle:
    """A one-node Slurm script job's handle, as submit records it."""
    fields = dict(job_id="7", folder=str(folder), scheduler="slurm", kind="script", site="sandbox", backend="torchrun",
                  nodes=1, procs_per_node=1, tasks_per_node=1, job_name="t")  # fmt: skip
    return JobHandle(JobRecord(**{**fields, **record}))


def test_a_requeue_hold_is_released_only_after_the_credential_margin(monkeypatch, tmp_path):
    # Releasing in the same second as the requeue makes Slurm refuse the new run's credential and fail it.
    clock = [100.0]
    calls: list[list[str]] = []
    monkeypatch.setattr(handle_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(
        slurm_cmd.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", "")
    )
    handle = slurm_job(tmp_path, release_held=True)
    monkeypatch.setattr(handle, "_controller_info", lambda: {"JobState": "PENDING", "Reason": "BeginTime"})
    assert not handle.release_if_held()  # first seen now
    clock[0] += handle_module.RELEASE_MARGIN_S - 0.5
    assert not handle.release_if_held()
    clock[0] += 1.0
    assert handle.release_if_held()
    assert calls == [["scontrol", "update", "JobId=7", "StartTime=now"]]


def test_wait_backs_off_while_nothing_changes_and_polls_fast_again_on_a_change(monkeypatch, tmp_path):
    states = iter(["PENDING"] + ["RUNNING"] * 8 + ["COMPLETED"])
    sleeps: list[float] = []
    monkeypatch.setattr(handle_module.time, "sleep", sleeps.append)
    monkeypatch.setattr(JobHandle, "state", property(lambda self: next(states)))
    monkeypatch.setattr(JobHandle, "scheduler_info", lambda self: {})  # the controller has nothing to say
    handle = slurm_job(tmp_path)
    assert handle.wait(poll_s=1.0) == "COMPLETED"
    assert sleeps[:2] == [1.0, 1.0]  # a new state: look again soon
    assert sleeps[2:] == sorted(sleeps[2:]) and sleeps[-1] == 10.0  # then ever slower, capped


def test_a_function_jobs_results_are_read_from_its_own_cluster_and_the_process_keeps_its_conf(monkeypatch, tmp_path):
    # a notebook with two clusters: reading one job's results used to leave its SLURM_CONF in os.environ
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/default.conf")
    handle = slurm_job(tmp_path, kind="function", slurm_conf="/clusters/b/slurm.conf")
    assert handle.submitit_job is not None and os.environ["SLURM_CONF"] == "/etc/slurm/default.conf"

    class Waited:  # submitit's job, as far as results() goes: it calls sacct with the process's environment
        def results(self):
            return [os.environ.get("SLURM_CONF")]

    handle._job = Waited()
    assert handle.results() == ["/clusters/b/slurm.conf"]
    assert os.environ["SLURM_CONF"] == "/etc/slurm/default.conf"
