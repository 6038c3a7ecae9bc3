"""Stream a job's log while it runs (``logs --follow``, ``submit --follow``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from hpc_train.handle import ACTIVE_STATES, JobHandle


def follow(handle: JobHandle, rank: int = 0, stream: str = "stdout", out: TextIO | None = None,
           poll_s: float = 0.5, state_every_s: float = 2.0) -> str:
    """Print the log as it grows until the job ends; return the final state."""
    out = out or sys.stdout
    path = handle.log_path(rank, stream)
    offset = 0
    last_state_check = 0.0
    state = "UNKNOWN"
    while True:
        if path.exists():
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            if chunk:
                offset += len(chunk)
                out.write(chunk.decode(errors="replace"))
                out.flush()
        now = time.monotonic()
        if now - last_state_check >= state_every_s:
            last_state_check = now
            state = handle.state
            if state == "PENDING":
                handle.release_if_held()
            if state not in ACTIVE_STATES and handle.record.requeue:
                time.sleep(2.0)  # a job requeueing itself passes through an ended-looking state
                state = handle.state
            if state not in ACTIVE_STATES:
                # the last lines can land after the state changes; read once more
                time.sleep(poll_s)
                if path.exists():
                    with path.open("rb") as f:
                        f.seek(offset)
                        rest = f.read()
                    if rest:
                        out.write(rest.decode(errors="replace"))
                        out.flush()
                return state
        time.sleep(poll_s)
