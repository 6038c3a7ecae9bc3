"""NVML in a GPU job's metrics: rank 0's GPU utilisation and memory in use, sampled at each flush
(hpc_train/runtime/observe/metrics.py, _nvml_sampler: torch.cuda.utilization through nvidia-ml-py), in steps.jsonl,
the Prometheus file and `report`."""

from __future__ import annotations

import re

import pytest

from tests.gpu.helpers import cli, run


@pytest.mark.gpu
def test_nvml_gpu_utilisation_and_memory_are_in_the_metrics(tmp_path):
    # three 4096 x 4096 layers on batches of 4096: ~20 ms of kernels a step, so the GPU is busy when NVML
    # is read; a flush every 0.25 s (default 2 s) samples it several times in 40 steps
    args = ("--steps", "40", "--width", "4096", "--depth", "3", "--batch", "4096", "--lr", "0.001")
    job = run(tmp_path, "train", *args, env={"HPC_TRAIN_METRICS_FLUSH_S": "0.25"})
    [start] = job.events("run_start")
    assert start["device"] == "cuda"
    sampled = [row for row in job.steps() if "gpu_util" in row]
    assert sampled, "no step row has gpu_util: is nvidia-ml-py installed? " + job.log[-3000:]
    assert all(0 <= row["gpu_util"] <= 100 and row["gpu_mem_bytes"] > 0 for row in sampled), sampled
    assert max(row["gpu_util"] for row in sampled) > 0, sampled  # a busy GPU, seen busy
    prom = (job.folder / "metrics" / "hpc_train.prom").read_text()
    for gauge in ("hpc_train_gpu_utilization_ratio", "hpc_train_gpu_memory_used_bytes"):
        assert re.search(rf"^{gauge}\{{.*\}} \S+$", prom, re.MULTILINE), prom
    report = cli("report", str(job.folder), "--no-plots", "--no-goodput")
    assert report.returncode == 0, report.stderr
    assert re.search(r"GPU\s+\d+% utilised on average, \d+\.\d GiB at most", report.stdout), report.stdout
