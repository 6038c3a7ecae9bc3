"""Running a command for a check: (exit status, output), None for a command that is not installed; the checks
take any such runner, so recorded outputs stand in for real nodes in the tests.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping

Runner = Callable[[list[str]], "tuple[int | None, str]"]  # (exit status or None when not found, output)


def run_command(cmd: list[str], timeout: float = 20, env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    if shutil.which(cmd[0]) is None:
        return None, ""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    except OSError as exc:
        return 126, str(exc)
    return done.returncode, done.stdout + done.stderr
