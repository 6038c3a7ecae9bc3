"""Knowing when to stop: a signal, a flag file the batch script writes, or the wall clock.

Signal handlers only set a flag (no I/O, no collectives in a handler). A daemon thread turns the
flag file and the deadline into the same flag. The training loop asks at step boundaries, and the
ranks agree with one collective, so every rank saves the same step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

STOP_SIGNALS = ("SIGUSR2", "SIGTERM")


class StopWatcher:
    def __init__(self, environ: Mapping[str, str] | None = None, poll_s: float = 1.0) -> None:
        env = os.environ if environ is None else environ
        self.stop_file = env.get("HPC_TRAIN_STOP_FILE") or None
        deadline = env.get("HPC_TRAIN_DEADLINE")
        self.deadline = float(deadline) if deadline else None
        self.reason: str | None = None
        self._event = threading.Event()
        self._poll_s = poll_s
        self._installed: dict[int, object] = {}
        self._thread: threading.Thread | None = None

    def start(self) -> StopWatcher:
        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                signum = getattr(signal, name)
                self._installed[signum] = signal.signal(signum, self._on_signal)
        if self.stop_file or self.deadline:
            self._thread = threading.Thread(target=self._watch, name="hpc_train-stop-watcher", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        for signum, previous in self._installed.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._installed.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.request(f"signal {signal.Signals(signum).name}")

    def request(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def _watch(self) -> None:
        while not self._event.is_set():
            if self.stop_file and os.path.exists(self.stop_file):
                self.request("stop requested (the batch script got the scheduler's signal)")
            elif self.deadline and time.time() >= self.deadline:
                self.request("the job's time limit is near")
            self._event.wait(self._poll_s)

    @property
    def requested(self) -> bool:
        return self._event.is_set()


def requeue(job_id: str | None = None) -> tuple[bool, str]:
    """Ask Slurm to requeue this job; (done, what happened)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")  # an array task's own id works for requeue too
    if not job_id:
        return False, "not running under Slurm: resubmit the job to continue"
    try:
        out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"scontrol requeue {job_id} failed: {exc}"
    if out.returncode != 0:
        return False, f"scontrol requeue {job_id} failed: {out.stderr.strip()}"
    return True, f"requeued job {job_id}"


def log(message: str) -> None:
    print(f"hpc_train: {message}", file=sys.stderr, flush=True)
