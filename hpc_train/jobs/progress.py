"""A job's life on the login node while you wait (``submit --wait``, ``status --watch``).

Each poll takes one snapshot (the controller's state, reason and nodes, the run counter, the newest
metrics line, the ranks named as stragglers) and turns what changed into events: pending and why,
running where, a straggler named, requeued, finished. On a terminal a live line (rich) shows the current step, throughput and loss under the
events; elsewhere (CI logs, pipes) the events are plain lines, with a progress line now and then.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from hpc_train import contract
from hpc_train.jobs.handle import JobHandle
from hpc_train.jobs.poll import MAX_POLL_S, JobPoller, Look
from hpc_train.jobs.states import ACTIVE_STATES, PENDING_STATES

PLAIN_PROGRESS_EVERY_S = 30.0


@dataclass
class Snapshot:
    state: str
    reason: str = ""
    nodes: str = ""
    elapsed: str = ""
    runs: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    stragglers: list[dict[str, Any]] = field(default_factory=list)  # stragglers.jsonl, oldest first


def last_metrics(handle: JobHandle, tail_bytes: int = 8192) -> dict[str, Any]:
    """The newest step line of the job's metrics file (read from its end), or {}."""
    path = handle.folder / contract.METRICS / contract.STEPS
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # half-written, or cut by the seek
        if isinstance(record, dict) and "step" in record and "event" not in record:
            return record
    return {}


def stragglers(handle: JobHandle, limit_bytes: int = 65536) -> list[dict[str, Any]]:
    """The ranks named slower than the others (one line each, hpc_train.runtime.observe.straggler), or []."""
    path = handle.folder / contract.METRICS / contract.STRAGGLERS
    try:
        with path.open("rb") as f:
            text = f.read(limit_bytes).decode(errors="replace")  # a line per naming: small
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            out.append(record)
    return out


def straggler_line(named: dict[str, Any]) -> str:
    where = f" on {named['host']}" if named.get("host") else ""
    slower = f" is {named['slowdown'] * 100:.0f}% slower than the median" if named.get("slowdown") is not None else ""
    at = f" (step {named['step']})" if named.get("step") is not None else ""
    return f"straggler: rank {named['rank']}{where}{slower}{at}"


def stragglers_text(named: list[dict[str, Any]], run: int) -> str:
    """The live line's part: this run's named ranks, the slowest first."""
    current = [s for s in named if s.get("run", run) == run] if run else named
    if not current:
        return ""
    latest = {s["rank"]: s for s in current}  # a rank named twice: its newest naming
    ranked = sorted(latest.values(), key=lambda s: -(s.get("slowdown") or 0))
    parts = [
        f"rank {s['rank']}"
        + (f" ({s['host']})" if s.get("host") else "")
        + (f" +{s['slowdown'] * 100:.0f}%" if s.get("slowdown") is not None else "")
        for s in ranked[:3]
    ]
    more = f" +{len(ranked) - 3} more" if len(ranked) > 3 else ""
    return ("straggler " if len(ranked) == 1 else "stragglers ") + ", ".join(parts) + more


def snapshot(handle: JobHandle, look: Look) -> Snapshot:
    info = look.info
    reason = info.get("Reason", "")
    return Snapshot(
        state=look.state,
        reason="" if reason in ("None", "(null)") else reason,
        nodes=info.get("NodeList", "") if info.get("NodeList") not in (None, "(null)") else "",
        elapsed=info.get("RunTime", ""),
        runs=handle.runs,
        metrics=last_metrics(handle),
        stragglers=stragglers(handle),
    )


def progress_text(m: dict[str, Any]) -> str:
    parts = [f"step {m['step']}"] if "step" in m else []
    if m.get("samples_per_s") is not None:
        parts.append(f"{m['samples_per_s']:,.0f} samples/s")
    if m.get("loss") is not None:
        parts.append(f"loss {m['loss']:.4g}")
    return " · ".join(parts)


def events(job_id: str, before: Snapshot | None, now: Snapshot) -> list[str]:
    """What a person should be told about the change from ``before`` to ``now``."""
    out: list[str] = []
    was = before.state if before else None
    if now.state in PENDING_STATES:
        requeued = was in ("RUNNING", "COMPLETING") or (before is not None and now.runs > before.runs and was != "RUNNING")
        if requeued or (now.state == "REQUEUED" and was != "REQUEUED"):
            out.append(
                f"job {job_id}: requeued after run {max(1, now.runs)}; waiting to start again"
                + (f" ({now.reason})" if now.reason else "")
            )
        elif was != now.state or (before and before.reason != now.reason):
            out.append(f"job {job_id}: {now.state}" + (f" ({now.reason})" if now.reason else ""))
    elif now.state == "RUNNING":
        if was != "RUNNING" or (before and now.runs > before.runs):
            run = f"run {now.runs}" + (" after a requeue" if now.runs > 1 else "") if now.runs else ""
            where = f" on {now.nodes}" if now.nodes else ""
            out.append(f"job {job_id}: RUNNING{where}" + (f" ({run})" if run else ""))
    elif now.state not in ACTIVE_STATES:
        runs = f", {now.runs} runs" if now.runs > 1 else ""
        took = f" after {now.elapsed}" if now.elapsed else ""
        done = progress_text(now.metrics)
        out.append(f"job {job_id}: {now.state}{took}{runs}" + (f" ({done})" if done else ""))
    elif was != now.state:
        out.append(f"job {job_id}: {now.state}")
    told = len(before.stragglers) if before is not None else 0  # a first look tells what a watcher missed
    named = [f"job {job_id}: {straggler_line(s)}" for s in now.stragglers[told:]]
    if named and out and now.state not in ACTIVE_STATES:
        out[-1:-1] = named  # in the order it happened: named during the run, then the end
    else:
        out += named
    return out


class _Plain:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.last_progress = 0.0
        self.last_step: Any = None

    def event(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def update(self, job_id: str, snap: Snapshot) -> None:
        now = time.monotonic()
        step = snap.metrics.get("step")
        if (
            snap.state == "RUNNING"
            and step is not None
            and step != self.last_step
            and now - self.last_progress >= PLAIN_PROGRESS_EVERY_S
        ):
            self.last_progress, self.last_step = now, step
            slow = stragglers_text(snap.stragglers, snap.runs)
            print(f"job {job_id}: {progress_text(snap.metrics)}" + (f" · {slow}" if slow else ""), file=self.out, flush=True)

    def close(self) -> None:
        pass


class _Live:
    """A spinner line under the events, redrawn in place (rich)."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        self.console = Console(file=out)
        self.spinner = Spinner("dots", text="submitting", style="cyan")
        self.live = Live(self.spinner, console=self.console, refresh_per_second=8, transient=True)
        self.live.start()

    def event(self, line: str) -> None:
        self.live.console.print(line, highlight=False)

    def update(self, job_id: str, snap: Snapshot) -> None:
        from rich.text import Text

        text = Text(f"job {job_id} ", style="bold")
        text.append(snap.state, style={"RUNNING": "green", "PENDING": "yellow"}.get(snap.state, "magenta"))
        details = []
        if snap.state in PENDING_STATES and snap.reason:
            details.append(snap.reason)
        if snap.state == "RUNNING":
            details += [
                x
                for x in (
                    snap.nodes,
                    f"run {snap.runs}" if snap.runs > 1 else "",
                    snap.elapsed,
                    progress_text(snap.metrics),
                    stragglers_text(snap.stragglers, snap.runs),
                )
                if x
            ]
        if details:
            text.append("  " + " · ".join(details), style="dim")
        self.spinner.update(text=text)

    def close(self) -> None:
        self.live.stop()


def watch(
    handle: JobHandle, out: TextIO | None = None, *, tty: bool | None = None, poll_s: float = 1.0, timeout_s: float | None = None
) -> str:
    """Show the job's life until it ends (through its requeues); return its final state.

    Like :meth:`JobHandle.wait`, it releases a requeued job from Slurm's hold where the site allows.
    """
    out = out or sys.stdout
    if tty is None:
        tty = bool(getattr(out, "isatty", lambda: False)())
    display: _Plain | _Live = _Live(out) if tty else _Plain(out)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    poller = JobPoller(handle, poll_s, MAX_POLL_S)
    before: Snapshot | None = None
    try:
        while True:
            look = poller.look()
            snap = snapshot(handle, look)
            lines: list[str] = []
            if look.final or snap.state in ACTIVE_STATES:  # an end not yet believed is not told
                lines = events(handle.job_id, before, snap)
                for line in lines:
                    display.event(line)
                display.update(handle.job_id, snap)
                before = snap
            if look.final:
                return snap.state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {handle.job_id} still {snap.state} after {timeout_s} s")
            poller.pause(changed=bool(lines))
    finally:
        display.close()
