"""The sweep handle: parsing what squeue/sacct say about arrays, one call per cycle, its record."""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.errors import UsageError
from hpc_train.jobs.poll import CONFIRM_S
from hpc_train.sweeps.handle import SweepHandle, SweepRecord, expand_after, parse_states

# recorded from the sandbox (Slurm 22.05): squeue -h -r --states=all -j 214 -o '%i|%T|%r', sacct -X -n -P
SQUEUE = "214_1|COMPLETED|None\n214_3|RUNNING|None\n214_0|PENDING|JobArrayTaskLimit\n214_2|FAILED|NonZeroExitCode\n"
SACCT = "212_0|COMPLETED|None\n212_2|CANCELLED by 0|None\n212_[3-5%2]|PENDING|JobArrayTaskLimit\n212_1.batch|COMPLETED|\n"


def test_parse_states_reads_tasks_ranges_and_cancelled_by():
    assert parse_states(SQUEUE) == {
        ("214", 1): ("COMPLETED", "None"),
        ("214", 3): ("RUNNING", "None"),
        ("214", 0): ("PENDING", "JobArrayTaskLimit"),
        ("214", 2): ("FAILED", "NonZeroExitCode"),
    }
    states = parse_states(SACCT)
    assert states[("212", 2)] == ("CANCELLED", "None")
    assert [states[("212", i)][0] for i in (3, 4, 5)] == ["PENDING"] * 3
    assert ("212", 1) not in states  # steps are not tasks


def record(n: int, arrays: list[dict], requeue: bool = False, folder: str = "/nonexistent") -> SweepRecord:
    return SweepRecord(
        sweep_id=str(arrays[0]["job_id"]),
        folder=folder,
        site="sandbox",
        backend="mpi",
        job_name="x",
        nodes=1,
        procs_per_node=1,
        tasks_per_node=1,
        overrides=[{"i": str(i)} for i in range(n)],
        arrays=arrays,
        requeue=requeue,
    )


class Scheduler:
    """Answers squeue/sacct from a table of task states, and counts the calls (the poller's input)."""

    def __init__(self, states: dict[tuple[str, int], str], forgotten: set[str] = frozenset()):
        self.states = states
        self.forgotten = forgotten  # arrays the controller no longer knows (only sacct answers)
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess:
        self.calls.append(cmd)
        ids = cmd[cmd.index("-j") + 1].split(",")
        known = [a for a in ids if cmd[0] == "sacct" or a not in self.forgotten]
        if cmd[0] == "squeue" and not known:
            return subprocess.CompletedProcess(cmd, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        lines = [f"{a}_{i}|{s}|None" for (a, i), s in self.states.items() if a in known]
        return subprocess.CompletedProcess(cmd, 0, "\n".join(lines) + "\n", "")


@pytest.mark.parametrize("n", [6, 200])
def test_one_squeue_call_per_cycle_whatever_the_sweep_size(n):
    arrays = [{"job_id": str(100 + k), "tasks": list(range(k * 8, min(n, k * 8 + 8)))} for k in range((n + 7) // 8)]
    table = {(str(100 + t // 8), t % 8): "RUNNING" for t in range(n)}
    scheduler = Scheduler(table)
    handle = SweepHandle(record(n, arrays), runner=scheduler)
    assert handle.counts() == {"RUNNING": n}
    for key in table:
        table[key] = "COMPLETED"
    table[("100", 2)] = "FAILED"
    assert handle.counts() == {"COMPLETED": n - 1, "FAILED": 1} and handle.failed(poll=False) == [2]
    handle.poll()  # everything ended: nothing left to ask
    assert [c[0] for c in scheduler.calls] == ["squeue", "squeue"]
    assert handle.calls == 2 and handle.cycles == 2
    assert scheduler.calls[0][scheduler.calls[0].index("-j") + 1] == ",".join(a["job_id"] for a in arrays)


def test_tasks_the_controller_forgot_are_asked_of_sacct_once():
    arrays = [{"job_id": "5", "tasks": [0, 1]}, {"job_id": "6", "tasks": [2]}]
    scheduler = Scheduler({("5", 0): "COMPLETED", ("5", 1): "TIMEOUT", ("6", 0): "RUNNING"}, forgotten={"5"})
    handle = SweepHandle(record(3, arrays), runner=scheduler)
    assert handle.states() == {0: "UNKNOWN", 1: "UNKNOWN", 2: "UNKNOWN"}
    assert handle.poll() == {0: "COMPLETED", 1: "TIMEOUT", 2: "RUNNING"}
    assert [c[0] for c in scheduler.calls] == ["squeue", "sacct"]
    assert scheduler.calls[1][scheduler.calls[1].index("-j") + 1] == "5"  # only the forgotten array


def test_with_requeue_an_end_counts_only_when_seen_again_later(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("hpc_train.sweeps.handle.time.monotonic", lambda: clock[0])
    scheduler = Scheduler({("9", 0): "FAILED"})
    handle = SweepHandle(record(1, [{"job_id": "9", "tasks": [0]}], requeue=True), runner=scheduler)
    handle.poll()
    assert handle.failed(poll=False) == [] and handle.failed(poll=False, confirm=False) == [0]
    scheduler.states[("9", 0)] = "PENDING"  # it was requeueing itself
    clock[0] += CONFIRM_S - 1
    handle.poll()
    scheduler.states[("9", 0)] = "COMPLETED"
    handle.poll()
    clock[0] += CONFIRM_S - 1
    handle.poll()
    assert handle.states() == {0: "COMPLETED"} and handle.failed(poll=False) == []  # not yet believed
    clock[0] += 1
    handle.poll()
    assert handle.states() == {0: "COMPLETED"} and handle.failed(poll=False) == []


def test_a_resubmission_supersedes_the_tasks_earlier_attempt():
    rec = record(3, [{"job_id": "10", "tasks": [0, 1, 2]}, {"job_id": "12", "tasks": [1]}])
    assert rec.latest() == {0: ("10", 0), 1: ("12", 0), 2: ("10", 2)}
    assert rec.dependency_ids() == ["10_0", "10_2", "12"]  # afterok must not wait on 10_1's failure
    scheduler = Scheduler({("10", 0): "COMPLETED", ("10", 1): "FAILED", ("10", 2): "COMPLETED", ("12", 0): "RUNNING"})
    assert SweepHandle(rec, runner=scheduler).counts() == {"COMPLETED": 2, "RUNNING": 1}


def test_the_record_survives_the_process_and_after_expands_a_sweep(tmp_path):
    rec = record(2, [{"job_id": "31", "tasks": [0]}, {"job_id": "32", "tasks": [1]}], folder=str(tmp_path / "sw"))
    rec.save()
    assert (tmp_path / "sw" / "sweep.json").is_file() and SweepRecord.exists("31") and not SweepRecord.exists("32")
    again = SweepHandle.from_id("31")
    assert again.array_ids == ["31", "32"] and again.overrides(1) == {"i": "1"}
    assert expand_after(["31", "7"]) == ["31", "32", "7"]
    assert expand_after(again) == ["31", "32"] and expand_after("8,9") == ["8", "9"] and expand_after(None) == []
    rec.arrays.append({"job_id": "33", "tasks": [0]})  # task 0 resubmitted: 31 as a whole no longer counts
    rec.save()
    assert expand_after("31") == ["32", "33"]
    with pytest.raises(UsageError, match="no sweep '99'"):
        SweepHandle.from_id("99")


def test_resubmit_without_failed_tasks_says_so():
    scheduler = Scheduler({("40", 0): "COMPLETED"})
    handle = SweepHandle(record(1, [{"job_id": "40", "tasks": [0]}]), runner=scheduler)
    with pytest.raises(UsageError, match="no failed tasks"):
        handle.resubmit()
