"""Horovod is built (by tools/build_horovod.sh) into the test interpreter's environment.

These tests never skip: in CI a missing or half-built Horovod must fail the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "build_horovod.sh"
VENV = Path(sys.prefix)
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if os.geteuid() == 0:  # Open MPI refuses root unless told (CI runs as root)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def _check_marks(output: str) -> dict[str, dict[str, bool]]:
    """Parse `horovodrun --check-build` into {section: {item: checked}}."""
    sections: dict[str, dict[str, bool]] = {}
    current: dict[str, bool] | None = None
    for line in output.splitlines():
        header = re.match(r"^Available (.+):\s*$", line)
        if header:
            current = sections.setdefault(header.group(1), {})
            continue
        mark = re.match(r"^\s*\[([ X])\]\s+(\S.*?)\s*$", line)
        if mark and current is not None:
            current[mark.group(2)] = mark.group(1) == "X"
    return sections


def test_parse_check_marks():
    sample = (
        "Horovod v0.28.1:\n\nAvailable Frameworks:\n    [ ] TensorFlow\n    [X] PyTorch\n"
        "    [ ] MXNet\n\nAvailable Controllers:\n    [X] MPI\n    [ ] Gloo\n"
    )
    marks = _check_marks(sample)
    assert marks["Frameworks"] == {"TensorFlow": False, "PyTorch": True, "MXNet": False}
    assert marks["Controllers"] == {"MPI": True, "Gloo": False}


def test_import_horovod_torch_in_test_interpreter():
    proc = _run(
        [sys.executable, "-c", "import horovod, horovod.torch as hvd; print(horovod.__version__)"],
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"`import horovod.torch` fails in {sys.executable}; build it with "
        f"`bash tools/build_horovod.sh {VENV}`\n{proc.stderr[-3000:]}"
    )
    assert proc.stdout.strip().splitlines()[-1] == "0.28.1"


def test_check_build_reports_pytorch_gloo_mpi():
    horovodrun = BIN / "horovodrun"
    assert horovodrun.exists(), f"{horovodrun} missing: run `bash tools/build_horovod.sh {VENV}`"
    proc = _run([str(horovodrun), "--check-build"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    marks = _check_marks(proc.stdout)
    assert marks.get("Frameworks", {}).get("PyTorch") is True, proc.stdout
    assert marks.get("Controllers", {}).get("MPI") is True, proc.stdout
    assert marks.get("Controllers", {}).get("Gloo") is True, proc.stdout


def test_build_script_is_idempotent():
    assert os.access(BUILD_SCRIPT, os.X_OK), f"{BUILD_SCRIPT} is not executable"
    proc = _run(["bash", str(BUILD_SCRIPT), str(VENV)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the second run must find the build and stop (a rebuild takes minutes and prints compiler output)
    assert "already built" in proc.stdout, proc.stdout + proc.stderr
