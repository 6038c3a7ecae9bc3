"""Stream a job's logs while it runs (``logs --follow``, ``submit --follow``), through its requeues.

One rank's log is copied through as it grows. ``--all`` follows every task's log and prefixes each
line with the ranks that task runs (a torchrun task holds a node's ranks). A requeued run appends to
the same files (``--open-mode=append``); a log that shrank was started over, and is read from its
beginning.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from hpc_train.jobs.handle import JobHandle
from hpc_train.jobs.poll import JobPoller


def task_ranks(handle: JobHandle, task: int) -> str:
    """The ranks whose output lands in ``task``'s log, for a line prefix: "rank 3", "ranks 0-1"."""
    record = handle.record
    per_task = max(1, record.procs_per_node // max(1, record.tasks_per_node))
    first = task * per_task
    return f"rank {first}" if per_task == 1 else f"ranks {first}-{first + per_task - 1}"


def task_log(handle: JobHandle, task: int, stream: str = "stdout") -> Path:
    suffix = "out" if stream == "stdout" else "err"
    return handle.folder / f"{handle.job_id}_{task}_log.{suffix}"


class _Source:
    """One growing file: what is new since the last read, restarting when the file was replaced or cut."""

    def __init__(self, path: Path, prefix: str | None) -> None:
        self.path, self.prefix = path, prefix
        self.offset = 0
        self.partial = ""

    def read(self) -> str:
        try:
            size = self.path.stat().st_size
        except OSError:
            return ""
        if size < self.offset:
            self.offset, self.partial = 0, ""  # truncated: a new run rewrote the log
        if size == self.offset:
            return ""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        text = chunk.decode(errors="replace")
        if self.prefix is None:
            return text
        text = self.partial + text
        lines = text.split("\n")
        self.partial = lines.pop()  # an unfinished line waits for its end
        return "".join(f"[{self.prefix}] {line}\n" for line in lines)

    def rest(self) -> str:
        text = self.read()
        if self.prefix is not None and self.partial:
            text += f"[{self.prefix}] {self.partial}\n"
            self.partial = ""
        return text


def sources(handle: JobHandle, rank: int = 0, stream: str = "stdout", all_ranks: bool = False) -> list[_Source]:
    if not all_ranks:
        return [_Source(handle.log_path(rank, stream), None)]
    return [_Source(task_log(handle, t, stream), task_ranks(handle, t)) for t in range(handle.record.num_tasks)]


def print_logs(handle: JobHandle, stream: str = "stdout", out: TextIO | None = None) -> int:
    """Every task's log once, prefixed; returns how many logs existed."""
    out = out or sys.stdout
    found = 0
    for source in sources(handle, stream=stream, all_ranks=True):
        if source.path.exists():
            found += 1
            out.write(source.rest())
    out.flush()
    return found


# how often the logs are read, and the job's state asked (at most: the requeue-aware rule may confirm sooner)
POLL_S = 0.5
STATE_EVERY_S = 2.0


def follow(handle: JobHandle, rank: int = 0, stream: str = "stdout", out: TextIO | None = None, all_ranks: bool = False) -> str:
    """Print the log(s) as they grow until the job ends; return the final state."""
    out, poll_s, state_every_s = out or sys.stdout, POLL_S, STATE_EVERY_S
    files = sources(handle, rank, stream, all_ranks)
    poller = JobPoller(handle, state_every_s, max_poll_s=state_every_s)
    next_look = 0.0

    def pump(final: bool = False) -> None:
        text = "".join(s.rest() if final else s.read() for s in files)
        if text:
            out.write(text)
            out.flush()

    while True:
        pump()
        if time.monotonic() >= next_look:
            look = poller.look()
            if look.final:
                time.sleep(poll_s)  # the last lines can land after the state changes
                pump(final=True)
                return look.state
            confirm = poller.rule.confirm_in()
            next_look = time.monotonic() + (state_every_s if confirm is None else min(confirm, state_every_s))
        time.sleep(poll_s)
