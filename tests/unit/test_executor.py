"""Submitting (hpc_train.submission.executor) when sbatch refuses: nothing left behind, the cause said once.

A fake sbatch stands in for the controller's refusal here; the real one is in
tests/e2e/test_torchrun_cluster.py::test_scheduler_rejection_is_reported_with_its_stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write

REFUSED = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"
UNREACHABLE = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"


@pytest.fixture
def refusing(tmp_path):
    def make(message: str) -> dict[str, str]:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        write(bin_dir / "sbatch", f"#!/bin/sh\necho '{message}' >&2\nexit 1\n").chmod(0o755)
        for tool in ("srun", "sacct"):
            write(bin_dir / tool, "#!/bin/sh\nexit 0\n").chmod(0o755)
        return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    return make


def submit(env: dict[str, str], root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = write(root.parent / "t.py", "print('hi')\n")
    return subprocess.run([sys.executable, "-m", "hpc_train", "submit", "--site", "sandbox", "--job-root", str(root),
                           *args, str(script)], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)  # fmt: skip


def test_a_refused_script_job_leaves_the_job_root_as_it_was_and_says_why_once(refusing, tmp_path):
    root = tmp_path / "jobs"
    write(root / "earlier-job" / "kept.txt", "an earlier job's file")
    out = submit(refusing(REFUSED), root)
    assert out.returncode == 69, out.stderr
    assert out.stderr.count("Invalid account") == 1, out.stderr
    assert "slurmctld up" not in out.stderr  # the controller answered: it refused the job
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["earlier-job", "earlier-job/kept.txt"]


def test_a_refused_function_job_leaves_no_pickle(refusing, tmp_path):
    root = tmp_path / "jobs"
    code = (f"import hpc_train\ntry:\n    hpc_train.submit(print, 'x', site='sandbox', job_root={str(root)!r})\n"
            "except hpc_train.SchedulerError as exc:\n    print('refused:', exc)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=refusing(REFUSED), cwd=REPO,
                         timeout=120)  # fmt: skip
    assert "refused: `sbatch <script>` failed" in out.stdout, out.stderr
    assert list(root.iterdir()) == []


def test_a_controller_that_does_not_answer_gets_the_hint(refusing, tmp_path):
    out = submit(refusing(UNREACHABLE), tmp_path / "jobs")
    assert out.returncode == 69 and "is slurmctld up? `scontrol ping` tells" in out.stderr, out.stderr
