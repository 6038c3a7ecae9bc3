"""Why a job failed, in one line: the exception its training script raised, read from the job's logs.

A failed job's stderr holds several tracebacks: the script's own (``ModuleNotFoundError: No module
named 'torch'``), then the launchers' that report it again (torchrun's ChildFailedError, submitit's
"Submitted job triggered an exception", our local runner's "training script exited with status 1").
The cause is the script's: the launchers' are skipped. Only the end of each log is read (a long
run's logs can be large); a requeued job appends to its logs, so the last traceback there is the last
run's.
"""

from __future__ import annotations

import re
from pathlib import Path

TAIL_BYTES = 256 * 1024
_HEADER = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torchrun's prefix of its workers' stderr lines
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+)')
# tracebacks of the launchers around the script, which say again that it failed, not why
_LAUNCHER = re.compile(
    r"^(RuntimeError: training script exited with status|torch\.distributed\.elastic\.multiprocessing\.errors\."
    r"ChildFailedError|torch\.distributed\.elastic\.multiprocessing\.api\.SignalException|subprocess\.CalledProcessError|submitit\.core\.utils\.FailedJobError|SystemExit|KeyboardInterrupt)"
)


def _lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, 2) - TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    return [_RANK_PREFIX.sub("", line) for line in text.splitlines()]


def exceptions(lines: list[str]) -> list[tuple[str, str | None]]:
    """(the exception line, the innermost frame "file, line N") of each traceback in ``lines``, in order."""
    found = []
    frame: str | None = None
    inside = False
    for line in lines:
        if line.strip() == _HEADER:
            inside, frame = True, None
        elif inside and (match := _FRAME.match(line)):
            frame = f"{match.group(1)}, line {match.group(2)}"
        elif inside and line and not line[0].isspace():
            found.append((line.strip(), frame))
            inside = False
    return found


def failure_cause(folder: Path) -> str | None:
    """The script's exception and where it was raised, from the first task log that has one; None if none does."""
    for log in sorted(folder.glob("*_log.err")):
        own = [(error, frame) for error, frame in exceptions(_lines(log)) if not _LAUNCHER.match(error)]
        if own:
            error, frame = own[-1]
            return error + (f" (at {as_submitted(frame, folder)}; {log.name})" if frame else f" ({log.name})")
    return None


def as_submitted(frame: str, folder: Path) -> str:
    """A frame in the job's code snapshot, named by the file the user edits: the snapshot's folder is a digest
    nobody recognises, and the project's file held the same code when the job was submitted."""
    import json

    from hpc_train import contract

    try:
        code = json.loads((folder / contract.RECORD).read_text()).get("code") or {}
        tree, project = code["tree"], code["project"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return frame
    if not frame.startswith(tree + "/"):
        return frame
    return f"{project}{frame[len(tree) :]}, as submitted"
