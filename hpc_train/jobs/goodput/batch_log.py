"""The batch log's lines (``<job>_0_log.out``/``.err``): when each run began and on which host, how a run
failed and what followed, where rank 0 stopped, which steps were saved. The lines are declared in
hpc_train.log_lines, which their writers use too.
"""

from __future__ import annotations

from pathlib import Path

from hpc_train import log_lines as lines
from hpc_train.jobs.goodput.records import BatchLog, iso_seconds, read_text

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
        text = read_text(path, notes if notes is not None else [])
        for line in (text or "").splitlines():
            parse_log_line(line, log)
    return log


def parse_log_line(line: str, log: BatchLog) -> None:
    if "hpc_train: " not in line:
        return
    if fields := lines.RUN_BEGINS.parse(line):
        log.starts[int(fields["run"])] = (iso_seconds(str(fields["at"])), str(fields["host"]))
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
