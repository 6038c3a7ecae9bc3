"""Code snapshots on the real Slurm sandbox: a job queued behind a hold runs the code as it was submitted
though its project is edited meanwhile, `status` names the commit, `gc` keeps what a queued job needs and
takes what none does; a sweep's tasks share one snapshot and a resubmitted task runs it again.

The scripts are plain Python under the mpi backend's launch shim (no torch), so each job takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, write
from tests.unit.test_snapshot_files import git

pytestmark = pytest.mark.e2e

TRAIN = """\
import json, os, sys
from helper import VALUE
folder = os.environ.get("HPC_TRAIN_SWEEP_FOLDER") and os.path.join(os.environ["HPC_TRAIN_SWEEP_FOLDER"], os.environ["HPC_TRAIN_SWEEP_TASK"]) or os.environ["HPC_TRAIN_JOB_FOLDER"]
with open(os.path.join(folder, "ran.json"), "w") as f:
    json.dump({"value": VALUE, "script": __file__, "code": os.environ.get("HPC_TRAIN_CODE")}, f)
marker = os.path.join(folder, "failed-once")
if "--fail-once" in sys.argv and not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(3)
"""


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=cwd, timeout=180)


def project(root: Path, value: int) -> Path:
    script = write(root / "train.py", TRAIN)
    write(root / "helper.py", f"VALUE = {value}\n")
    return script


def trees(job_root: Path) -> set[str]:
    return {p.name for p in (job_root / "snapshots" / "trees").iterdir() if not p.name.startswith(".")}


def test_a_held_job_runs_the_code_as_submitted_and_gc_keeps_it_only_while_queued(slurm_cluster, sandbox_job_root):
    proj = sandbox_job_root / "proj"
    script = project(proj, 1)
    git(proj, "init", "-q", "-b", "main")
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "value 1")
    commit = git(proj, "rev-parse", "HEAD").strip()
    common = ("--site", "sandbox", "--backend", "mpi", "--no-requeue", "--job-root", str(sandbox_job_root))
    out = cli("submit", *common, "--sbatch", "hold", "--parsable", str(script))
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    record = json.loads((sandbox_job_root / job_id / "hpc_train.json").read_text())
    submitted = record["code"]["digest"]
    assert record["code"]["provenance"]["commit"] == commit and not record["code"]["provenance"]["dirty"]

    # the project changes while the job waits: the module it imports, and a commit on top
    write(proj / "helper.py", "VALUE = 2\n")
    git(proj, "commit", "-q", "-am", "value 2")
    rendered = cli("render", *common, str(script))  # stores the edited project's snapshot, which no job runs
    assert rendered.returncode == 0, rendered.stderr
    unused = (trees(sandbox_job_root) - {submitted}).pop()
    two_hours_ago = time.time() - 7200
    for digest in (submitted, unused):  # both old enough to go, were they not needed
        os.utime(sandbox_job_root / "snapshots" / "trees" / digest, (two_hours_ago, two_hours_ago))

    # a submit past the site's gc_above collects what no queued job needs: the render's, not the held job's
    site = write(sandbox_job_root / "site.yaml", "extends: sandbox\nsnapshot:\n  gc_above: 2\n")
    write(proj / "helper.py", "VALUE = 3\n")
    other = cli("submit", *common[:1], str(site), *common[2:], "--sbatch", "hold", "--parsable", str(script))
    assert other.returncode == 0, other.stderr
    third = json.loads((sandbox_job_root / other.stdout.strip() / "hpc_train.json").read_text())["code"]["digest"]
    assert trees(sandbox_job_root) == {submitted, third}
    assert cli("cancel", other.stdout.strip()).returncode == 0
    kept = cli("gc", "--job-root", str(sandbox_job_root), "--min-age", "0")  # the cancelled job's goes, the held one's stays
    assert kept.returncode == 0 and "removed 1 snapshot(s)" in kept.stdout, kept.stdout + kept.stderr
    assert trees(sandbox_job_root) == {submitted}

    status = cli("status", job_id)
    assert f"code: commit {commit[:12]} (main), snapshot {submitted[:12]}" in status.stdout, status.stdout
    subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)  # SLURM_CONF: the sandbox's
    import hpc_train

    assert hpc_train.job(job_id).wait(timeout_s=120) == "COMPLETED"
    ran = json.loads((sandbox_job_root / job_id / "ran.json").read_text())
    assert ran["value"] == 1 and ran["code"].endswith(submitted) and ran["script"].startswith(ran["code"])
    collected = cli("gc", "--job-root", str(sandbox_job_root), "--min-age", "0")
    assert "removed 1 snapshot(s)" in collected.stdout and trees(sandbox_job_root) == set()
    assert not [p for p in (sandbox_job_root / "snapshots" / "objects").rglob("*") if p.is_file()]  # no tree holds them


def test_a_sweep_shares_one_snapshot_and_a_resubmitted_task_runs_it_again(slurm_cluster, sandbox_job_root):
    proj = sandbox_job_root / "proj"
    script = project(proj, 1)
    out = cli(
        "submit", "--site", "sandbox", "--backend", "mpi", "--no-requeue", "--job-root", str(sandbox_job_root),
        "--sweep", "seed=0,1,2", "--wait", "--parsable", str(script), "--", "--fail-once",
    )  # fmt: skip
    sweep_id = out.stdout.strip().splitlines()[0]
    assert out.returncode != 0 and sweep_id.isdigit(), out.stdout + out.stderr  # every task failed once
    assert len(trees(sandbox_job_root)) == 1
    write(proj / "helper.py", "VALUE = 2\n")  # edited before the failed tasks go again
    again = cli("resubmit", sweep_id, "--failed", "--parsable")
    assert again.returncode == 0, again.stderr
    import hpc_train

    handle = hpc_train.SweepHandle.from_id(sweep_id)
    assert handle.wait(timeout_s=120) == {"COMPLETED": 3}
    for task in range(3):
        assert json.loads((handle.task_folder(task) / "ran.json").read_text())["value"] == 1
    assert len(trees(sandbox_job_root)) == 1  # the resubmission took no snapshot of its own
