"""Sweeps on the real Slurm sandbox: job arrays, split by MaxArraySize, resubmission, dependencies.

Tasks are tiny plain-Python scripts launched with the mpi backend's launch shim (no torch import),
so the whole module stays within seconds of scheduler time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

TASK = """\
import json, os, sys
folder = os.environ["HPC_TRAIN_JOB_FOLDER"]
received = {"argv": sys.argv[1:], "ckpt": os.environ["HPC_TRAIN_CHECKPOINT_DIR"], "array_task": os.environ["SLURM_ARRAY_TASK_ID"],
            "env": {k: v for k, v in os.environ.items() if k.startswith("HPC_TRAIN_SWEEP_")}}
with open(os.path.join(folder, "received.json"), "w") as f:
    json.dump(received, f)
print("task", os.environ["HPC_TRAIN_SWEEP_TASK"], "got", sys.argv[1:])
# a task given --fail-once fails its first attempt only (its folder remembers)
marker = os.path.join(folder, "failed-once")
if "--fail-once" in sys.argv and not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(3)
"""

STEP = """\
import os, sys, time
name, code, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
start = time.time()
time.sleep(pause)
with open(os.path.join(os.environ["HPC_TRAIN_JOB_ROOT"], name + ".json"), "w") as f:
    f.write('{"start": %r, "end": %r}' % (start, time.time()))
sys.exit(code)
"""

LIGHT = {"site": "sandbox", "backend": "mpi", "requeue": False}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, check=False, timeout=timeout
    )


def received(handle, task: int) -> dict:
    return json.loads((handle.task_folder(task) / "received.json").read_text())


def test_a_2x3_sweep_runs_six_tasks_each_with_its_own_overrides_and_folder(slurm_cluster, sandbox_job_root):
    import hpc_train

    script = sandbox_job_root / "task.py"
    script.write_text(TASK)
    out = cli(
        "submit",
        "--site",
        "sandbox",
        "--backend",
        "mpi",
        "--job-root",
        str(sandbox_job_root),
        "--sweep",
        "lr=1e-4,3e-4",
        "--sweep",
        "seed=0,1,2",
        "--max-concurrent",
        "4",
        "--wait",
        str(script),
        "--",
        "--steps",
        "5",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("Submitted sweep ") and "6 task(s) in 1 array(s)" in first, out.stdout
    sweep_id = first.split()[2].rstrip(":")
    assert "6 COMPLETED" in out.stderr

    handle = hpc_train.SweepHandle.from_id(sweep_id)  # a later process finds it by id
    grid = [(lr, seed) for lr in ("1e-4", "3e-4") for seed in ("0", "1", "2")]
    for task, (lr, seed) in enumerate(grid):
        got = received(handle, task)
        assert got["argv"] == ["--steps", "5", "--lr", lr, "--seed", seed]
        assert got["env"]["HPC_TRAIN_SWEEP_LR"] == lr and got["env"]["HPC_TRAIN_SWEEP_SEED"] == seed
        assert json.loads(got["env"]["HPC_TRAIN_SWEEP_OVERRIDES"]) == {"lr": lr, "seed": seed}
        assert got["ckpt"] == str(handle.task_folder(task) / "checkpoints")
        assert f"task {task} got" in handle.log_path(task).read_text()  # srun's log, in the task's folder
    status = json.loads(cli("status", sweep_id, "--json").stdout)
    assert status["counts"] == {"COMPLETED": 6} and status["failed"] == [] and status["arrays"] == [sweep_id]
    script_text = next((handle.folder / "slurm").glob("*_submission.sh")).read_text()
    assert "#SBATCH --array=0-5%4\n" in script_text


def test_a_sweep_over_max_array_size_is_split_runs_everything_and_resubmits_failures(slurm_cluster, sandbox_job_root):
    import hpc_train
    from hpc_train.sweeps.arrays import max_array_size

    limit = max_array_size()
    assert limit == 8, "tests/cluster/sandbox.sh sets MaxArraySize=8"
    script = sandbox_job_root / "task.py"
    script.write_text(TASK)
    over = [{"n": i} for i in range(limit + 2)]
    over[limit]["fail-once"] = "yes"  # task 8, in the second array, fails its first attempt
    handle = hpc_train.sweep(script, over=over, job_root=str(sandbox_job_root), **LIGHT)
    assert len(handle.array_ids) == 2 and len(handle) == limit + 2
    assert [len(a["tasks"]) for a in handle.record.arrays] == [limit, 2]

    counts = handle.wait(timeout_s=120)
    assert counts == {"COMPLETED": limit + 1, "FAILED": 1} and handle.failed() == [limit]
    assert handle.calls <= handle.cycles + 1  # one squeue call per cycle (sacct only for forgotten tasks)
    for task in range(limit + 2):
        got = received(handle, task)
        assert got["env"]["HPC_TRAIN_SWEEP_N"] == str(task) and got["argv"][:2] == ["--n", str(task)]
    assert received(handle, limit + 1)["array_task"] == "1"  # index 1 of the second array is sweep task 9

    status = cli("status", handle.sweep_id)
    assert status.returncode == 0 and f"COMPLETED {limit + 1}  FAILED 1" in status.stdout, status.stdout
    assert f"task {limit} FAILED: n={limit} fail-once=yes" in status.stdout

    again = cli("resubmit", handle.sweep_id, "--failed", "--parsable")
    assert again.returncode == 0, again.stderr
    later = hpc_train.SweepHandle.from_id(handle.sweep_id)
    assert later.array_ids[-1] == again.stdout.strip()
    assert later.wait(timeout_s=60) == {"COMPLETED": limit + 2} and later.failed() == []


def test_a_dependency_runs_only_after_its_parent_succeeded_and_a_sweep_cancels_whole(slurm_cluster, sandbox_job_root):
    import hpc_train

    script = sandbox_job_root / "step.py"
    script.write_text(STEP)
    options = dict(job_root=str(sandbox_job_root), **LIGHT)
    parent = hpc_train.submit(script, "train", "0", "3", **options)
    child = hpc_train.submit(script, "evaluate", "0", "0", after=parent, **options)
    bad = hpc_train.submit(script, "broken", "1", "0", **options)
    orphan = hpc_train.submit(script, "orphan", "0", "0", after=[bad.job_id], **options)
    sleepers = hpc_train.sweep(script, "sleeper", "0", "120", over={"k": ["1", "2"]}, **options)
    cancelled = cli("cancel", sleepers.sweep_id)
    assert cancelled.returncode == 0 and f"cancelled sweep {sleepers.sweep_id}" in cancelled.stdout, cancelled.stderr
    assert child.wait(timeout_s=90) == "COMPLETED" and parent.wait(timeout_s=5) == "COMPLETED"
    train = json.loads((sandbox_job_root / "train.json").read_text())
    evaluate = json.loads((sandbox_job_root / "evaluate.json").read_text())
    assert evaluate["start"] >= train["end"]
    assert orphan.wait(timeout_s=60) == "CANCELLED"  # afterok on a failed job can never be met
    assert bad.wait(timeout_s=5) == "FAILED" and not (sandbox_job_root / "orphan.json").exists()
    assert sleepers.wait(timeout_s=60) == {"CANCELLED": 2}
