"""``report``: a job's metrics summarised and plotted on the login side, without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpc_train.jobs import report
from tests.conftest import REPO

PNG = b"\x89PNG\r\n\x1a\n"


def write_metrics(folder, runs, gpu=False, junk=False):
    """runs: (run, start_step, end_step); every step 0.1 s with 64 samples and 20 ms of communication."""
    lines, t = [], 1000.0
    for run, start, end in runs:
        lines.append(
            {
                "event": "run_start",
                "run": run,
                "start_step": start,
                "time": t,
                "job_id": "77",
                "backend": "torchrun",
                "world_size": 4,
                "device": "cuda" if gpu else "cpu",
            }
        )
        for step in range(start + 1, end + 1):
            first = step == start + 1
            step_s = 1.0 if first else 0.1  # a run's first step pays its warm-up
            t += step_s
            row = {
                "step": step,
                "time": t,
                "run": run,
                "step_s": step_s,
                "samples": 64,
                "samples_per_s": 64 / step_s,
                "loss": 10.0 / step + run * 1e-3,
                "comm_s": 0.02,
                "comm_share": 0.02 / step_s,
            }
            if gpu:
                row.update(gpu_util=80.0, gpu_mem_bytes=2 * 2**30)
            lines.append(row)
        lines.append({"event": "run_end", "run": run, "step": end, "time": t})
        t += 60
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if junk:
        text += '{"step": 999, "ti'  # a line still being written
    (folder / "metrics").mkdir(parents=True, exist_ok=True)
    (folder / "metrics" / "steps.jsonl").write_text(text)
    return folder


def test_summary_counts_restarts_and_takes_redone_steps_from_the_newest_run(tmp_path):
    m = report.load(write_metrics(tmp_path, [(1, 0, 30), (2, 20, 50)], junk=True))
    assert [r["step"] for r in m.rows] == list(range(1, 51))
    assert {r["run"] for r in m.rows if r["step"] > 20} == {2}  # steps 21..30 were redone by run 2
    s = report.summarize(m)
    assert s["runs"] == 2 and s["restarts"] == 1 and s["steps"] == 50 and s["missing_steps"] == 0
    assert s["samples_per_s"] == pytest.approx(640.0)  # each run's warm-up step left out
    assert s["comm_share"] == pytest.approx(0.2) and s["median_step_s"] == pytest.approx(0.1)
    assert s["final_loss"] == pytest.approx(10 / 50 + 2e-3) and s["job_id"] == "77"
    assert s["unreadable_lines"] == 1
    text = report.format_summary(s)
    assert "2 runs" not in text and "runs            2 (1 restart)" in text
    assert "640 samples/s" in text and "20.0% of step time" in text


def test_plots_are_pngs_and_gpu_only_with_gpu_data(tmp_path):
    m = report.load(write_metrics(tmp_path / "cpu", [(1, 0, 40), (2, 30, 80)]))
    paths = report.plot(m, tmp_path / "out")
    assert [p.name for p in paths] == ["loss.png", "throughput.png", "comm_share.png"]
    assert all(p.read_bytes().startswith(PNG) and p.stat().st_size > 10_000 for p in paths)
    gpu = report.plot(report.load(write_metrics(tmp_path / "gpu", [(1, 0, 20)], gpu=True)), tmp_path / "gpu-out")
    assert [p.name for p in gpu][-1] == "gpu.png"


def test_smoothing_follows_a_step_without_lag_at_the_start():
    assert report.smooth([5.0, 5.0, 5.0]) == pytest.approx([5.0, 5.0, 5.0])
    values = report.smooth([0.0] * 50 + [10.0] * 50)
    assert values[0] == 0 and 0 < values[55] < 10 and values[-1] > 9


def test_report_cli_writes_plots_and_never_imports_torch(tmp_path):
    write_metrics(tmp_path, [(1, 0, 25)])
    code = (
        "import sys, runpy\nsys.argv = ['hpc_train', 'report', sys.argv[1], '--json']\n"
        "try:\n    runpy.run_module('hpc_train', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('HEAVY=' + ','.join(m for m in ('torch', 'tensorboard') if m in sys.modules), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert "HEAVY=\n" in out.stderr, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["steps"] == 25 and len(summary["plots"]) == 3
    assert all((tmp_path / "report" / name).is_file() for name in ("loss.png", "throughput.png", "comm_share.png"))


def test_a_folder_without_metrics_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hpc_train", "report", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"no metrics in {tmp_path}" in out.stderr and "--no-metrics" in out.stderr


def write_ranks(folder, windows, named=(), run=1, hosts=("n1", "n1", "n2", "n2")):
    """Per-rank windows as the straggler monitor writes them (appended to steps.jsonl) and its named ranks."""
    lines = []
    for i, (last, compute) in enumerate(windows):
        known = sorted(compute)
        line = {
            "event": "ranks",
            "run": run,
            "time": 2000.0 + last,
            "first_step": last - 9,
            "last_step": last,
            "compute_ms": compute,
            "median_ms": (known[1] + known[2]) / 2,
        }
        if i == 0:
            line["hosts"] = list(hosts)
        lines.append(line)
    with (folder / "metrics" / "steps.jsonl").open("a") as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines))
    if named:
        (folder / "metrics" / "stragglers.jsonl").write_text("".join(json.dumps(n) + "\n" for n in named) + '{"rank": 1, "ho')


SLOW = {"rank": 3, "host": "n2", "slowdown": 0.8, "step": 30, "windows": 3, "run": 1, "compute_ms": 18.0, "median_ms": 10.0}


def test_stragglers_are_summarised_and_the_ranks_charted(tmp_path):
    write_metrics(tmp_path, [(1, 0, 50)])
    write_ranks(tmp_path, [(step, [10.0, 10.2, 9.9, 18.0]) for step in (10, 20, 30, 40, 50)], named=[SLOW])
    m = report.load(tmp_path)
    assert [r["step"] for r in m.rows] == list(range(1, 51))  # the window lines are not steps
    assert [w["last_step"] for w in m.windows] == [10, 20, 30, 40, 50] and m.hosts == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    s = report.summarize(m)
    assert s["rank_windows"] == 5 and s["ranks_compared"] == 4
    assert s["stragglers"] == [
        {k: SLOW[k] for k in ("rank", "host", "slowdown", "step", "windows", "run", "compute_ms", "median_ms")}
    ]
    assert s["slowest_rank"]["rank"] == 3 and s["slowest_rank"]["slowdown"] == pytest.approx(18 / 10.1 - 1, abs=1e-4)
    text = report.format_summary(s)
    assert (
        "  stragglers      rank 3 on n2: 80% slower than the median (compute 18.0 vs 10.0 ms/step), named at step 30 (run 1)"
    ) in text
    paths = report.plot(m, tmp_path / "out")
    assert [p.name for p in paths] == ["loss.png", "throughput.png", "comm_share.png", "ranks.png"]
    assert paths[-1].read_bytes().startswith(PNG) and paths[-1].stat().st_size > 10_000


def test_a_balanced_run_reports_nobody_and_a_big_world_is_charted_as_a_band(tmp_path):
    write_metrics(tmp_path, [(1, 0, 20)])
    write_ranks(tmp_path, [(10, [10.0 + (r % 3) * 0.1 for r in range(64)]), (20, [10.0] * 64)], hosts=["n"] * 64)
    s = report.summarize(report.load(tmp_path))
    assert s["stragglers"] == [] and "none named (2 windows of 64 ranks compared; slowest rank " in report.format_summary(s)
    assert report.plot(report.load(tmp_path), tmp_path / "out")[-1].name == "ranks.png"


def test_windows_a_requeued_run_redid_are_taken_from_the_newest_run(tmp_path):
    write_metrics(tmp_path, [(1, 0, 30), (2, 20, 50)])
    write_ranks(tmp_path, [(10, [1.0] * 4), (20, [1.0] * 4), (30, [9.0] * 4)], run=1)
    write_ranks(tmp_path, [(30, [2.0] * 4), (40, [2.0] * 4)], run=2)
    m = report.load(tmp_path)
    assert [(w["run"], w["last_step"]) for w in m.windows] == [(1, 10), (1, 20), (2, 30), (2, 40)]


def test_no_per_rank_data_no_straggler_section(tmp_path):
    s = report.summarize(report.load(write_metrics(tmp_path, [(1, 0, 10)])))
    assert "stragglers" not in s and "stragglers" not in report.format_summary(s)


def test_report_has_a_goodput_section_and_the_json_carries_it(tmp_path):
    write_metrics(tmp_path, [(1, 0, 30), (2, 20, 50)])
    (tmp_path / "last_run").write_text("2 0 ended\n")
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", "report", str(tmp_path), "--no-plots"], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert "  goodput         " in out.stdout and "(estimated)" in out.stdout
    assert "    recomputed steps    00:00:01" in out.stdout and "10 step(s) trained again after a restore" in out.stdout
    assert "    2    ?      21-50  completed" in out.stdout  # no host in these lines, said as unknown
    as_json = subprocess.run(
        [sys.executable, "-m", "hpc_train", "report", str(tmp_path), "--no-plots", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    g = json.loads(as_json.stdout)["goodput"]
    assert g["steps_recomputed"] == 10 and [r["ended"] for r in g["runs"]] == ["unknown", "completed"]
    quiet = subprocess.run(
        [sys.executable, "-m", "hpc_train", "report", str(tmp_path), "--no-plots", "--no-goodput"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert "goodput" not in quiet.stdout and "runs            2 (1 restart)" in quiet.stdout
