"""The goodput of a job: its runs placed in their allocations (sacct's, or estimated from the job's own
records), how each ended, and the ledger's totals.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpc_train.jobs.goodput.job_folder import read
from hpc_train.jobs.goodput.ledger import Ledger, account, tally
from hpc_train.jobs.goodput.records import SLACK_S, Allocation, Files, Goodput, RunView
from hpc_train.jobs.goodput.runs import ending, run_numbers, run_view
from hpc_train.jobs.goodput.sacct import sacct_allocations


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
    views = [run_view(files, n) for n in numbers]
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
        view.ended, view.how = ending(files, view, later, alloc, last_in_alloc)
        view.hang = files.hangs.get(view.run)
    ledger = Ledger(estimated=estimated, notes=notes)
    account(files, views, allocs, now, ledger)
    return tally(files, views, allocs, ledger, now)


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
