"""Goodput and how each run ended, from job folders written the way the job writes them.

The metrics recorder, the straggler monitor, the watchdog's report and the health checks write their
files here through their own code (on a fake clock), so a change of format breaks these tests. The
batch script's lines and files (runs, last_run, the log) come from the template, which is checked to
still say them.
"""

from __future__ import annotations

import atexit
import json
from pathlib import Path

import pytest

from hpc_train import contract
from hpc_train.jobs import goodput
from hpc_train.jobs.handle import JobRecord
from hpc_train.runtime.checkpoint.manager import COMMIT
from hpc_train.runtime.observe import metrics, straggler
from hpc_train.runtime.observe.clocks import union_seconds
from hpc_train.runtime.supervise import between_runs, suspects, watchdog
from hpc_train.runtime.supervise.hang_report import Culprit

T0 = 1_700_000_000.0


class Clock:
    """time.time and time.perf_counter of the runtime modules, moved by the test."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def time(self) -> float:
        return self.t

    def perf_counter(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    for module in (metrics, straggler, watchdog, suspects):
        monkeypatch.setattr(module, "time", fake)
    return fake


def batch_log(folder: Path, job: str, *lines: str, stream: str = "out") -> None:
    with open(folder / f"{job}_0_log.{stream}", "a") as f:
        f.write("".join(f"hpc_train: {line}\n" for line in lines))


def run_begins(folder: Path, clock: Clock, run: int, job: str = "77", host: str = "n1") -> None:
    """What the batch script does as a run begins: the counter, the log line."""
    (folder / contract.RUNS).write_text(f"{run}\n")
    from datetime import datetime, timezone

    date = datetime.fromtimestamp(clock.t, timezone.utc).isoformat(timespec="seconds")
    batch_log(folder, job, f"run {run} of job {job} on {host} at {date} (restart budget 3)")


def train(
    folder: Path,
    clock: Clock,
    *,
    run: int,
    steps: int,
    start_step: int = 0,
    step_s: float = 10.0,
    warmup_s: float = 30.0,
    startup_s: float = 20.0,
    save_every: int | None = None,
    save_s: float = 0.0,
    slow_rank: float | None = None,
    end: bool = True,
    job: str = "77",
) -> metrics.MetricsRecorder:
    """One run of rank 0's recorder: start-up, ``steps`` steps, saves (a stall in the step after each)."""
    clock.sleep(startup_s)
    rec = metrics.MetricsRecorder(folder / contract.METRICS, rank=0, world_size=4, run=run, job_id=job, flush_s=1e9)
    rec.tensorboard = rec.prometheus = None  # no TensorBoard (it would import torch), no Prometheus file: not tested here
    rec.start_at(start_step)
    if slow_rank is not None:

        def gather(mine):
            value, _, group = mine
            return [(value, "n1", group), (value, "n1", group), (value, "n2", group), (value * slow_rank, "n2", group)]

        rec.straggler = straggler.StragglerMonitor(
            straggler.Settings(0.2, 10),
            rank=0,
            world_size=4,
            gather=gather,
            seconds=union_seconds,
            gather_numbers=lambda v: [v, v, v, v * slow_rank],
            folder=folder / contract.METRICS,
            run=run,
            host="n1",
        )
    for i in range(steps):
        rec.on_backward(1.0)
        clock.sleep(warmup_s if i == 0 else step_s)
        rec.on_step()
        step = start_step + i + 1
        if save_every and step % save_every == 0:
            clock.sleep(save_s)  # the save: lies in the next step's time
            commit(folder, step)
            batch_log(folder, job, f"saved step {step} to {folder}/checkpoints/step-{step:08d}", stream="err")
    if end:
        rec.close()
    else:  # killed: what was flushed stays, no run_end
        rec.flush()
        rec._closed = True
        atexit.unregister(rec.close)
    return rec


def commit(folder: Path, step: int) -> None:
    path = folder / contract.CHECKPOINTS / f"step-{step:08d}"
    path.mkdir(parents=True, exist_ok=True)
    (path / COMMIT).write_text(json.dumps({"step": step}))


def sacct_line(job: str, state: str, start: float, end: float | None, submit: float, gpus: int = 8, nodes: int = 2) -> str:
    from datetime import datetime

    def fmt(t: float | None) -> str:
        return datetime.fromtimestamp(t).isoformat(timespec="seconds") if t is not None else "Unknown"

    return "|".join(
        [
            job,
            state,
            "0:0",
            fmt(submit),
            fmt(start),
            fmt(end),
            "n[1-2]",
            str(nodes),
            f"billing={gpus},cpu=16,gres/gpu={gpus},mem=64G,node={nodes}",
        ]
    )


def record(folder: Path, **extra) -> None:
    """The job record as submit writes it, plus fields the site would add (gpus_per_node, price)."""
    JobRecord(
        job_id="77",
        folder=str(folder),
        scheduler="slurm",
        kind="script",
        site="bluecloud",
        backend="torchrun",
        nodes=2,
        procs_per_node=2,
        tasks_per_node=1,
        job_name="t",
        submitted_at=T0 - 100,
    ).save()
    if extra:
        path = folder / contract.RECORD
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra}))


# -- a clean run ---------------------------------------------------------------------------------
def test_a_clean_run_loses_only_its_start_up(tmp_path, clock):
    record(tmp_path, price_per_gpu_hour=2.5)
    run_begins(tmp_path, clock, 1)
    train(tmp_path, clock, run=1, steps=100)
    (tmp_path / contract.LAST_RUN).write_text("1 0 ended\n")
    allocation = goodput.parse_sacct(sacct_line("77", "COMPLETED", T0, clock.t, T0 - 100), "77")
    g = goodput.summarize(goodput.read(tmp_path), allocation)
    assert g.allocated_s == pytest.approx(20 + 30 + 99 * 10, abs=1)
    assert g.productive_s == pytest.approx(100 * 10)  # the first step counts as a steady one
    assert g.lost_s["startup"] == pytest.approx(20 + 30 - 10, abs=1)  # python start, then the warm-up's excess
    assert sum(v for k, v in g.lost_s.items() if k != "startup") == pytest.approx(0, abs=1)
    assert g.goodput == pytest.approx(1000 / 1040, abs=1e-3) and not g.estimated
    assert g.first_wait_s == pytest.approx(100, abs=1) and g.queue_wait_s == 0
    assert g.gpu_hours == pytest.approx(8 * g.allocated_s / 3600) and g.cost == pytest.approx(g.gpu_hours * 2.5)
    [run] = g.runs
    assert (run.ended, run.how, run.first_step, run.last_step) == ("completed", "completed", 1, 100)
    text = "\n".join(goodput.format_lines(goodput.as_dict(g)))
    assert "goodput         96.2%: 00:16:40 training new steps of 00:17:20 allocated" in text
    assert "recomputed" not in text and "hang detection" not in text
    assert "cost            5.78 (2.5 per GPU-hour)" in text


# -- a preemption without a save: steps trained twice, a queue wait ------------------------------
def test_a_preempted_run_requeued_recomputes_the_steps_after_its_checkpoint(tmp_path, clock):
    record(tmp_path, gpus_per_node=4)
    run_begins(tmp_path, clock, 1)
    train(tmp_path, clock, run=1, steps=25, save_every=10, save_s=5.0, end=False)  # killed at step 25
    first_end = clock.t + 3
    clock.sleep(120 + 3)  # Slurm requeues it; the job waits in the queue
    second_start = clock.t
    run_begins(tmp_path, clock, 2)
    (tmp_path / contract.RUN_START_STEP).write_text("2 20\n")
    train(tmp_path, clock, run=2, steps=30, start_step=20)
    (tmp_path / contract.LAST_RUN).write_text("2 0 ended\n")
    sacct = "\n".join(
        [
            sacct_line("77", "PREEMPTED", T0, first_end, T0 - 100),
            sacct_line("77", "COMPLETED", second_start, clock.t, first_end),
            sacct_line("77.batch", "COMPLETED", second_start, clock.t, first_end),
        ]
    )
    g = goodput.summarize(goodput.read(tmp_path), goodput.parse_sacct(sacct, "77"))
    assert len(g.allocations) == 2 and g.requeues == 1
    assert g.queue_wait_s == pytest.approx(120, abs=1)
    assert g.steps_recomputed == 5 and g.lost_s["recomputed"] == pytest.approx(5 * 10)  # steps 21-25 of run 1
    # the saves at 10 and 20 (25 was never saved): a stall is the save's, even in a step redone later
    assert g.lost_s["checkpoint_stalls"] == pytest.approx(2 * 5) and g.saves == 2
    assert g.lost_s["restart_downtime"] == pytest.approx(3, abs=1)
    assert g.productive_s == pytest.approx(50 * 10)  # steps 1-20 of run 1 and 21-50 of run 2, once each
    assert [(r.run, r.ended, r.start_step) for r in g.runs] == [(1, "requeued", 0), (2, "completed", 20)]
    assert g.runs[0].how == "preempted (requeued)"
    assert sum(g.lost_s.values()) + g.productive_s == pytest.approx(g.allocated_s)


def test_without_sacct_the_allocations_are_estimated_from_the_job_files(tmp_path, clock):
    record(tmp_path, gpus_per_node=4)
    run_begins(tmp_path, clock, 1)
    train(tmp_path, clock, run=1, steps=25, end=False)
    clock.sleep(200)
    run_begins(tmp_path, clock, 2)
    train(tmp_path, clock, run=2, steps=10, start_step=20)
    g = goodput.summarize(goodput.read(tmp_path), None, "sacct failed: sacct not found on PATH")
    assert g.estimated and len(g.allocations) == 2 and g.queue_wait_s == pytest.approx(200, abs=1)
    assert g.steps_recomputed == 5
    assert g.gpu_hours == pytest.approx(2 * 4 * g.allocated_s / 3600)
    assert any("estimated" in n and "sacct not found" in n for n in g.notes)


# -- a hang ----------------------------------------------------------------------------------------
def hang(folder: Path, clock: Clock, run: int, quiet_s: float = 300.0, start_step: int = 0) -> None:
    """The watchdog declares a hang: rank 1 on n2 behind, stacks, its report written by its own code."""
    last = clock.t
    clock.sleep(quiet_s)
    beats = {0: {"host": "n1", "steps": 30, "at": last}, 1: {"host": "n2", "steps": 29, "at": last - 10}}
    settings = watchdog.Settings(
        job_folder=folder, heartbeats=folder / contract.HEARTBEATS, run=run, world=2, timeout=quiet_s, stop_file=None, job_id="77"
    )
    culprit = Culprit(
        1,
        "n2",
        "stopped at step 29 of this run; the others reached 30",
        29,
        ['File "train.py", line 65 in main', 'File "train.py", line 80 in <module>'],
    )
    watchdog.report(
        settings,
        {"run": run, "quiet_s": quiet_s, "limit_s": quiet_s, "limit": "--hang-timeout", "beats": beats},
        folder / contract.DUMPS / f"run-{run}",
        [culprit],
    )
    clock.sleep(5)  # the kill


def test_a_hang_is_timed_from_the_last_activity_and_its_culprit_named(tmp_path, clock, capsys):
    record(tmp_path, gpus_per_node=4)
    run_begins(tmp_path, clock, 1)
    train(tmp_path, clock, run=1, steps=30, save_every=20, end=False)
    hang(tmp_path, clock, 1)
    batch_log(tmp_path, "77", "run 1 failed (exit 137); requeueing", stream="err")
    end_1 = clock.t
    clock.sleep(60)
    run_begins(tmp_path, clock, 2, host="n3")
    train(tmp_path, clock, run=2, steps=20, start_step=20)
    (tmp_path / contract.LAST_RUN).write_text("2 0 ended\n")
    (tmp_path / contract.EXCLUDE_NODES).write_text("n2\n")
    sacct = "\n".join([sacct_line("77", "REQUEUED", T0, end_1, T0), sacct_line("77", "COMPLETED", end_1 + 60, clock.t, end_1)])
    g = goodput.summarize(goodput.read(tmp_path), goodput.parse_sacct(sacct, "77"))
    assert g.lost_s["hang_detection"] == pytest.approx(300 + 5, abs=1)
    assert g.steps_recomputed == 10 and g.lost_s["recomputed"] == pytest.approx(100)
    first = g.runs[0]
    assert first.ended == "hang" and first.hang is not None
    assert first.how == (
        'hang (no rank active for 300 s): rank 1 on n2, last step 29, at File "train.py", line 65 in main '
        "(stopped at step 29 of this run; the others reached 30); requeued"
    )
    assert first.suspects == ["n2 (hang, excluded)"]
    assert g.runs[1].ended == "completed" and g.runs[1].suspects == []
    text = "\n".join(goodput.format_lines(goodput.as_dict(g)))
    assert "    run 1 suspect nodes: n2 (hang, excluded)" in text and "hang detection      00:05:05" in text
    assert "excluded        n2 (ExcNodeList of the next requeue)" in text


# -- a restart inside the allocation (spare nodes) -------------------------------------------------
def test_a_crash_restarted_inside_the_allocation_costs_no_queue_wait(tmp_path, clock):
    record(tmp_path, gpus_per_node=4, spare_nodes=1)
    run_begins(tmp_path, clock, 1)
    train(tmp_path, clock, run=1, steps=15, save_every=10, end=False)
    clock.sleep(4)
    beats = tmp_path / contract.HEARTBEATS
    beats.mkdir()
    for rank, host, error in ((0, "n1", "DistBackendError: peer gone"), (1, "n2", "RuntimeError: CUDA error: ECC")):
        (beats / f"rank-{rank}.json").write_text(
            json.dumps(
                {
                    "rank": rank,
                    "run": 1,
                    "host": host,
                    "steps": 15,
                    "at": clock.t + rank * -0.5,
                    "state": "failed",
                    "error": error,
                }
            )
        )
    between_runs.name_crash_culprit(tmp_path, beats, 1, {})  # the failure path names n2 as it does in the job
    batch_log(tmp_path, "77", "run 1 failed (exit 1); restarting inside the allocation", stream="err")
    run_begins(tmp_path, clock, 2)
    train(tmp_path, clock, run=2, steps=30, start_step=10, slow_rank=1.8)
    (tmp_path / contract.LAST_RUN).write_text("2 0 ended\n")
    sacct = sacct_line("77", "COMPLETED", T0, clock.t, T0, gpus=12, nodes=3)
    g = goodput.summarize(goodput.read(tmp_path), goodput.parse_sacct(sacct, "77"))
    assert len(g.allocations) == 1 and g.queue_wait_s == 0 and g.requeues == 0
    assert [r.allocation for r in g.runs] == [0, 0]
    assert g.runs[0].ended == "restarted" and g.runs[0].how == "failed with exit 1; restarted inside the allocation"
    assert g.runs[0].suspects == ["n2 (failed first)"]
    assert g.lost_s["restart_downtime"] == pytest.approx(4 + 1, abs=1.5)  # the crash, and the batch log's second
    assert g.steps_recomputed == 5
    assert g.runs[1].stragglers == ["rank 3 on n2 +80%"]
    # three windows of 10 steps in run 2 (named after the third): every step waited for rank 3's extra 80 %;
    # the first window's steps hold the warm-up (12 s a step on average), the others 10 s
    assert g.lost_s["straggler"] == pytest.approx(0.8 * (12 + 10 + 10) * 10)
    assert g.productive_s == pytest.approx(10 * 10 + 30 * 10 - g.lost_s["straggler"])
    assert g.nodes == 3 and g.gpu_hours == pytest.approx(12 * g.allocated_s / 3600)


# -- files missing or garbled: notes, never a traceback ---------------------------------------------
def test_garbled_files_are_named_not_raised(tmp_path, clock):
    run_begins(tmp_path, clock, 1)
    train(tmp_path, clock, run=1, steps=5)
    with open(tmp_path / contract.METRICS / contract.STEPS, "a") as f:
        f.write('{"step": 6, "ti\n[1, 2]\n')
    (tmp_path / contract.RECORD).write_text("{not json")
    (tmp_path / contract.HANGS).write_text("garbage\n")
    (tmp_path / contract.RUNS).write_text("many\n")
    (tmp_path / contract.LAST_RUN).write_text("1 zero\n")
    (tmp_path / contract.RUN_START_STEP).write_text("1\n")
    (tmp_path / contract.METRICS / contract.STRAGGLERS).write_text('{"rank": 1, "ho')
    g = goodput.load(tmp_path)
    notes = "\n".join(g.notes)
    for fragment in (
        "metrics/steps.jsonl: 2 unreadable line(s) skipped",
        "hpc_train.json: not a JSON object",
        "hangs.jsonl: 1 unreadable line(s) skipped",
        "runs: not a number",
        "last_run: not 'RUN STATUS",
        "run_start_step: not 'RUN STEP'",
        "metrics/stragglers.jsonl: 1 unreadable line(s) skipped",
        "no job record to ask sacct with",
    ):
        assert fragment in notes, notes
    assert [r.run for r in g.runs] == [1] and g.runs[0].last_step == 5
    assert "  note            runs: not a number ('many')" in "\n".join(goodput.format_lines(goodput.as_dict(g)))


def test_an_empty_folder_says_what_it_lacks(tmp_path):
    g = goodput.load(tmp_path)
    assert g.runs == [] and g.allocated_s == 0 and g.goodput is None
    text = "\n".join(goodput.format_lines(goodput.as_dict(g)))
    assert "goodput         unknown: no allocation found" in text and "no metrics/steps.jsonl" in text


def test_sacct_that_is_missing_is_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sacct here
    found, why = goodput.sacct_allocations("77")
    assert found is None and why is not None and "sacct not found" in why
