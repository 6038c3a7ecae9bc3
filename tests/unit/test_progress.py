"""The live display of a job's life: which changes become lines, plain and on a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

from hpc_train.jobs import progress
from hpc_train.jobs.handle import JobRecord
from hpc_train.jobs.progress import Snapshot, events


def test_a_requeued_job_tells_its_whole_story():
    story = [
        Snapshot("PENDING", reason="Priority"),
        Snapshot("PENDING", reason="Resources"),
        Snapshot("RUNNING", nodes="n[1-2]", runs=1),
        Snapshot("RUNNING", nodes="n[1-2]", runs=1, metrics={"step": 10}),
        Snapshot("PENDING", reason="BeginTime", runs=1),
        Snapshot("RUNNING", nodes="n[1-2]", runs=2),
        Snapshot("COMPLETED", elapsed="00:01:05", runs=2, metrics={"step": 200, "samples_per_s": 1234.5, "loss": 0.0123}),
    ]
    lines, before = [], None
    for snap in story:
        lines += events("42", before, snap)
        before = snap
    assert lines == [
        "job 42: PENDING (Priority)",
        "job 42: PENDING (Resources)",
        "job 42: RUNNING on n[1-2] (run 1)",
        "job 42: requeued after run 1; waiting to start again (BeginTime)",
        "job 42: RUNNING on n[1-2] (run 2 after a requeue)",
        "job 42: COMPLETED after 00:01:05, 2 runs (step 200 · 1,234 samples/s · loss 0.0123)",
    ]


def test_a_requeue_between_two_polls_is_still_told():
    assert events("7", Snapshot("RUNNING", nodes="n1", runs=1), Snapshot("RUNNING", nodes="n2", runs=2)) == [
        "job 7: RUNNING on n2 (run 2 after a requeue)"
    ]


def test_last_metrics_skips_a_half_written_line(tmp_path):
    handle = FakeHandle(tmp_path, [])
    assert progress.last_metrics(handle) == {}
    (tmp_path / "metrics").mkdir()
    rows = [{"event": "run_start", "run": 1}, {"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]
    (tmp_path / "metrics" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "lo')
    assert progress.last_metrics(handle) == {"step": 2, "loss": 1.0}


class FakeHandle:
    """Scheduler answers from a script: the display logic under test, not Slurm (the e2e test has Slurm)."""

    def __init__(self, folder: Path, infos: list[dict[str, str]], runs: int = 1) -> None:
        self.folder = folder
        self.infos = infos
        self.job_id = "9"
        self.runs = runs
        self.released = 0
        self.record = JobRecord(
            job_id="9",
            folder=str(folder),
            scheduler="slurm",
            kind="script",
            site="s",
            backend="torchrun",
            nodes=2,
            procs_per_node=1,
            tasks_per_node=1,
            job_name="j",
        )

    def scheduler_info(self) -> dict[str, str]:
        return self.infos.pop(0) if len(self.infos) > 1 else self.infos[0]

    @property
    def state(self) -> str:
        return self.infos[0]["JobState"]

    def release_if_held(self, info: dict[str, str] | None = None) -> bool:
        self.released += 1
        return False


def test_watch_prints_plain_lines_when_not_on_a_terminal(tmp_path):
    handle = FakeHandle(
        tmp_path,
        [
            {"JobState": "PENDING", "Reason": "Resources"},
            {"JobState": "RUNNING", "NodeList": "n[1-2]"},
            {"JobState": "COMPLETED", "RunTime": "00:00:09"},
        ],
    )
    out = io.StringIO()
    assert progress.watch(handle, out, tty=False, poll_s=0) == "COMPLETED"
    assert out.getvalue().splitlines() == [
        "job 9: PENDING (Resources)",
        "job 9: RUNNING on n[1-2] (run 1)",
        "job 9: COMPLETED after 00:00:09",
    ]
    assert handle.released == 1  # a pending job is offered the early release, as wait() does


def test_watch_on_a_terminal_draws_a_live_line_and_keeps_the_events(tmp_path):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "steps.jsonl").write_text(json.dumps({"step": 5, "samples_per_s": 99.0, "loss": 0.5}) + "\n")
    handle = FakeHandle(tmp_path, [{"JobState": "RUNNING", "NodeList": "n1"}, {"JobState": "FAILED"}])
    out = io.StringIO()
    assert progress.watch(handle, out, tty=True, poll_s=0) == "FAILED"
    text = out.getvalue()
    assert "job 9: RUNNING on n1 (run 1)" in text and "job 9: FAILED (step 5 · 99 samples/s · loss 0.5)" in text


NAMED = {"rank": 3, "host": "n2", "slowdown": 0.45, "step": 150, "windows": 3, "run": 1}


def test_a_named_straggler_is_told_once_and_before_the_end():
    running = Snapshot("RUNNING", nodes="n[1-2]", runs=1, metrics={"step": 100})
    slow = Snapshot("RUNNING", nodes="n[1-2]", runs=1, metrics={"step": 160}, stragglers=[NAMED])
    assert events("42", running, slow) == ["job 42: straggler: rank 3 on n2 is 45% slower than the median (step 150)"]
    assert events("42", slow, slow) == []
    done = Snapshot("COMPLETED", elapsed="00:02:00", runs=1, stragglers=[NAMED, {**NAMED, "rank": 1, "step": 300}])
    assert events("42", slow, done) == [
        "job 42: straggler: rank 1 on n2 is 45% slower than the median (step 300)",
        "job 42: COMPLETED after 00:02:00",
    ]
    assert events("42", None, slow)[-1].startswith("job 42: straggler: rank 3")  # status --watch joining late


def test_the_live_line_shows_this_runs_stragglers_slowest_first():
    named = [NAMED, {**NAMED, "rank": 5, "host": "n3", "slowdown": 0.9}, {**NAMED, "rank": 7, "run": 0}]
    assert progress.stragglers_text(named, run=1) == "stragglers rank 5 (n3) +90%, rank 3 (n2) +45%"
    assert progress.stragglers_text(named, run=2) == ""  # a requeued run starts with nobody named
    assert progress.stragglers_text([NAMED], run=1) == "straggler rank 3 (n2) +45%"


def test_watch_reads_the_stragglers_file_and_shows_them(tmp_path):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "steps.jsonl").write_text(json.dumps({"step": 160, "samples_per_s": 99.0}) + "\n")
    (tmp_path / "metrics" / "stragglers.jsonl").write_text(json.dumps(NAMED) + "\n" + '{"rank": 4, "hos')
    handle = FakeHandle(
        tmp_path,
        [{"JobState": "RUNNING", "NodeList": "n1"}, {"JobState": "RUNNING", "NodeList": "n1"}, {"JobState": "COMPLETED"}],
    )
    assert [s["rank"] for s in progress.stragglers(handle)] == [3]  # the half-written line is left out
    out = io.StringIO()
    progress.PLAIN_PROGRESS_EVERY_S, every = 0.0, progress.PLAIN_PROGRESS_EVERY_S
    try:
        assert progress.watch(handle, out, tty=False, poll_s=0) == "COMPLETED"
    finally:
        progress.PLAIN_PROGRESS_EVERY_S = every
    lines = out.getvalue().splitlines()
    assert lines.count("job 9: straggler: rank 3 on n2 is 45% slower than the median (step 150)") == 1
    assert "job 9: step 160 · 99 samples/s · straggler rank 3 (n2) +45%" in lines
    live = io.StringIO()
    handle = FakeHandle(tmp_path, [{"JobState": "RUNNING", "NodeList": "n1"}, {"JobState": "FAILED"}])
    progress.watch(handle, live, tty=True, poll_s=0)
    assert "job 9: straggler: rank 3 on n2 is 45% slower than the median (step 150)" in live.getvalue()
