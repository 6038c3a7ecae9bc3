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


def test_a_job_is_queued_held_and_released_only_once_its_log_folder_exists(tmp_path):
    """On an idle cluster a job can start within milliseconds of sbatch, before submitit has made the folder
    its logs go to (seen on the sandbox: Slurm could not open the log and the job failed with no line written).
    sbatch stands in here to record the order; every cluster test's job goes through the same release."""
    root, bin_dir, calls = tmp_path / "jobs", tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    write(bin_dir / "sbatch", f'#!/bin/sh\necho "sbatch $*" >> {calls}\necho "Submitted batch job 4242"\n').chmod(0o755)
    write(bin_dir / "scontrol", f'#!/bin/sh\necho "scontrol $* folder:$(test -d {root}/4242 && echo made)" >> {calls}\n').chmod(
        0o755
    )
    for tool in ("srun", "sacct"):
        write(bin_dir / tool, "#!/bin/sh\nexit 0\n").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = submit(env, root)
    assert out.returncode == 0, out.stderr
    sbatch, scontrol = calls.read_text().splitlines()
    assert sbatch.startswith("sbatch --hold ") and scontrol == "scontrol release 4242 folder:made"
    held = submit(env, tmp_path / "held", "--sbatch", "hold")  # the user's own hold (#SBATCH --hold): theirs to release
    assert held.returncode == 0, held.stderr
    (user_held,) = calls.read_text().splitlines()[2:]  # no release
    assert user_held.startswith(f"sbatch {tmp_path / 'held'}/"), user_held
