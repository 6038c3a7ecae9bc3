"""Seeing a run, end to end: one 2-node torchrun job's progress, logs, metrics files and report."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e
EXAMPLE = REPO / "examples" / "train.py"
STEPS = 40


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_two_node_job_metrics_progress_logs_and_report(slurm_cluster, sandbox_job_root):
    from prometheus_client.parser import text_string_to_metric_families
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = cli(
        "submit",
        "--site",
        "sandbox",
        "--job-root",
        str(sandbox_job_root),
        "--backend",
        "torchrun",
        "--nodes",
        "2",
        "--procs-per-node",
        "2",
        "--wait",
        str(EXAMPLE),
        "--",
        "--steps",
        str(STEPS),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split()[2]
    # --wait off a terminal: the job's life as plain lines on stderr
    assert re.search(rf"job {job_id}: RUNNING on n\[\d[-,]\d\] \(run 1\)", out.stderr), out.stderr
    assert f"job {job_id}: COMPLETED" in out.stderr and "COMPLETED (exit 0)" in out.stderr
    metrics = sandbox_job_root / job_id / "metrics"

    lines = [json.loads(line) for line in (metrics / "steps.jsonl").read_text().splitlines()]
    start, rows, end = lines[0], [r for r in lines if "event" not in r], lines[-1]
    assert start["event"] == "run_start" and start["world_size"] == 4 and start["job_id"] == job_id
    assert end["event"] == "run_end" and end["step"] == STEPS
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # every step, once
    assert all(r["samples"] == 4 * 32 and r["loss"] > 0 and 0 <= r["comm_share"] <= 1 for r in rows)
    assert sum(r["comm_s"] > 0 for r in rows) == STEPS  # gradients crossed nodes at every step
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]

    acc = EventAccumulator(str(metrics / "tensorboard"))
    acc.Reload()
    assert {"loss", "throughput/samples_per_s", "comm/share", "time/step_s"} <= set(acc.Tags()["scalars"])
    assert acc.Scalars("loss")[-1].step == STEPS

    families = {f.name: f for f in text_string_to_metric_families((metrics / "hpc_train.prom").read_text())}
    step = families["hpc_train_step"].samples[0]
    assert step.value == STEPS and step.labels["job_id"] == job_id and re.fullmatch(r"n\d", step.labels["host"])
    assert families["hpc_train_loss"].samples[0].value == pytest.approx(rows[-1]["loss"])

    summary = cli("report", job_id)
    assert summary.returncode == 0, summary.stderr
    assert f"steps           {STEPS} ({STEPS} recorded)" in summary.stdout and "0 restarts" in summary.stdout
    pngs = sorted(p.name for p in (sandbox_job_root / job_id / "report").glob("*.png"))
    assert pngs == ["comm_share.png", "loss.png", "throughput.png"]

    logs = cli("logs", job_id, "--all")
    first = re.search(r"\[ranks 0-1\] rank 0/4 on (n\d)", logs.stdout)
    second = re.search(r"\[ranks 2-3\] rank 2/4 on (n\d)", logs.stdout)
    assert first and second and first.group(1) != second.group(1), logs.stdout
    watched = cli("status", job_id, "--watch")
    assert watched.returncode == 0 and f"job {job_id}: COMPLETED" in watched.stdout
