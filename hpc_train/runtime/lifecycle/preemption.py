"""Knowing when to stop: a signal, a flag file the batch script writes, or the wall clock.

Signal handlers only set a flag (no I/O, no collectives in a handler). A daemon thread turns the
flag file and the deadline into the same flag. The training loop asks at step boundaries, and the
ranks agree with one collective, so every rank saves the same step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping

from hpc_train import contract, scontrol

STOP_SIGNALS = ("SIGUSR2", "SIGTERM")


class StopWatcher:
    def __init__(self, environ: Mapping[str, str] | None = None, poll_s: float = 1.0) -> None:
        env = os.environ if environ is None else environ
        self.stop_file = env.get(contract.ENV_STOP_FILE) or None
        deadline = env.get(contract.ENV_DEADLINE)
        self.deadline = float(deadline) if deadline else None
        # the site's warning signal (--signal), which an admin's `scancel --signal` sends to every rank
        job_signal = "SIG" + (env.get(contract.ENV_STOP_SIGNAL) or "USR2").upper().removeprefix("SIG")
        self.job_signal = (job_signal,) if isinstance(getattr(signal, job_signal, None), signal.Signals) else ()
        self.reason: str | None = None
        self._event = threading.Event()
        self._poll_s = poll_s
        self._installed: dict[int, object] = {}
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()  # ends the watch thread without reporting a stop

    def start(self) -> StopWatcher:
        if threading.current_thread() is threading.main_thread():
            for name in {*STOP_SIGNALS, *self.job_signal}:
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
        # no thread of ours may outlive the runtime's shutdown (it runs just before the interpreter exits)
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None

    def _on_signal(self, signum: int, frame: object) -> None:
        self.request(f"signal {signal.Signals(signum).name}")

    def request(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def _watch(self) -> None:
        while not self._event.is_set() and not self._closed.is_set():
            if self.stop_file and os.path.exists(self.stop_file):
                self.request("stop requested (the batch script got the scheduler's signal)")
            elif self.deadline and time.time() >= self.deadline:
                self.request("the job's time limit is near")
            self._closed.wait(self._poll_s)

    @property
    def requested(self) -> bool:
        return self._event.is_set()


def requeue(job_id: str | None = None, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Ask Slurm to requeue this job; (done, what happened).

    Only for the run this process belongs to. An administrator's ``scontrol requeue`` or a preemption
    requeues the job while the ranks are still saving; a rank that then requeues too would requeue
    the *next* run, or a job that has since finished. So the controller is asked first: a job no
    longer running this run is already requeued, and nothing more is done.
    """
    env = os.environ if environ is None else environ
    job_id = job_id or env.get("SLURM_JOB_ID")  # an array task's own id works for requeue too
    if not job_id:
        return False, "not running under Slurm: resubmit the job to continue"
    info = scontrol.show("job", job_id)  # {} when the controller cannot be asked
    # SLURM_RESTART_COUNT is not kept reliably for array tasks: compare restarts only for plain jobs
    ours = None if env.get("SLURM_ARRAY_TASK_ID") else int(env.get("SLURM_RESTART_COUNT") or 0)
    newer = ours is not None and (info.get("Restarts") or "0").isdigit() and int(info.get("Restarts") or 0) > ours
    if info and (info.get("JobState") != "RUNNING" or newer):
        return True, (
            f"job {job_id} is already being requeued (now {info.get('JobState')}, "
            f"restart {info.get('Restarts')}); not requeueing it again"
        )
    try:
        out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"scontrol requeue {job_id} failed: {exc}"
    if out.returncode != 0:
        if "pending" in out.stderr.lower():  # requeued by someone else between the look and the call
            return True, f"job {job_id} was requeued by the scheduler meanwhile: {out.stderr.strip()}"
        # The requeue sends every process of the job TERM, this scontrol too: it can die (status -15, nothing
        # said) after the controller took the requeue. Seen in make test: "failed", then run 2 started.
        after = scontrol.show("job", job_id)
        if after and after.get("JobState") != "RUNNING":
            return (
                True,
                f"requeued job {job_id} (scontrol ended with status {out.returncode}; the job is {after.get('JobState')})",
            )
        return False, f"scontrol requeue {job_id} failed: {out.stderr.strip() or f'status {out.returncode}'}"
    return True, f"requeued job {job_id}"
