"""Saving without stopping on the real cluster: every node writes its share of the replicated state in
the background, and a job stopped by the scheduler's signal and requeued ends exactly as one never
interrupted (same helpers and example as test_requeue_cluster.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from hpc_train.resume_shape import SHAPE
from hpc_train.runtime.checkpoint import shares as shard_save
from hpc_train.runtime.checkpoint.manager import COMMIT, STATE_FILE
from tests.e2e.test_requeue_cluster import (
    assert_identical,
    final_params,
    log_text,
    no_agent,
    progress,
    reference,
    state,
    submit,
    wait_for,
)

pytestmark = pytest.mark.e2e
STEPS = 300


# Horovod shares the path of MPI (one process per task, its own collectives): left out to keep make test short;
# the requeue tests save and restore shares under all four backends
@pytest.mark.parametrize("backend", ["torchrun", "mpi"])
def test_async_shards_from_two_nodes_resume_bit_for_bit(slurm_cluster, sandbox_job_root, tmp_path_factory, backend):
    job = submit(
        sandbox_job_root,
        backend,
        *no_agent(backend),
        "--async-checkpoint",
        "--checkpoint-every",
        "25",
        "--keep-checkpoints",
        "3",
        "--max-restarts",
        "4",
        script_args=("--step-seconds", "0.04"),
        steps=STEPS,
    )
    wait_for(lambda: progress(sandbox_job_root, job, 1) >= 60, 240, "run 1 to save twice", release=job)
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
    uninterrupted = reference(tmp_path_factory, backend, STEPS)  # the run's one uninterrupted job, beside this one
    wait_for(lambda: state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 600, "the job to finish", release=job)
    text = log_text(sandbox_job_root, job)
    assert state(job) == "COMPLETED", text[-3000:]
    assert "stop requested" in text and "hpc_train: run 2 of job" in text, text[-3000:]
    assert_identical(uninterrupted, final_params(sandbox_job_root, job))
    newest = sandbox_job_root / job / "checkpoints" / f"step-{STEPS:08d}"
    files = json.loads((newest / COMMIT).read_text())["files"]
    # one share from each node's rank, committed once both were durable
    assert set(files) == {STATE_FILE, SHAPE, shard_save.shard_name(0), shard_save.shard_name(1)}
