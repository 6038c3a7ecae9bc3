"""Why a job failed, from its logs (hpc_train.jobs.cause): the script's exception, not the launchers'."""

from __future__ import annotations

import subprocess
import sys

from hpc_train.jobs.cause import exceptions, failure_cause
from tests.conftest import REPO, write

# the shape of a local torchrun job's stderr when the script fails at import (abridged from a real one)
LOCAL = """\
Traceback (most recent call last):
  File "/home/u/bad.py", line 1, in <module>
    import torch_extras
ModuleNotFoundError: No module named 'torch_extras'
E1201 15:07:47.965000 22304 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
submitit ERROR (2026-12-01 15:07:48,468) - Submitted job triggered an exception
Traceback (most recent call last):
  File "/repo/hpc_train/submission/executor.py", line 71, in __call__
    raise RuntimeError(f"training script exited with status {code}")
RuntimeError: training script exited with status 1
"""

# a worker's lines under torchrun on Slurm carry a [rankN]: prefix; a requeued job's log holds every run
SLURM = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/u/train.py", line 40, in <module>
[rank1]:     x = batch["image"]
[rank1]: KeyError: 'image'
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate
torch.distributed.elastic.multiprocessing.api.SignalException: Process 12 got signal: 15
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/u/train.py", line 52, in <module>
[rank1]:     loss.backward()
[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered
"""


def test_the_scripts_exception_not_the_launchers(tmp_path):
    write(tmp_path / "7_0_log.err", LOCAL)
    assert (
        failure_cause(tmp_path) == "ModuleNotFoundError: No module named 'torch_extras' (at /home/u/bad.py, line 1; 7_0_log.err)"
    )


def test_the_last_runs_exception_and_the_first_task_that_has_one(tmp_path):
    write(tmp_path / "9_0_log.err", "W1201 a warning, no traceback\n")
    write(tmp_path / "9_1_log.err", SLURM)
    assert failure_cause(tmp_path) == (
        "RuntimeError: CUDA error: an illegal memory access was encountered (at /home/u/train.py, line 52; 9_1_log.err)")  # fmt: skip
    assert exceptions(SLURM.replace("[rank1]: ", "").splitlines())[0] == ("KeyError: 'image'", "/home/u/train.py, line 40")


def test_no_traceback_no_cause(tmp_path):
    write(tmp_path / "3_0_log.err", "srun: error: n2: task 1: Out Of Memory\n")
    assert failure_cause(tmp_path) is None
    assert failure_cause(tmp_path / "missing") is None


def test_a_failed_local_job_says_its_cause(tmp_path):
    script = write(tmp_path / "bad.py", "import a_module_nobody_has\n")
    out = subprocess.run([sys.executable, "-m", "hpc_train", "submit", "--site", "local", "--job-root", str(tmp_path / "jobs"),
                          "--wait", str(script)], capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert out.returncode == 1, out.stderr
    # it ran the snapshot's copy; the cause names the file the user edits, which held that code at submit
    assert f"cause: ModuleNotFoundError: No module named 'a_module_nobody_has' (at {script}, line 1, as submitted;" in out.stderr
