"""Each rank's last step and when, written where a watchdog outside the training process reads it.

A hung rank cannot report its own hang, so detection lives outside (hpc_train.runtime.supervise.watchdog, run
by the batch script); the rank only leaves a trace. ``beat()`` is the hot path: two stores. A daemon
thread writes ``<heartbeats>/rank-N.json`` when anything changed (at most every POLL_S), and answers
the watchdog's request for stacks: a thread still runs while the main thread waits in a collective or
sleeps (both release the GIL), so ``faulthandler`` writes every thread's stack to the run's dump folder.

On by ``HPC_TRAIN_HEARTBEATS`` (the template sets it when the watchdog runs); nothing otherwise.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from hpc_train import contract

# One small file per rank rewritten at most this often: the watchdog's resolution, and the load on a
# shared file system (1,000 ranks: 500 renames a second); hang timeouts are 10 s and up.
POLL_S = 2.0
# A rank quiet for QUIET_S is hung or waits for one that is: it looks for the watchdog's request every
# FAST_POLL_S, so the hang report does not wait out a poll. A training rank never polls faster, and a
# quiet one stops once it has answered (1,000 quiet ranks: 5,000 lookups a second, for seconds).
QUIET_S = 4.0
FAST_POLL_S = 0.2
REQUEST = "request"  # the watchdog creates <dumps>/run-R/request; each rank answers with rank-N.txt
FLIGHT_RECORD_SUFFIX = ".fr.json"  # ... and rank-N.fr.json, its flight recorder's collectives
# the recorder's ring buffer size: TORCH_FR_ since torch 2.6, the NCCL name before (the plan sets both)
FLIGHT_RECORDER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def dump_folder(job_folder: Path, run: int) -> Path:
    return job_folder / contract.DUMPS / f"run-{run}"


class Heartbeat:
    #: this process's heartbeat, once one runs: the boot's plain one (runtime/boot/hpc_train_watch), from
    #: ``import torch``, until the script's hpc_train.runtime Context starts its own, which replaces it
    current: ClassVar[Heartbeat | None] = None

    def __init__(self, folder: Path, rank: int, run: int, dumps: Path, poll_s: float = POLL_S, plain: bool = False) -> None:
        self.path = folder / f"rank-{rank}.json"
        self.rank, self.run, self.dumps = rank, run, dumps
        self.plain = plain  # kept by the optimizer's steps alone (no forward hook): see the watchdog
        self.host = socket.gethostname()
        self.steps = 0  # optimizer steps in this run
        self.at = time.time()
        self.state = "starting"
        self.error: str | None = None
        self._written: tuple[int, str, float] | None = None
        self._poll_s = poll_s
        self._seen_at, self._gap = self.at, 0.0  # progress as the thread last saw it, and the gap before
        self._closed = threading.Event()
        self._lock = threading.Lock()  # finishing() writes from the main thread, the loop from its own
        taken = Heartbeat.current
        if taken is not None and taken.plain and not plain:  # the script's Context takes over from the boot's
            taken.close()
        folder.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._loop, name="hpc_train-heartbeat", daemon=True)
        self._thread.start()
        Heartbeat.current = self

    @classmethod
    def from_env(cls, rank: int, environ: Mapping[str, str] | None = None, plain: bool = False) -> Heartbeat | None:
        env = os.environ if environ is None else environ
        folder, job_folder = env.get(contract.ENV_HEARTBEATS), env.get(contract.ENV_JOB_FOLDER)
        if not folder or not job_folder:
            return None
        run = int(env.get(contract.ENV_RUN) or 1)
        try:
            return cls(Path(folder), rank, run, dump_folder(Path(job_folder), run), plain=plain)
        except OSError:
            return None  # a heartbeat that cannot be written must not stop training

    def beat(self) -> None:
        """An optimizer step finished."""
        self.steps += 1
        self.at = time.time()

    def alive(self) -> None:
        """Work that is not a step (a forward pass): progress, without counting a step."""
        self.at = time.time()

    def finishing(self, error: BaseException | None = None) -> None:
        """Training ended on this rank (by ``error``, if given); the rest is not watched per step."""
        self.state = "failed" if error is not None else "finishing"
        self.error = None if error is None else f"{type(error).__name__}: {error}"[:500]
        self.at = time.time()
        self._write()

    def close(self) -> None:
        self._closed.set()
        if Heartbeat.current is self:
            Heartbeat.current = None
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        answered = ""  # the request last answered: the watchdog asks again after a quiet spell that was no hang
        while not self._closed.wait(self._next_wait()):
            if self.state == "starting" and self.steps:
                self.state = "training"
            if (self.steps, self.state, self.at) != self._written:
                self._write()
            asked = _request(self.dumps)
            if asked and asked != answered:
                self._dump()
                answered = asked

    def _next_wait(self) -> float:
        # quiet means longer than QUIET_S and than 3 of the rank's own gaps between progress (as often as
        # this thread sees them): a run of 8 s steps is not quiet between its steps
        at = self.at
        if at != self._seen_at:
            self._gap, self._seen_at = at - self._seen_at, at
        quiet_after = max(QUIET_S, 3 * self._gap)
        quiet_for = time.time() - at
        return FAST_POLL_S if quiet_for >= quiet_after else min(self._poll_s, quiet_after - quiet_for + FAST_POLL_S)

    def _write(self) -> None:
        written = (self.steps, self.state, self.at)
        record = {
            "rank": self.rank,
            "host": self.host,
            "pid": os.getpid(),
            "run": self.run,
            "steps": written[0],
            "at": written[2],
            "state": written[1],
            "error": self.error,
            **({"plain": True} if self.plain else {}),
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            with self._lock:
                tmp.write_text(json.dumps(record))
                os.replace(tmp, self.path)
            self._written = written
        except OSError:
            pass  # a full disk: the watchdog sees an old beat, which is what it would see of a hang

    def _dump(self) -> bool:
        # the flight record first: the watchdog reads once every rank's stacks file is there
        flight_record(self.dumps / f"rank-{self.rank}{FLIGHT_RECORD_SUFFIX}")
        target = self.dumps / f"rank-{self.rank}.txt"
        tmp = target.with_name(f".{target.name}.tmp")
        try:
            with open(tmp, "w") as out:
                out.write(
                    f"rank {self.rank} on {self.host} (pid {os.getpid()}), {self.steps} steps this run, "
                    f"last at {time.strftime('%H:%M:%S', time.localtime(self.at))}, cpu {time.process_time():.3f} s\n"
                )
                out.flush()
                faulthandler.dump_traceback(out, all_threads=True)
            os.replace(tmp, target)  # whole when it appears: the watchdog reads it the moment it does
        except OSError:
            pass
        return True


def _request(dumps: Path) -> str:
    """The watchdog's request, as it numbers them ("" when there is none)."""
    try:
        return (dumps / REQUEST).read_text().strip() or "1"
    except OSError:
        return ""


def flight_record(target: Path) -> bool:
    """torch.distributed's flight recorder, as JSON: the last collectives of each process group this rank
    entered, with their sequence numbers and states (on by TORCH_FR_BUFFER_SIZE; gloo and NCCL alike).

    Asked from this thread while the main one waits inside a collective: the recorder has its own lock.
    JSON, not the pickle torch also offers: the login side reads these files, and unpickling runs code.
    """
    if "torch.distributed" not in sys.modules or not any(os.environ.get(v) for v in FLIGHT_RECORDER_VARS):
        return False
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]  # private, no stub

        if not dist.is_initialized():
            return False
        data = _dump_fr_trace_json()
    except Exception:  # an older torch, a backend without a recorder: the stacks are still there
        return False
    try:
        target.write_bytes(data if isinstance(data, bytes) else str(data).encode())
    except OSError:
        return False
    return True
