"""Where the allocated time went: each run's seconds put under productive or one of the causes, so that the
parts add up to what was allocated, then the totals, GPU-hours and cost.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from hpc_train.jobs.goodput.records import CAUSES, DISAGREE_S, Allocation, Files, Goodput, RunView, as_int, as_number


@dataclass
class Ledger:
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    kept_s: float = 0.0  # steps no later run redid, their stalls after saves left out
    recomputed_steps: int = 0
    saves: int = 0
    estimated: bool = False  # the allocations are the job's own records', not sacct's
    notes: list[str] = field(default_factory=list)  # what the report says beside the figures


def _typical(rows: list[dict[str, Any]], fallback: float) -> float:
    """A steady step of the run: the median, its first step (warm-up) left out."""
    values = [s for r in rows[1:] if (s := as_number(r.get("step_s"))) is not None]
    return statistics.median(values) if values else fallback


def account(files: Files, views: list[RunView], allocations: list[Allocation], now: float, ledger: Ledger) -> None:
    every = [s for rows in files.rows.values() for r in rows[1:] if (s := as_number(r.get("step_s"))) is not None]
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
    view: RunView, rows: list[dict[str, Any]], typical: float, redo_from: int | None, saves: set[int], ledger: Ledger
) -> float:
    """Start-up, the steps kept or redone, the stalls after saves; returns when the last step ended."""
    assert view.begin is not None
    if not rows:
        return view.begin
    for n, row in enumerate(rows):
        length = as_number(row.get("step_s")) or 0.0
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


def _account_tail(files: Files, view: RunView, last_step_end: float, is_last: bool, ledger: Ledger) -> None:
    """From the run's last step to its end: hang detection, restart downtime, or (the job's end) other."""
    assert view.end is not None
    end = max(view.end, last_step_end)
    hang = files.hangs.get(view.run)
    if hang is not None or files.hang_run == view.run:
        at, quiet = as_number((hang or {}).get("at")), as_number((hang or {}).get("quiet_s"))
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
        known = [c for c in window["compute_ms"] if as_number(c) is not None]
        median = as_number(window.get("median_ms"))
        first = as_int(window.get("first_step"))
        if not known or median is None or first is None:
            continue
        total += max(0.0, max(known) - median) / 1e3 * max(1, last - first + 1)
    return total


def tally(files: Files, views: list[RunView], allocs: list[Allocation], ledger: Ledger, now: float) -> Goodput:
    """The summary from what ``account`` put in the ledger."""
    notes = ledger.notes
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
    submitted = allocs[0].submit if allocs and allocs[0].submit else as_number(record.get("submitted_at"))
    first_wait = max(0.0, allocs[0].start - submitted) if allocs and submitted else None
    nodes, per_node, gpu_hours, node_hours = _resources(files, allocs, spans, allocated)
    price = as_number(record.get("price_per_gpu_hour"))
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
        estimated=ledger.estimated,
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
    nodes = as_int(record.get("nodes"))
    if nodes is not None:
        nodes += as_int(record.get("spare_nodes")) or 0  # spares are allocated too
    per_node = as_int(record.get("gpus_per_node"))
    if per_node is None and any(s.get("device") == "cuda" for s in files.starts.values()):
        per_node = as_int(record.get("procs_per_node"))  # one process per GPU: the plan's default on GPU partitions
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
