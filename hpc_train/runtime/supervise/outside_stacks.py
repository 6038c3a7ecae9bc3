"""Stacks of a rank that cannot answer for itself, read from outside its process with py-spy.

A rank answers the watchdog's request for stacks from its heartbeat thread (faulthandler). A rank
that is stopped (SIGSTOP, a debugger) or stuck holding the GIL in C code never does; py-spy reads its
interpreter's memory from outside, without the GIL and without resuming it (``--nonblocking``). The
watchdog runs on the batch node, the rank may be on another: py-spy runs there as a one-task srun
step that overlaps the hung one.

The output is rewritten in faulthandler's shape (``File "x.py", line 3 in f``), so one parser
(hpc_train.runtime.supervise.hang_report.main_stack) reads stacks from either source.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 30.0  # an srun step on an idle node starts in about a second; py-spy reads in milliseconds
_THREAD = re.compile(r'^Thread (\d+) \(([^)]*)\): "(.*)"$')
_FRAME = re.compile(r"^\s+(.+?) \((.*):(\d+)\)$")


def py_spy() -> str | None:
    """py-spy beside the job's python (the runtime extra installs it there), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def as_faulthandler(text: str) -> str:
    """py-spy's ``dump`` output in faulthandler's format, most recent call first as both print it."""
    lines = []
    for line in text.splitlines():
        thread, frame = _THREAD.match(line), _FRAME.match(line)
        if thread:
            lines.append(f"Thread 0x{int(thread.group(1)):x} ({thread.group(3)}, {thread.group(2)}; read by py-spy):")
        elif frame:
            lines.append(f'  File "{frame.group(2)}", line {frame.group(3)} in {frame.group(1)}')
    return "\n".join(lines) + "\n"


def command(spy: str, host: str, pid: int, job_id: str | None) -> list[str]:
    dump = [spy, "dump", "--pid", str(pid), "--nonblocking", "--full-filenames"]
    if not job_id:  # the local site: the rank is on this machine
        return dump
    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={host}",
        "--kill-on-bad-exit=0",
        "--quiet",
        *dump,
    ]


def dump_from_outside(host: str, pid: int, job_id: str | None, timeout: float = TIMEOUT_S) -> tuple[str | None, str]:
    """(the stacks in faulthandler's format, or None; what happened, for the log)."""
    spy = py_spy()
    if spy is None:
        return None, "py-spy is not installed with the job's python (pip install py-spy)"
    try:
        out = subprocess.run(command(spy, host, pid, job_id), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"py-spy on {host} did not finish: {exc}"
    stacks = as_faulthandler(out.stdout)
    if out.returncode != 0 or "File " not in stacks:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return None, f"py-spy on {host} could not read pid {pid}: {why}"
    return stacks, f"read by py-spy on {host}"
