"""Each run of the job: where and when it ran, what it trained, and how it ended, told from the evidence in
order of how much it says (a hang report, a failure line, a stop line, the last run's outcome, sacct).
"""

from __future__ import annotations

from typing import Any

from hpc_train.jobs.goodput.records import Allocation, Files, RunView, as_int, as_number


def run_numbers(files: Files) -> list[int]:
    known = set(files.starts) | set(files.rows) | set(files.hangs) | set(files.log.starts) | set(files.log.failures)
    highest = max(known | {files.runs_counter, files.last_run.run if files.last_run else 0})
    if files.log.not_started == highest and highest not in files.starts:
        highest -= 1  # counted, then refused by the restart budget: it never ran
    return list(range(1, highest + 1))


def run_view(files: Files, run: int) -> RunView:
    view = RunView(run)
    rows = files.rows.get(run, [])
    start = files.starts.get(run, {})
    view.start_step = as_int(start.get("start_step"))
    if view.start_step is None and files.start_step and files.start_step[0] == run:
        view.start_step = max(0, files.start_step[1])
    if rows:
        view.first_step, view.last_step, view.steps = rows[0]["step"], rows[-1]["step"], len(rows)
    view.begin = files.log.starts.get(run, (None, ""))[0] or as_number(start.get("time"))
    own_end = [
        as_number(files.ends.get(run, {}).get("time")),
        rows[-1]["time"] if rows else None,
        as_number(files.hangs.get(run, {}).get("at")),
    ]
    view.end = max((t for t in own_end if t is not None), default=view.begin)
    view.hosts = _hosts(files, run)
    view.suspects = [
        f"{s['node']} ({s.get('reason', '?')}" + (", excluded)" if s["node"] in files.excluded else ")")
        for s in files.suspects
        if s.get("run") == run
    ]
    view.stragglers = [
        f"rank {s['rank']} on {s.get('host', '?')}" + (f" +{s['slowdown'] * 100:.0f}%" if as_number(s.get("slowdown")) else "")
        for s in files.stragglers
        if s.get("run") == run
    ]
    return view


def _hosts(files: Files, run: int) -> list[str]:
    """Every rank's host from the run's first window, else rank 0's host, else the batch shell's."""
    for window in files.windows:
        if window.get("run") == run and isinstance(window.get("hosts"), list):
            return sorted({str(h) for h in window["hosts"]})
    hang_hosts = {
        str(r.get("host"))
        for r in (files.hangs.get(run, {}).get("ranks") or {}).values()
        if isinstance(r, dict) and r.get("host")
    }
    if hang_hosts:
        return sorted(hang_hosts)
    host = files.starts.get(run, {}).get("host") or files.log.starts.get(run, (None, ""))[1]
    return [str(host)] if host else []


def _hang_phrase(hang: dict[str, Any], start_step: int | None) -> str:
    culprits = [c for c in hang.get("culprits") or [] if isinstance(c, dict)]
    quiet = f"no rank active for {hang['quiet_s']:.0f} s" if as_number(hang.get("quiet_s")) is not None else "no progress"
    if not culprits:
        return f"hang ({quiet}; no rank stands out, see {hang.get('dumps', 'the stacks')})"
    parts = []
    for c in culprits:
        steps = as_int(c.get("steps"))
        step = f", last step {steps + (start_step or 0)}" if steps is not None else ""
        top = c.get("top") or []
        at = f", at {top[0]}" if top else ""
        parts.append(f"rank {c.get('rank')} on {c.get('host', '?')}{step}{at} ({c.get('reason', '?')})")
    return f"hang ({quiet}): " + "; ".join(parts)


def _stop_phrase(step: int, reason: str) -> tuple[str, str]:
    why = "time limit" if "time limit" in reason else "preemption or requeue"
    return "stopped", f"stopped at step {step} for a {why} ({reason})"


_STATES = {
    "COMPLETED": ("completed", "completed"),
    "TIMEOUT": ("stopped", "ended by the time limit (TIMEOUT)"),
    "PREEMPTED": ("requeued", "preempted"),
    "REQUEUED": ("requeued", "requeued by the scheduler or an administrator"),
    "NODE_FAIL": ("failed", "a node failed (NODE_FAIL)"),
    "CANCELLED": ("failed", "cancelled"),
    "OUT_OF_MEMORY": ("failed", "out of memory"),
    "RUNNING": ("running", "running"),
}


def ending(files: Files, view: RunView, later: bool, alloc: Allocation | None, last_in_alloc: bool) -> tuple[str, str]:
    """(kind, phrase): the evidence in order of how much it says."""
    run = view.run
    failure = files.log.failures.get(run)
    follow = f"; {failure[1]}" if failure and failure[1] else ""
    hang = files.hangs.get(run)
    if hang is not None or files.hang_run == run:
        phrase = _hang_phrase(hang, view.start_step) if hang else "hang (the watchdog ended it; its report is missing)"
        return "hang", phrase + follow
    if failure is not None:
        kind = "restarted" if "inside the allocation" in failure[1] else "failed"
        return kind, f"failed with exit {failure[0]}{follow}"
    if run in files.log.stops:
        kind, phrase = _stop_phrase(*files.log.stops[run])
        state = alloc.state if alloc and last_in_alloc else ""
        return ("requeued", phrase + "; requeued") if later or state in ("REQUEUED", "PREEMPTED") else (kind, phrase)
    outcome = files.last_run
    if outcome is not None and outcome.run == run:
        if outcome.requeued:
            return "requeued", "requeued"
        return ("completed", "completed") if outcome.status == 0 else ("failed", f"failed with exit {outcome.status}")
    if alloc is not None and last_in_alloc and alloc.state:
        if alloc.state == "FAILED":
            return "failed", f"failed with exit {alloc.exit_code.split(':')[0] or '?'}"
        kind, phrase = _STATES.get(alloc.state, ("unknown", alloc.state.lower()))
        return kind, phrase + (" (requeued)" if later and alloc.state == "PREEMPTED" else "")
    if later:
        return "unknown", f"ended; run {run + 1} followed (no record of why)"
    if run in files.ends:
        return "unknown", "ended (rank 0 closed its metrics; no exit status recorded)"
    return "unknown", "no record of its end (still running, or killed)"
