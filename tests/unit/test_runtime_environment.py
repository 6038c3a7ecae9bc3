"""rt.init's view of the world under each launcher, from that launcher's real variables."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpc_train.runtime.launch.environment import detect, first_host
from hpc_train.runtime.options import RuntimeOptions
from tests.conftest import write

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "gpu01",
    "MASTER_PORT": "29611",
    "TORCHELASTIC_RUN_ID": "42",
    # the launcher task's own srun variables are still there in a torchrun worker
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "2",
}
SRUN_TASK = {
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NTASKS": "4",
}
MPIRUN = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
}
SUBMITIT_LOCAL = {"SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "2"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        (TORCHRUN, ("torchrun", 5, 1, 8, 4, 1, 2, "gpu01", 29611)),
        (SRUN_TASK, ("srun", 3, 1, 4, 2, 1, 2, "n1", 29500)),
        (MPIRUN, ("mpirun", 2, 0, 4, 2, 1, 2, "127.0.0.1", 29500)),
        (SUBMITIT_LOCAL, ("submitit-local", 1, 1, 2, 2, 0, 1, "127.0.0.1", 29500)),
        ({}, ("single", 0, 0, 1, 1, 0, 1, "127.0.0.1", 29500)),
        # the batch shell has SLURM_PROCID but no step: it is not a rank
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}, ("single", 0, 0, 1, 1, 0, 1, "127.0.0.1", 29500)),
    ],
)
def test_detect(environ, expected):
    env = detect(environ)
    got = (
        env.launcher,
        env.rank,
        env.local_rank,
        env.world_size,
        env.local_world_size,
        env.node_rank,
        env.num_nodes,
        env.master_addr,
        env.master_port,
    )
    assert got == expected


@pytest.mark.parametrize(
    "nodelist, first", [("n[1-2]", "n1"), ("gpu[07-09,12],cpu01", "gpu07"), ("a100-3", "a100-3"), ("node[3,5]", "node3")]
)
def test_first_host(nodelist, first):
    assert first_host(nodelist) == first


def test_launch_shim_maps_srun_to_torch_variables(tmp_path):
    probe = write(
        tmp_path / "probe.py",
        "import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], **{k: os.environ.get(k) for k in "
        "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'HPC_TRAIN_LAUNCHER')}}))\n",
    )
    env = {"PATH": "/usr/bin:/bin", **SRUN_TASK}
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.launch.worker", "--local-rank-arg", "--", str(probe), "--lr", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {
        "argv": ["--local_rank=1", "--lr", "1"],
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "n1",
        "HPC_TRAIN_LAUNCHER": "srun",
    }
    assert (
        detect({**SRUN_TASK, **{k: seen[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}, "HPC_TRAIN_LAUNCHER": "srun"}).launcher
        == "srun"
    )


def test_launch_shim_usage_errors():
    out = subprocess.run([sys.executable, "-m", "hpc_train.runtime.launch.worker", "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown option '--bogus'" in out.stderr


def test_runtime_options_job_wins_over_script_defaults():
    env = {
        "HPC_TRAIN_PRECISION": "bf16",
        "HPC_TRAIN_GRAD_ACCUM": "4",
        "HPC_TRAIN_GRAD_CLIP": "1.5",
        "HPC_TRAIN_BACKEND_OPTIONS": '{"zero_stage": 3}',
    }
    options = RuntimeOptions.from_env(env, precision="fp16", comm_hook="powersgd")
    assert (options.precision, options.grad_accum, options.grad_clip, options.comm_hook) == ("bf16", 4, 1.5, "powersgd")
    assert options.backend_options == {"zero_stage": 3}
    with pytest.raises(ValueError, match="precision must be one of"):
        RuntimeOptions.from_env({"HPC_TRAIN_PRECISION": "fp8"})
    with pytest.raises(TypeError, match="unknown runtime option"):
        RuntimeOptions.from_env({}, precison="bf16")
