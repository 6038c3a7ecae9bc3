"""A rank hung on the GPU with NCCL up: the hang watchdog finds it, its heartbeat thread dumps the stacks and
the NCCL flight record, the watchdog ends it, and `diagnose` says the run ended in a hang.

The local site runs no watchdog: the batch script starts one only where a run can be restarted, a Slurm site
with requeue on (hpc_train/submission/plan.py, _watchdog), and `--requeue` is refused on `local`. So the job
runs on the local site with the heartbeat on (HPC_TRAIN_HEARTBEATS, which the template exports where the
watchdog runs), and the test runs the real watchdog beside it as the batch script would, with the rank's
process as the step to end (the unit tests' way, tests/unit/test_watchdog.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_train.runtime.supervise.hang_report import last_collectives
from hpc_train.runtime.supervise.watchdog import flight_records
from tests.gpu.helpers import cli, finish, start, wait_for
from tests.unit.test_watchdog import env as watchdog_environment

HANG_TIMEOUT_S = 3


@pytest.mark.gpu
def test_a_rank_blocked_on_the_gpu_with_nccl_up_is_found_ended_and_diagnosed(tmp_path):
    beats = tmp_path / "heartbeats"
    env = {"HPC_TRAIN_HEARTBEATS": str(beats), "TORCH_FR_BUFFER_SIZE": "2000"}
    # --parallel dp=1,tp=1,pp=1: hpc_train starts an NCCL process group for the one rank (runtime/engine/parallel.py)
    job = start(tmp_path, "hang", "--steps", "20", parallel="dp=1,tp=1,pp=1", env=env)
    try:
        wait_for(job.folder / "hang.json", job)  # 20 steps done; the rank now waits on a spinning kernel
        rank = job.report("hang")
        assert rank["device"] == "cuda:0" and rank["backend"] == "nccl" and rank["steps"] == 20
        # what the batch script gives the watchdog (the unit tests' env(): job folder, run 1, world, timeout, no
        # SLURM_JOB_ID, so it ends the step by killing --step-pid), with the heartbeats where this job writes them
        watchdog_env = {**watchdog_environment(job.folder, str(HANG_TIMEOUT_S), world=1), "HPC_TRAIN_HEARTBEATS": str(beats)}
        started = time.monotonic()
        watch = subprocess.run(
            [sys.executable, "-m", "hpc_train.runtime.supervise.watchdog", "--step-pid", str(rank["pid"])],
            env=watchdog_env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        took = time.monotonic() - started
        finish(job, expect="FAILED")  # its rank was killed
    finally:
        if not job.handle.done():
            job.handle.cancel()
    assert watch.returncode == 0, watch.stderr
    assert "hpc_train: hang in run 1: no rank active for" in watch.stderr, watch.stderr
    [hang] = [json.loads(line) for line in (job.folder / "hangs.jsonl").read_text().splitlines()]
    # past the limit by at most the watchdog's poll (1 s) and the heartbeat file's (2 s); then the stacks (<= 5 s)
    assert HANG_TIMEOUT_S <= hang["quiet_s"] <= HANG_TIMEOUT_S + 3 and took < HANG_TIMEOUT_S + 20, (hang, took)
    assert hang["limit"] == "--hang-timeout" and hang["ranks"]["0"]["steps"] == 20, hang
    assert hang["culprits"] == []  # one rank: nobody to compare it with
    dumps = Path(hang["dumps"])
    stacks = (dumps / "rank-0.txt").read_text()
    # the heartbeat thread answered while the main thread waited on the device, without the GIL
    assert "in synchronize" in stacks and "in hang" in stacks, stacks
    records = flight_records(dumps, [0])
    assert 0 in records, f"no readable rank-0.fr.json in {dumps}"
    newest = last_collectives(records[0])
    # the all-reduce after each of the 20 steps, on the default group
    assert any(name == "nccl:all_reduce" and seq >= 20 for seq, name in newest.values()), (newest, sorted(records[0]))
    diagnose = cli("diagnose", str(job.folder), "--no-sacct")
    assert diagnose.returncode == 0, diagnose.stderr
    assert "hang (no rank active for" in diagnose.stdout, diagnose.stdout
