"""--profile torch on a GPU job: the trace of the chosen steps holds CUDA's activity (kernels run on the
device, recorded through CUPTI: hpc_train/runtime/observe/profiling.py adds ProfilerActivity.CUDA on a GPU), and
`report` splits the time by GPU kernels, not CPU operators."""

from __future__ import annotations

import json

import pytest

from tests.gpu.helpers import cli, run


@pytest.mark.gpu
def test_torch_profile_of_a_gpu_job_records_cuda_kernels_in_the_chosen_steps(tmp_path):
    job = run(tmp_path, "train", "--steps", "8", profile="torch:wait=2,warmup=1,active=2")
    [trace] = (job.folder / "profile" / "run-1").glob("rank-0.*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    steps = sorted(int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == [3, 4]  # wait 2 + warm-up 1: the run's steps 3 and 4 only
    kernels = [e for e in events if e.get("cat") == "kernel"]  # kineto's category for a device kernel
    assert kernels, sorted({str(e.get("cat")) for e in events})
    assert all(e.get("dur", 0) >= 0 for e in kernels)
    assert any(e.get("cat") == "cuda_runtime" for e in events)  # the host's launches, paired with them
    report = cli("report", str(job.folder), "--no-plots", "--no-goodput")
    assert report.returncode == 0, report.stderr
    # hpc_train/jobs/traces.py: with device events the split and the top operators are the GPU's
    assert "run 1 rank 0: steps 3-4, communication" in report.stdout and "of GPU kernels' self time" in report.stdout
    assert "(GPU kernels, run 1, ranks 0)" in report.stdout, report.stdout
