"""hpc_train.runtime.boot: the sitecustomize every Python of a job starts with (plain scripts too)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hpc_train.runtime.boot import FOLDER


def python(code: str, pythonpath: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_next_sitecustomize_on_the_path_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_OF_THE_CLUSTER = 'loaded'\n")
    out = python(
        "import builtins, sys; print(builtins.SITE_OF_THE_CLUSTER, sys.modules['sitecustomize'].__file__)", f"{FOLDER}:{tmp_path}"
    )
    assert out.returncode == 0 and out.stdout.split() == ["loaded", str(tmp_path / "sitecustomize.py")], out.stderr


def test_a_broken_next_sitecustomize_is_said_not_fatal(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("raise RuntimeError('broken site file')\n")
    out = python("print('ran')", f"{FOLDER}:{tmp_path}")
    assert out.returncode == 0 and out.stdout.strip() == "ran"
    assert "Error in sitecustomize" in out.stderr and "broken site file" in out.stderr


def lingering_after_the_scripts_atexit(imports: str) -> float:
    """Seconds from the script's own last atexit handler to the process's end, seen from outside."""
    code = f"import atexit, time\n{imports}\natexit.register(lambda: print(time.time(), flush=True))\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": FOLDER}, stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=120)
    ended = time.time()
    assert proc.returncode == 0
    return ended - float(out.split()[-1])


def test_a_process_that_used_torch_distributed_lets_its_threads_finish_before_it_exits():
    assert lingering_after_the_scripts_atexit("import torch.distributed") >= 0.2
    assert lingering_after_the_scripts_atexit("import json") < 0.2  # nothing to wait for: no delay


RECORDER = "import os; print(os.environ.get('TORCH_NCCL_TRACE_BUFFER_SIZE'), os.environ.get('TORCH_FR_BUFFER_SIZE'))"


def test_a_torch_that_knows_the_flight_recorders_new_name_is_given_only_that_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    assert python(RECORDER, FOLDER).stdout.split() == ["None", "2000"]  # this venv's torch 2.13: no warning
    old_torch = tmp_path / "torch"
    old_torch.mkdir()
    (old_torch / "__init__.py").write_text("")
    (old_torch / "version.py").write_text("__version__ = '2.5.1+cpu'\n")
    assert python(RECORDER, f"{FOLDER}:{tmp_path}").stdout.split() == ["2000", "2000"]  # an older torch reads the old
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")  # the user's own value: left as it is
    assert python(RECORDER, FOLDER).stdout.split() == ["500", "2000"]
