"""Between runs (hpc_train.runtime.supervise.between_runs): where a run began, the no-progress rule, the crash's node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hpc_train import contract
from hpc_train.runtime.supervise.between_runs import newest_step, no_progress, record_start


def commit(job: Path, step: int, complete: bool = True) -> None:
    folder = job / "checkpoints" / f"step-{step:08d}"
    folder.mkdir(parents=True)
    if complete:
        (folder / "COMMIT").write_text("{}")


def test_the_newest_committed_checkpoint_is_where_a_run_begins(tmp_path):
    assert newest_step(tmp_path) == -1
    commit(tmp_path, 25)
    commit(tmp_path, 50)
    commit(tmp_path, 75, complete=False)  # being written when the run ended: not a checkpoint
    assert newest_step(tmp_path) == 50
    record_start(tmp_path, 3)
    assert (tmp_path / "run_start_step").read_text().split() == ["3", "50"]


def test_a_restart_that_commits_nothing_new_stops_the_loop(tmp_path):
    commit(tmp_path, 25)
    record_start(tmp_path, 2)
    reason = no_progress(tmp_path, 2)
    assert reason is not None and "run 2" in reason and "step 25" in reason and "restart budget" in reason
    commit(tmp_path, 50)
    assert no_progress(tmp_path, 2) is None  # it got further: worth another try


def test_a_step_committed_only_on_the_nodes_own_disks_is_progress(tmp_path):
    commit(tmp_path, 25)
    record_start(tmp_path, 2)
    # the node-local tier committed step 50 on the nodes; its drain to shared storage was cut off
    (tmp_path / "checkpoints" / contract.LOCAL_NEWEST).write_text(json.dumps({"step": 50}))
    assert newest_step(tmp_path) == 50 and no_progress(tmp_path, 2) is None


def test_the_first_run_and_an_unrecorded_run_are_not_judged(tmp_path):
    record_start(tmp_path, 1)
    assert no_progress(tmp_path, 1) is None
    assert no_progress(tmp_path, 2) is None  # the record is run 1's: nothing known about run 2


def test_failed_writes_the_no_retry_file_and_names_the_crashed_node(tmp_path):
    beats = tmp_path / "heartbeats"
    beats.mkdir()
    for rank, host, error in ((0, "n1", "DistBackendError: Connection closed by peer"), (1, "n2", "RuntimeError: ECC")):
        record = {
            "rank": rank,
            "host": host,
            "run": 2,
            "steps": 0,
            "at": time.time() + rank * 0.1,
            "state": "failed",
            "error": error,
        }
        (beats / f"rank-{rank}.json").write_text(json.dumps(record))
    record_start(tmp_path, 2)
    env = {
        **os.environ,
        "HPC_TRAIN_JOB_FOLDER": str(tmp_path),
        "HPC_TRAIN_RUN": "2",
        "HPC_TRAIN_HEARTBEATS": str(beats),
        "HPC_TRAIN_NO_RETRY_FILE": str(tmp_path / "no_retry"),
    }
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.supervise.between_runs", "failed"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "failed without getting past the start" in (tmp_path / "no_retry").read_text()
    [suspect] = [json.loads(line) for line in (tmp_path / "suspect_nodes.jsonl").read_text().splitlines()]
    assert (suspect["node"], suspect["run"], suspect["reason"]) == ("n2", 2, "failed first")
    assert "the ranks on n2 failed first" in out.stderr


def test_the_next_step_runs_on_the_allocations_healthy_nodes(tmp_path):
    from hpc_train.runtime.supervise.between_runs import step_nodes

    # Slurm's own expansion of the node list; scontrol needs a config to start, not a controller
    (tmp_path / "slurm.conf").write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "HPC_TRAIN_NODES": "2", "SLURM_CONF": str(tmp_path / "slurm.conf")}
    assert step_nodes(tmp_path, env) == ["n1", "n2"]
    (tmp_path / "suspect_nodes.jsonl").write_text(json.dumps({"node": "n1", "run": 1, "reason": "hang"}) + "\n")
    assert step_nodes(tmp_path, env) == ["n2", "n3"]
    with open(tmp_path / "suspect_nodes.jsonl", "a") as out:
        out.write(json.dumps({"node": "n3", "run": 2, "reason": "failed first"}) + "\n")
    assert step_nodes(tmp_path, env) is None  # a restart inside the allocation is not possible now
    assert step_nodes(tmp_path, env, anyway=True) == ["n2", "n1"]  # a run's start takes what Slurm gave
