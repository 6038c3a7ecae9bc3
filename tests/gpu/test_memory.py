"""--micro-batch auto against a real CUDA out-of-memory error: the job limits its own process to 1 GiB of
the GPU (torch.cuda.set_per_process_memory_fraction), where a batch of 8192 does not fit and 4096 does;
auto's probe runs into the allocator's OutOfMemoryError, chooses less, and the run finishes."""

from __future__ import annotations

import pytest

from tests.gpu.helpers import run

BATCH = 8192
BUDGET_MB = 1024  # the batch's activations and their gradients need ~1.5 GiB, half of it ~0.8 GiB


@pytest.mark.gpu
def test_micro_batch_auto_fits_the_batch_under_a_cuda_memory_limit(tmp_path):
    args = ("--steps", "3", "--batch", str(BATCH), "--budget-mb", str(BUDGET_MB))
    job = run(tmp_path, "memory", *args, micro_batch="auto")
    report = job.report("memory")
    assert report["device"] == "cuda:0"
    assert report["num_ooms"] >= 1  # the caching allocator raised a real OutOfMemoryError
    assert report["peak_bytes"] <= BUDGET_MB * 2**20
    assert report["steps"] == 3 and report["finite"]  # every batch trained once it fitted
    assert 1 <= report["micro_batch"] < BATCH
    [chosen, *halved] = job.events("micro_batch")
    # auto probes 1, 2, 4, ... samples (hpc_train/runtime/step/memory.py, MicroBatcher._choose)
    assert chosen["reason"] == "auto" and chosen["batch"] == BATCH and f"{BATCH} (too big)" in chosen["probed"], chosen
    assert chosen["micro_batch"] < BATCH
    # a later OOM in training halves it again: allowed, and said why
    assert all(event["reason"].startswith("out of memory with ") for event in halved), halved
    assert (halved[-1] if halved else chosen)["micro_batch"] == report["micro_batch"]
    per_step = -(-BATCH // chosen["micro_batch"])
    assert f"hpc_train: micro-batch {chosen['micro_batch']} of the batch of {BATCH} ({per_step} per step; auto)" in job.log
