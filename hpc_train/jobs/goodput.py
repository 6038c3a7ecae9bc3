"""Goodput: how much of a job's allocation trained new steps, where the rest went, and how each run ended.

Pure functions over the job folder (read on the login node, never imports torch):

- ``metrics/steps.jsonl``: ``run_start``/``run_end`` events, one line per step (``time`` is the end of
  the step, ``step_s`` its length), ``"event": "ranks"`` windows of per-rank compute times;
- ``metrics/stragglers.jsonl``, ``hangs.jsonl``, ``suspect_nodes.jsonl``, ``exclude_nodes``, ``hang_run``,
  ``run_start_step``, ``runs``, ``last_run`` (the batch script's and the runtime's files, hpc_train.contract);
- the batch log (``<job>_0_log.out``/``.err``): ``hpc_train: run N of job J on HOST at DATE`` as each run
  begins, ``run N failed (exit S); requeueing|restarting inside the allocation``, rank 0's
  ``run N: stopping at step S: REASON`` and ``saved step S to ...``;
- the committed checkpoints' step numbers (a save stalls the step after it);
- optionally Slurm's accounting, one line per allocation (``sacct --duplicates`` lists the requeued ones).

Allocated time is split so the parts add up to it: productive (steps no later run redid, less the
stalls and the straggler wait inside them), start-up, restart downtime, recomputed steps, checkpoint
stalls, hang detection, straggler slowdown and the rest ("other": shutdown, what no record explains).
Queue wait after a requeue is lost too, but not allocated: it is no GPU-hour.
Without sacct the allocations are estimated from the job's own records (``estimated``).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train import log_lines as lines
from hpc_train.jobs.poll import RunOutcome

CAUSES = {  # key -> label, in the order the report lists them
    "startup": "start-up",
    "restart_downtime": "restart downtime",
    "recomputed": "recomputed steps",
    "checkpoint_stalls": "checkpoint stalls",
    "hang_detection": "hang detection",
    "straggler": "straggler slowdown",
    "other": "other",
}
SACCT_FIELDS = ["JobID", "State", "ExitCode", "Submit", "Start", "End", "NodeList", "AllocNodes", "AllocTRES"]
SLACK_S = 5.0  # clocks of the batch node, rank 0 and the controller differ by this much, and dates are to the second
DISAGREE_S = 60.0  # the records explain more than was allocated by this much: say so


# -- what the files say --------------------------------------------------------------------------
@dataclass
class Allocation:
    """One allocation of the job: the first, and one per requeue (``sacct --duplicates``)."""

    start: float
    end: float | None  # None: still running
    state: str = ""
    exit_code: str = ""
    nodelist: str = ""
    nodes: int | None = None
    gpus: int | None = None  # gres/gpu over the whole allocation
    submit: float | None = None


@dataclass
class BatchLog:
    starts: dict[int, tuple[float | None, str]] = field(default_factory=dict)  # run -> (when, batch host)
    failures: dict[int, tuple[int, str]] = field(default_factory=dict)  # run -> (exit status, what followed)
    stops: dict[int, tuple[int, str]] = field(default_factory=dict)  # run -> (step, reason)
    saves: set[int] = field(default_factory=set)
    not_started: int | None = None  # the run the restart budget refused


@dataclass
class Files:
    """Everything read from the job folder, and what could not be read."""

    folder: Path
    record: dict[str, Any] = field(default_factory=dict)
    starts: dict[int, dict[str, Any]] = field(default_factory=dict)  # run_start events
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)  # run_end events
    rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # run -> its steps, every copy
    windows: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    hangs: dict[int, dict[str, Any]] = field(default_factory=dict)
    suspects: list[dict[str, Any]] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    runs_counter: int = 0
    hang_run: int | None = None
    start_step: tuple[int, int] | None = None  # run_start_step: (run, newest committed step when it began)
    last_run: RunOutcome | None = None
    log: BatchLog = field(default_factory=BatchLog)
    committed: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


def _jsonl(path: Path, notes: list[str], name: str | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a missing file is none, a garbled line a note."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        notes.append(f"{name or path.name}: unreadable ({exc.strerror or exc})")
        return []
    out, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            out.append(record)
        else:
            bad += 1
    if bad:
        notes.append(f"{name or path.name}: {bad} unreadable line(s) skipped")
    return out


def _text(path: Path, notes: list[str]) -> str | None:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(f"{path.name}: unreadable ({exc.strerror or exc})")
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def read(folder: str | Path) -> Files:
    """Read the job folder; every file is optional and a garbled one is a note, never an exception."""
    files = Files(Path(folder))
    _read_record(files)
    _read_steps(files)
    _read_failure_files(files)
    _read_counters(files)
    files.log = read_batch_log(files.folder, str(files.record.get("job_id") or ""), files.notes)
    files.committed = _committed_steps(files.folder / contract.CHECKPOINTS)
    return files


def _read_record(files: Files) -> None:
    text = _text(files.folder / contract.RECORD, files.notes)
    if text is None:
        return
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        record = None
    if isinstance(record, dict):
        files.record = record
    else:
        files.notes.append(f"{contract.RECORD}: not a JSON object; nodes, GPUs and price unknown")


def _read_steps(files: Files) -> None:
    path = files.folder / contract.METRICS / contract.STEPS
    if not path.is_file():
        files.notes.append(f"no {contract.METRICS}/{contract.STEPS}: step times unknown, productive time not measured")
        return
    for record in _jsonl(path, files.notes, f"{contract.METRICS}/{contract.STEPS}"):
        event, run = record.get("event"), _int(record.get("run"))
        if event == "run_start" and run is not None:
            files.starts[run] = record
        elif event == "run_end" and run is not None:
            files.ends[run] = record
        elif event == "ranks":
            if isinstance(record.get("compute_ms"), list) and _int(record.get("last_step")) is not None:
                files.windows.append(record)
        elif event is None and _int(record.get("step")) is not None and _num(record.get("time")) is not None:
            files.rows.setdefault(run if run is not None else 1, []).append(record)
    for rows in files.rows.values():
        rows.sort(key=lambda r: r["time"])
    files.stragglers = [
        s
        for s in _jsonl(path.parent / contract.STRAGGLERS, files.notes, f"{contract.METRICS}/{contract.STRAGGLERS}")
        if _int(s.get("rank")) is not None
    ]


def _read_failure_files(files: Files) -> None:
    for hang in _jsonl(files.folder / contract.HANGS, files.notes):
        run = _int(hang.get("run"))
        if run is not None:
            files.hangs.setdefault(run, hang)  # the watchdog ends the run at its first hang
    files.suspects = [s for s in _jsonl(files.folder / contract.SUSPECT_NODES, files.notes) if s.get("node")]
    text = _text(files.folder / contract.EXCLUDE_NODES, files.notes)
    files.excluded = [n for n in (text or "").strip().split(",") if n]


def _read_counters(files: Files) -> None:
    folder, notes = files.folder, files.notes
    runs = _text(folder / contract.RUNS, notes)
    if runs is not None:
        try:
            files.runs_counter = int(runs.strip() or 0)
        except ValueError:
            notes.append(f"{contract.RUNS}: not a number ({runs.strip()[:40]!r})")
    hang_run = _text(folder / contract.HANG_RUN, notes)
    if hang_run is not None and hang_run.strip().isdigit():
        files.hang_run = int(hang_run)
    start = _text(folder / contract.RUN_START_STEP, notes)
    if start is not None:
        try:
            run, step = start.split()
            files.start_step = (int(run), int(step))
        except ValueError:
            notes.append(f"{contract.RUN_START_STEP}: not 'RUN STEP' ({start.strip()[:40]!r})")
    files.last_run = RunOutcome.read(folder)
    if files.last_run is None and (folder / contract.LAST_RUN).exists():
        notes.append(f"{contract.LAST_RUN}: not 'RUN STATUS requeued|ended'")


def _committed_steps(folder: Path) -> set[int]:
    try:
        return {step for step, _ in contract.committed(folder)}
    except OSError:
        return set()


# -- the batch log -------------------------------------------------------------------------------
# what the report says followed a run's failure, by the line that said it (hpc_train.log_lines)
_FOLLOWED = {
    lines.RESTARTING: "restarted inside the allocation",
    lines.REQUEUEING: "requeued",
    lines.BUDGET_SPENT: "not retried: restart budget exhausted",
    lines.NOT_RETRIED: "not retried: {why}",
}


def log_paths(folder: Path, job_id: str = "") -> list[Path]:
    """The batch shell's stdout and stderr (task 0's log: rank 0 writes there too)."""
    named = [folder / f"{job_id}_0_log.{ext}" for ext in ("out", "err")] if job_id else []
    found = [p for p in named if p.is_file()]
    return found or sorted(folder.glob("*_0_log.out")) + sorted(folder.glob("*_0_log.err"))


def read_batch_log(folder: Path, job_id: str = "", notes: list[str] | None = None) -> BatchLog:
    log = BatchLog()
    for path in log_paths(folder, job_id):
        text = _text(path, notes if notes is not None else [])
        for line in (text or "").splitlines():
            parse_log_line(line, log)
    return log


def parse_log_line(line: str, log: BatchLog) -> None:
    if "hpc_train: " not in line:
        return
    if fields := lines.RUN_BEGINS.parse(line):
        log.starts[int(fields["run"])] = (_iso(str(fields["at"])), str(fields["host"]))
    elif fields := lines.STOPPING.parse(line):
        log.stops[int(fields["run"])] = (int(fields["step"]), str(fields["reason"]).strip())
    elif fields := lines.SAVED.parse(line):
        log.saves.add(int(fields["step"]))
    elif fields := lines.NOT_STARTED.parse(line):
        log.not_started = int(fields["run"])
    else:
        for failure, followed in _FOLLOWED.items():
            if fields := failure.parse(line):
                log.failures[int(fields["run"])] = (int(fields["status"]), followed.format(**fields))
                return


def _iso(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()  # naive (sacct): the login node's time zone
    except ValueError:
        return None


# -- Slurm's accounting --------------------------------------------------------------------------
def sacct_command(job_id: str) -> list[str]:
    return ["sacct", "-j", job_id, "--duplicates", "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS)]


def parse_sacct(text: str, job_id: str) -> list[Allocation]:
    """sacct's lines for the job itself (not its steps), oldest first; a line that never started is skipped."""
    out = []
    for line in text.splitlines():
        values = dict(zip(SACCT_FIELDS, line.split("|")))
        start = _iso(values.get("Start", ""))
        if values.get("JobID") != job_id or start is None:
            continue
        tres = dict(part.split("=", 1) for part in values.get("AllocTRES", "").split(",") if "=" in part)
        out.append(
            Allocation(
                start=start,
                end=_iso(values.get("End", "")),
                state=(values.get("State") or "").split(" ")[0],
                exit_code=values.get("ExitCode", ""),
                nodelist=values.get("NodeList", ""),
                nodes=_digits(values.get("AllocNodes")) or _digits(tres.get("node")),
                gpus=_digits(tres.get("gres/gpu")),
                submit=_iso(values.get("Submit", "")),
            )
        )
    return sorted(out, key=lambda a: a.start)


def _digits(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def sacct_allocations(job_id: str, slurm_conf: str | None = None) -> tuple[list[Allocation] | None, str | None]:
    """(allocations, None), or (None, why not): sacct may be missing, slow or without a database."""
    from hpc_train.submission import slurm_cmd

    out = slurm_cmd.run(sacct_command(job_id), slurm_conf, timeout=30)
    if out.returncode != 0:
        said = (out.stderr or "").strip().splitlines()  # a Slurm client without its config says a page
        return None, f"sacct failed: {said[0][:160] if said else f'exit {out.returncode}'}"
    found = parse_sacct(out.stdout, job_id)
    return (found, None) if found else (None, f"sacct has no started allocation of job {job_id}")


# -- runs ----------------------------------------------------------------------------------------
@dataclass
class RunView:
    """One run: where and when it ran, what it trained, how it ended."""

    run: int
    begin: float | None = None
    end: float | None = None
    hosts: list[str] = field(default_factory=list)
    start_step: int | None = None  # the checkpoint it restored
    first_step: int | None = None
    last_step: int | None = None
    steps: int = 0  # step lines it wrote
    ended: str = "unknown"  # completed, requeued, failed, hang, restarted, stopped, running, unknown
    how: str = "no record of how it ended"
    hang: dict[str, Any] | None = None
    suspects: list[str] = field(default_factory=list)
    stragglers: list[str] = field(default_factory=list)
    allocation: int | None = None  # index into Goodput.allocations


def run_numbers(files: Files) -> list[int]:
    known = set(files.starts) | set(files.rows) | set(files.hangs) | set(files.log.starts) | set(files.log.failures)
    highest = max(known | {files.runs_counter, files.last_run.run if files.last_run else 0})
    if files.log.not_started == highest and highest not in files.starts:
        highest -= 1  # counted, then refused by the restart budget: it never ran
    return list(range(1, highest + 1))


def _run_view(files: Files, run: int) -> RunView:
    view = RunView(run)
    rows = files.rows.get(run, [])
    start = files.starts.get(run, {})
    view.start_step = _int(start.get("start_step"))
    if view.start_step is None and files.start_step and files.start_step[0] == run:
        view.start_step = max(0, files.start_step[1])
    if rows:
        view.first_step, view.last_step, view.steps = rows[0]["step"], rows[-1]["step"], len(rows)
    view.begin = files.log.starts.get(run, (None, ""))[0] or _num(start.get("time"))
    own_end = [
        _num(files.ends.get(run, {}).get("time")),
        rows[-1]["time"] if rows else None,
        _num(files.hangs.get(run, {}).get("at")),
    ]
    view.end = max((t for t in own_end if t is not None), default=view.begin)
    view.hosts = _hosts(files, run)
    view.suspects = [
        f"{s['node']} ({s.get('reason', '?')}" + (", excluded)" if s["node"] in files.excluded else ")")
        for s in files.suspects
        if s.get("run") == run
    ]
    view.stragglers = [
        f"rank {s['rank']} on {s.get('host', '?')}" + (f" +{s['slowdown'] * 100:.0f}%" if _num(s.get("slowdown")) else "")
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
    quiet = f"no rank active for {hang['quiet_s']:.0f} s" if _num(hang.get("quiet_s")) is not None else "no progress"
    if not culprits:
        return f"hang ({quiet}; no rank stands out, see {hang.get('dumps', 'the stacks')})"
    parts = []
    for c in culprits:
        steps = _int(c.get("steps"))
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


def _ending(files: Files, view: RunView, later: bool, alloc: Allocation | None, last_in_alloc: bool) -> tuple[str, str]:
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


# -- the summary ---------------------------------------------------------------------------------
@dataclass
class Goodput:
    job_id: str | None
    allocated_s: float
    productive_s: float
    lost_s: dict[str, float]
    queue_wait_s: float  # between allocations after requeues: lost, but not allocated
    requeues: int
    first_wait_s: float | None  # submit to the first start
    wall_s: float
    steps_recomputed: int
    saves: int  # saves whose stall was measured
    nodes: int | None
    gpus_per_node: int | None
    gpu_hours: float | None
    node_hours: float | None
    price_per_gpu_hour: float | None
    cost: float | None
    estimated: bool  # allocations from the job's own records, not the scheduler's
    runs: list[RunView]
    allocations: list[Allocation]
    excluded: list[str]
    notes: list[str]

    @property
    def goodput(self) -> float | None:
        return self.productive_s / self.allocated_s if self.allocated_s > 0 else None


def summarize(
    files: Files, allocations: list[Allocation] | None = None, sacct_note: str | None = None, now: float | None = None
) -> Goodput:
    """The goodput of the job whose files are ``files``; ``allocations`` from sacct when it could be asked."""
    now = time.time() if now is None else now
    notes = list(files.notes)
    numbers = (
        run_numbers(files)
        if (files.rows or files.starts or files.log.starts or files.runs_counter or files.hangs or files.last_run)
        else []
    )
    views = [_run_view(files, n) for n in numbers]
    estimated = not allocations
    if estimated:
        if sacct_note:
            notes.append(f"allocated time estimated from the job's own records ({sacct_note})")
        allocations = _estimate_allocations(files, views)
    else:
        _place_runs(views, allocations or [], now)
    allocs = allocations or []
    for i, view in enumerate(views):
        later = i + 1 < len(views)
        alloc = allocs[view.allocation] if view.allocation is not None and view.allocation < len(allocs) else None
        last_in_alloc = not later or views[i + 1].allocation != view.allocation
        view.ended, view.how = _ending(files, view, later, alloc, last_in_alloc)
        view.hang = files.hangs.get(view.run)
    ledger = _Ledger()
    _account(files, views, allocs, now, ledger)
    return _goodput(files, views, allocs, ledger, estimated, notes, now)


def _estimate_allocations(files: Files, views: list[RunView]) -> list[Allocation]:
    """Without sacct: a run begins a new allocation unless the one before restarted inside its own."""
    out: list[Allocation] = []
    for i, view in enumerate(views):
        if view.begin is None:
            continue
        inside = i > 0 and "inside the allocation" in files.log.failures.get(views[i - 1].run, (0, ""))[1]
        if inside and out:
            out[-1].end = max(out[-1].end or view.begin, view.end or view.begin)
        else:
            out.append(Allocation(start=view.begin, end=view.end))
        view.allocation = len(out) - 1
    for i, view in enumerate(views[:-1]):  # a run inside the allocation ends when the next one begins
        following = views[i + 1]
        if following.allocation == view.allocation and following.begin is not None:
            view.end = following.begin
    return out


def _place_runs(views: list[RunView], allocations: list[Allocation], now: float) -> None:
    """Each run in the allocation it began in; a run ends when the next in its allocation begins, or with it."""
    for view in views:
        if view.begin is None:
            continue
        inside = [
            i
            for i, a in enumerate(allocations)
            if a.start - SLACK_S <= view.begin <= (a.end if a.end is not None else now) + SLACK_S
        ]
        view.allocation = inside[-1] if inside else None
    for i, view in enumerate(views):
        if view.allocation is None:
            continue
        alloc = allocations[view.allocation]
        following = views[i + 1] if i + 1 < len(views) else None
        if following is not None and following.allocation == view.allocation and following.begin is not None:
            view.end = following.begin
        else:
            view.end = alloc.end if alloc.end is not None else now
        if all(v.allocation != view.allocation for v in views[:i]):
            view.begin = alloc.start  # the allocation's own start: the batch log's date is to the second


@dataclass
class _Ledger:
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    kept_s: float = 0.0  # steps no later run redid, their stalls after saves left out
    recomputed_steps: int = 0
    saves: int = 0


def _typical(rows: list[dict[str, Any]], fallback: float) -> float:
    """A steady step of the run: the median, its first step (warm-up) left out."""
    values = [s for r in rows[1:] if (s := _num(r.get("step_s"))) is not None]
    return statistics.median(values) if values else fallback


def _account(files: Files, views: list[RunView], allocations: list[Allocation], now: float, ledger: _Ledger) -> None:
    every = [s for rows in files.rows.values() for r in rows[1:] if (s := _num(r.get("step_s"))) is not None]
    fallback = statistics.median(every) if every else 0.0
    saves = files.log.saves | files.committed
    for i, view in enumerate(views):
        if view.begin is None or view.end is None or view.allocation is None:
            continue
        rows = files.rows.get(view.run, [])
        later_starts = [v.start_step for v in views[i + 1 :] if v.start_step is not None]
        redo_from = min(later_starts) if later_starts else None  # a later run restored this: what is past it is redone
        typical = _typical(rows, fallback)
        last_activity = _account_steps(view, rows, typical, redo_from, saves, ledger)
        _account_tail(files, view, last_activity, is_last=i + 1 == len(views), ledger=ledger)
    ledger.lost["straggler"] = min(_straggler_s(files, views), ledger.kept_s)


def _account_steps(
    view: RunView, rows: list[dict[str, Any]], typical: float, redo_from: int | None, saves: set[int], ledger: _Ledger
) -> float:
    """Start-up, the steps kept or redone, the stalls after saves; returns when the last step ended."""
    assert view.begin is not None
    if not rows:
        return view.begin
    for n, row in enumerate(rows):
        length = _num(row.get("step_s")) or 0.0
        if n == 0:
            length = min(length, typical) if typical else length  # the first step's warm-up is start-up
            ledger.lost["startup"] += max(0.0, row["time"] - view.begin - length)
        if n > 0 and row["step"] - 1 in saves:  # a synchronous save lies in the step after it
            stall = max(0.0, length - typical)
            ledger.lost["checkpoint_stalls"] += stall
            ledger.saves += 1
            length -= stall
        if redo_from is not None and row["step"] > redo_from:
            ledger.lost["recomputed"] += length
            ledger.recomputed_steps += 1
        else:
            ledger.kept_s += length
    return max(view.begin, rows[-1]["time"])


def _account_tail(files: Files, view: RunView, last_step_end: float, is_last: bool, ledger: _Ledger) -> None:
    """From the run's last step to its end: hang detection, restart downtime, or (the job's end) other."""
    assert view.end is not None
    end = max(view.end, last_step_end)
    hang = files.hangs.get(view.run)
    if hang is not None or files.hang_run == view.run:
        at, quiet = _num((hang or {}).get("at")), _num((hang or {}).get("quiet_s"))
        activity = min(end, max(last_step_end, at - quiet)) if at is not None and quiet is not None else last_step_end
        if view.steps == 0:
            ledger.lost["startup"] += activity - last_step_end  # last_step_end is the run's begin here
        ledger.lost["hang_detection"] += end - activity
    elif view.steps == 0:
        ledger.lost["startup"] += end - last_step_end  # a run that never made a step: all of it was starting
    elif not is_last:
        ledger.lost["restart_downtime"] += end - last_step_end


def _straggler_s(files: Files, views: list[RunView]) -> float:
    """The wait for the slowest rank: every step of a window takes its compute time, not the median's."""
    starts = {v.run: v.start_step for v in views if v.start_step is not None}
    total = 0.0
    for window in files.windows:
        run, last = window.get("run", 0), window["last_step"]
        if any(r > run and s < last for r, s in starts.items()):
            continue  # a later run redid these steps: counted as recomputed
        known = [c for c in window["compute_ms"] if _num(c) is not None]
        median = _num(window.get("median_ms"))
        first = _int(window.get("first_step"))
        if not known or median is None or first is None:
            continue
        total += max(0.0, max(known) - median) / 1e3 * max(1, last - first + 1)
    return total


def _goodput(
    files: Files, views: list[RunView], allocs: list[Allocation], ledger: _Ledger, estimated: bool, notes: list[str], now: float
) -> Goodput:
    spans = [((a.end if a.end is not None else now) - a.start) for a in allocs]
    allocated = sum(max(0.0, s) for s in spans)
    lost = ledger.lost
    productive = max(0.0, ledger.kept_s - lost["straggler"])
    explained = productive + sum(v for k, v in lost.items() if k != "other")
    if explained - allocated > DISAGREE_S:
        notes.append(
            f"the job's records account for {explained - allocated:.0f} s more than was allocated (clocks or records disagree)"
        )
    lost["other"] = max(0.0, allocated - explained)
    waits = [max(0.0, b.start - (a.end if a.end is not None else b.start)) for a, b in itertools.pairwise(allocs)]
    record = files.record
    submitted = allocs[0].submit if allocs and allocs[0].submit else _num(record.get("submitted_at"))
    first_wait = max(0.0, allocs[0].start - submitted) if allocs and submitted else None
    nodes, per_node, gpu_hours, node_hours = _resources(files, allocs, spans, allocated)
    price = _num(record.get("price_per_gpu_hour"))
    job_id = record.get("job_id") or next((s.get("job_id") for s in files.starts.values() if s.get("job_id")), None)
    return Goodput(
        job_id=str(job_id) if job_id else None,
        allocated_s=allocated,
        productive_s=productive,
        lost_s=lost,
        queue_wait_s=sum(waits),
        requeues=len(waits),
        first_wait_s=first_wait,
        wall_s=((allocs[-1].end if allocs[-1].end is not None else now) - allocs[0].start) if allocs else 0.0,
        steps_recomputed=ledger.recomputed_steps,
        saves=ledger.saves,
        nodes=nodes,
        gpus_per_node=per_node,
        gpu_hours=gpu_hours,
        node_hours=node_hours,
        price_per_gpu_hour=price,
        cost=gpu_hours * price if gpu_hours is not None and price is not None else None,
        estimated=estimated,
        runs=views,
        allocations=allocs,
        excluded=files.excluded,
        notes=notes,
    )


def _resources(
    files: Files, allocs: list[Allocation], spans: list[float], allocated: float
) -> tuple[int | None, int | None, float | None, float | None]:
    """(nodes, GPUs per node, GPU-hours, node-hours): the scheduler's counts where it gave them, else the record's."""
    record = files.record
    nodes = _int(record.get("nodes"))
    if nodes is not None:
        nodes += _int(record.get("spare_nodes")) or 0  # spares are allocated too
    per_node = _int(record.get("gpus_per_node"))
    if per_node is None and any(s.get("device") == "cuda" for s in files.starts.values()):
        per_node = _int(record.get("procs_per_node"))  # one process per GPU: the plan's default on GPU partitions
    if allocs and all(a.gpus is not None for a in allocs):
        gpu_hours: float | None = sum(a.gpus * s for a, s in zip(allocs, spans) if a.gpus) / 3600
    else:
        gpu_hours = nodes * per_node * allocated / 3600 if nodes and per_node else None
    counted = [a.nodes for a in allocs]
    if allocs and all(n is not None for n in counted):
        node_hours: float | None = sum(n * s for n, s in zip(counted, spans) if n) / 3600
        nodes = max(n for n in counted if n is not None)
    else:
        node_hours = nodes * allocated / 3600 if nodes else None
    return nodes, per_node, gpu_hours, node_hours


def load(folder: str | Path, *, sacct: bool = True, now: float | None = None) -> Goodput:
    """Read the folder and, for a Slurm job with a record, ask sacct for its allocations."""
    files = read(folder)
    allocations: list[Allocation] | None = None
    why: str | None = "sacct not asked"
    job_id, record = files.record.get("job_id"), files.record
    if sacct and job_id and record.get("scheduler") == "slurm":
        allocations, why = sacct_allocations(str(job_id), record.get("slurm_conf"))
    elif not sacct:
        why = "sacct not asked (--no-sacct)"
    elif record.get("scheduler") == "local":
        why = "a local job: no scheduler accounting"
    else:
        why = "no job record to ask sacct with"
    return summarize(files, allocations, why, now=now)


# -- output --------------------------------------------------------------------------------------
def as_dict(g: Goodput) -> dict[str, Any]:
    out = asdict(g)
    out["goodput"] = None if g.goodput is None else round(g.goodput, 4)
    for key in ("allocated_s", "productive_s", "queue_wait_s", "wall_s", "first_wait_s"):
        if out[key] is not None:
            out[key] = round(out[key], 3)
    out["lost_s"] = {k: round(v, 3) for k, v in g.lost_s.items()}
    return out


def _hms(seconds: float) -> str:
    seconds = round(seconds)
    days, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    minutes, s = divmod(rest, 60)
    return (f"{days}-" if days else "") + f"{h:02d}:{minutes:02d}:{s:02d}"


def format_lines(d: dict[str, Any]) -> list[str]:
    """The goodput section of ``report`` and ``diagnose`` (from ``as_dict``'s output: JSON round-trips)."""
    lines: list[str] = []

    def add(label: str, value: str) -> None:
        lines.append(f"  {label:<16}{value}")

    allocated = d["allocated_s"]
    if d.get("goodput") is not None:
        add(
            "goodput",
            f"{d['goodput'] * 100:.1f}%: {_hms(d['productive_s'])} training new steps of "
            f"{_hms(allocated)} allocated" + (" (estimated)" if d.get("estimated") else ""),
        )
    else:
        add("goodput", "unknown: no allocation found")
    for key, label in CAUSES.items():
        seconds = d["lost_s"].get(key, 0.0)
        if seconds >= 0.5 or (key == "startup" and allocated):
            lines.append(f"    {label:<20}{_hms(seconds)}{_share(seconds, allocated)}{_lost_detail(key, d)}")
    if d.get("requeues"):
        add("queue wait", f"{_hms(d['queue_wait_s'])} after {d['requeues']} requeue(s) (not allocated, not in GPU-hours)")
    if d.get("first_wait_s") is not None:
        add("first wait", f"{_hms(d['first_wait_s'])} from submission to the first start")
    add("GPU-hours", _gpu_line(d))
    if d.get("cost") is not None:
        add("cost", f"{d['cost']:,.2f} ({d['price_per_gpu_hour']:g} per GPU-hour)")
    lines.extend(run_table(d))
    if d.get("excluded"):
        add("excluded", ", ".join(d["excluded"]) + " (ExcNodeList of the next requeue)")
    for note in d.get("notes") or []:
        add("note", note)
    return lines


def _share(seconds: float, allocated: float) -> str:
    return f" ({seconds / allocated * 100:.1f}%)" if allocated > 0 else ""


def _lost_detail(key: str, d: dict[str, Any]) -> str:
    if key == "recomputed" and d.get("steps_recomputed"):
        return f", {d['steps_recomputed']} step(s) trained again after a restore"
    if key == "checkpoint_stalls" and d.get("saves"):
        return f", after {d['saves']} save(s)"
    return ""


def _gpu_line(d: dict[str, Any]) -> str:
    if d.get("gpu_hours") is not None:
        layout = (
            f" ({d['nodes']} node(s) x {d['gpus_per_node']} GPU(s) x {_hms(d['allocated_s'])})"
            if d.get("nodes") and d.get("gpus_per_node")
            else ""
        )
        return f"{d['gpu_hours']:.2f}{layout}"
    if d.get("node_hours") is not None:
        return f"none (a CPU job: {d['node_hours']:.2f} node-hours)"
    return "unknown (the job record gives no nodes)"


def run_table(d: dict[str, Any]) -> list[str]:
    runs = d.get("runs") or []
    if not runs:
        return []
    rows = [("run", "hosts", "steps", "ended")]
    for r in runs:
        steps = f"{r['first_step']}-{r['last_step']}" if r.get("first_step") is not None else "-"
        rows.append((str(r["run"]), ",".join(r.get("hosts") or []) or "?", steps, r["how"]))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    out = ["  runs"]
    for row in rows:
        out.append("    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    for r in runs:
        if r.get("suspects"):
            out.append(f"    run {r['run']} suspect nodes: {', '.join(r['suspects'])}")
        if r.get("stragglers"):
            out.append(f"    run {r['run']} stragglers: {', '.join(r['stragglers'])}")
    return out
