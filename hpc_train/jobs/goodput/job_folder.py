"""The job folder's files read into ``Files``: the record, the metrics' steps and windows, the failure files,
the counters and the committed steps. Every file is optional; a garbled one is a note, never an exception.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.jobs.goodput.batch_log import read_batch_log
from hpc_train.jobs.goodput.records import Files, as_int, as_number, read_text
from hpc_train.jobs.poll import RunOutcome


def _jsonl(path: Path, notes: list[str], name: str | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a missing file is none, a garbled line a note."""
    text = read_text(path, notes, name)
    if text is None:
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
    text = read_text(files.folder / contract.RECORD, files.notes)
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
        event, run = record.get("event"), as_int(record.get("run"))
        if event == "run_start" and run is not None:
            files.starts[run] = record
        elif event == "run_end" and run is not None:
            files.ends[run] = record
        elif event == "ranks":
            if isinstance(record.get("compute_ms"), list) and as_int(record.get("last_step")) is not None:
                files.windows.append(record)
        elif event is None and as_int(record.get("step")) is not None and as_number(record.get("time")) is not None:
            files.rows.setdefault(run if run is not None else 1, []).append(record)
    for rows in files.rows.values():
        rows.sort(key=lambda r: r["time"])
    files.stragglers = [
        s
        for s in _jsonl(path.parent / contract.STRAGGLERS, files.notes, f"{contract.METRICS}/{contract.STRAGGLERS}")
        if as_int(s.get("rank")) is not None
    ]


def _read_failure_files(files: Files) -> None:
    for hang in _jsonl(files.folder / contract.HANGS, files.notes):
        run = as_int(hang.get("run"))
        if run is not None:
            files.hangs.setdefault(run, hang)  # the watchdog ends the run at its first hang
    files.suspects = [s for s in _jsonl(files.folder / contract.SUSPECT_NODES, files.notes) if s.get("node")]
    text = read_text(files.folder / contract.EXCLUDE_NODES, files.notes)
    files.excluded = [n for n in (text or "").strip().split(",") if n]


def _read_counters(files: Files) -> None:
    folder, notes = files.folder, files.notes
    runs = read_text(folder / contract.RUNS, notes)
    if runs is not None:
        try:
            files.runs_counter = int(runs.strip() or 0)
        except ValueError:
            notes.append(f"{contract.RUNS}: not a number ({runs.strip()[:40]!r})")
    hang_run = read_text(folder / contract.HANG_RUN, notes)
    if hang_run is not None and hang_run.strip().isdigit():
        files.hang_run = int(hang_run)
    start = read_text(folder / contract.RUN_START_STEP, notes)
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
