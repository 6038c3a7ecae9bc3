"""Submitting tests/gpu/gpu_job.py to the `local` site (the Python API, as a user's script would) and
reading what the job left in its folder: the rank's report, its metrics, its log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import REPO

JOB_SCRIPT = Path(__file__).resolve().with_name("gpu_job.py")
# one job: python and torch start twice (torchrun, then the rank), CUDA and NCCL start, then seconds of training
# (each mode takes about 10 s on a 2-core machine without a GPU)
JOB_TIMEOUT_S = 90.0


class Job:
    """A job of the local site and the files it writes (its folder is <job root>/<job id>)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    @property
    def folder(self) -> Path:
        return Path(self.handle.folder)

    @property
    def log(self) -> str:
        """Rank 0's stdout and stderr (the job's one task)."""
        return (self.handle.stdout(rank=0) or "") + (self.handle.stderr(rank=0) or "")

    def report(self, mode: str) -> dict[str, Any]:
        """What gpu_job.py's MODE wrote (<job folder>/<mode>.json)."""
        path = self.folder / f"{mode}.json"
        assert path.exists(), f"the job wrote no {path.name}; its log ends:\n{self.log[-4000:]}"
        return json.loads(path.read_text())

    def metrics(self) -> list[dict[str, Any]]:
        """Every line of metrics/steps.jsonl (hpc_train.runtime.observe.metrics, written by rank 0)."""
        path = self.folder / "metrics" / "steps.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def steps(self) -> list[dict[str, Any]]:
        """The per-step rows (the lines without an "event")."""
        return [line for line in self.metrics() if "event" not in line]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.metrics() if line.get("event") == kind]


def start(job_root: Path, mode: str, *args: str, **options: Any) -> Job:
    """Submit ``gpu_job.py MODE ARGS`` to the local site with these job options; returns at once."""
    import hpc_train

    handle = hpc_train.submit(str(JOB_SCRIPT), mode, *args, site="local", job_root=str(job_root), **options)
    return Job(handle)


def finish(job: Job, expect: str = "COMPLETED", timeout_s: float = JOB_TIMEOUT_S) -> Job:
    """Wait for the job to end as ``expect``; a job still running after ``timeout_s`` is cancelled."""
    try:
        state = job.handle.wait(poll_s=0.5, timeout_s=timeout_s)
    except TimeoutError:
        job.handle.cancel()
        raise AssertionError(
            f"job {job.handle.job_id} still running after {timeout_s:g} s; its log ends:\n{job.log[-4000:]}"
        ) from None
    assert state == expect, f"job {job.handle.job_id} ended {state}, not {expect}; its log ends:\n{job.log[-4000:]}"
    return job


def run(job_root: Path, mode: str, *args: str, **options: Any) -> Job:
    """Submit and wait for a job that must complete."""
    return finish(start(job_root, mode, *args, **options))


def wait_for(path: Path, job: Job, timeout_s: float = JOB_TIMEOUT_S) -> None:
    """Until ``path`` exists (written whole: gpu_job.write renames it into place) while the job runs."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert not job.handle.done(), (
            f"job {job.handle.job_id} ended before writing {path.name}; its log ends:\n{job.log[-4000:]}"
        )
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s:g} s; the job's log ends:\n{job.log[-4000:]}"
        time.sleep(0.2)


def cli(*args: str, timeout_s: float = JOB_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m hpc_train ARGS`` as a user types it."""
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout_s)
