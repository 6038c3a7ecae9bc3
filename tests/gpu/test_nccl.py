"""NCCL in a one-process job on one GPU: the process group hpc_train starts for a --parallel layout
(hpc_train/runtime/engine/parallel.py, _single_process_group: world 1 otherwise gets no process group at all,
hpc_train/runtime/engine/backend.py, init) all-reduces correctly, and the rank's heartbeat thread, asked as the hang
watchdog asks, dumps the NCCL flight recorder's collectives as JSON the watchdog can read."""

from __future__ import annotations

import pytest

from hpc_train.runtime.lifecycle.heartbeat import dump_folder
from hpc_train.runtime.supervise.hang_report import last_collectives
from hpc_train.runtime.supervise.watchdog import flight_records
from tests.gpu.helpers import run


@pytest.mark.gpu
def test_nccl_all_reduces_and_the_heartbeat_dumps_its_flight_record(tmp_path):
    # the plan turns the recorder on only where a watchdog runs (plan.py, FLIGHT_RECORDER_ENV), and the local
    # site runs none: the job sets it, and the heartbeat's folder, as the template would (base.sh.j2)
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "HPC_TRAIN_HEARTBEATS": str(tmp_path / "heartbeats")}
    job = run(tmp_path, "nccl", parallel="dp=1,tp=1,pp=1", env=env)
    report = job.report("nccl")
    assert report["backend"] == "nccl" and report["world"] == 1 and report["tensor_device"] == "cuda:0"
    assert report["summed"] == report["in_dp"] == report["expected"] == [1.0, 2.0, 3.0, 4.0]
    assert report["big"] == [report["big_expected"]]  # every one of 2**20 elements
    assert report["heartbeat"] and report["answered"], job.log[-3000:]
    # rank-0.fr.json, written before the stacks (heartbeat.Heartbeat._dump), read as the watchdog reads it
    records = flight_records(dump_folder(job.folder, 1), [0])
    assert 0 in records, f"no readable rank-0.fr.json in {dump_folder(job.folder, 1)}"
    names = [entry.get("profiling_name") for entry in records[0].get("entries") or []]
    # three all-reduces on the default group and the mesh's dp group: NCCL's, in the recorder that was dumped
    assert names.count("nccl:all_reduce") >= 3, f"the dumped flight record holds {names} (keys {sorted(records[0])})"
    newest = last_collectives(records[0])
    assert "nccl:all_reduce" in {name for _, name in newest.values()}, newest
