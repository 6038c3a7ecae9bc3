"""hpc_train.runtime.boot: the sitecustomize every Python of a job starts with (plain scripts too)."""

from __future__ import annotations

import os
import re
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


def drains_at_exit(imports: str) -> list[str]:
    """What the boot's exit handler asks time.sleep for, seen from inside a real process: the script's own
    last atexit handler (which runs before the boot's, registered first) wraps time.sleep to print its
    argument and still sleep. Whether the boot waits is then no matter of timing."""
    code = (
        f"import atexit, time\n{imports}\n"
        "def spy():\n"
        "    real = time.sleep\n"
        "    time.sleep = lambda s: (print('SLEEP', s, flush=True), real(s))[1]\n"
        "atexit.register(spy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": FOLDER}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("SLEEP")]


def test_a_process_that_used_torch_distributed_lets_its_threads_finish_before_it_exits():
    assert lingering_after_the_scripts_atexit("import torch.distributed") >= 0.2  # a load only adds to it
    assert drains_at_exit("import torch.distributed") == ["SLEEP 0.2"]
    # nothing to wait for: no wait. Timed, this failed under make test with a make test-unit loop beside it:
    # five ends of a process that waits for nothing took 0.22-0.32 s (x41's loop)
    assert drains_at_exit("import json") == []


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


def test_ranks_sharing_a_log_file_write_whole_lines(tmp_path):
    """As the ranks of a node do: ``python -u``, one stdout file; -u alone joined lines ("rank 1 ...rank 0 ...")."""
    code = "import os\nfor i in range(2000): print(f'rank {os.environ[\"R\"]} line {i} ' + 'x' * 60)\n"
    log = tmp_path / "task.out"
    with log.open("w") as out:
        ranks = [
            subprocess.Popen(
                [sys.executable, "-u", "-c", code], stdout=out, env={**os.environ, "PYTHONPATH": FOLDER, "R": str(r)}
            )
            for r in range(2)
        ]
        assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    lines = log.read_text().splitlines()
    assert len(lines) == 4000
    assert [line for line in lines if not re.fullmatch(r"rank [01] line \d+ x{60}", line)] == []
    for r in "01":  # each rank's lines in its order
        assert [int(line.split()[3]) for line in lines if line.startswith(f"rank {r} ")] == list(range(2000))


def test_a_rank_still_prints_at_once_what_ends_its_line(tmp_path):
    code = "import sys, time\nprint('step 1', flush=False)\nsys.stdout.write('10%\\r')\ntime.sleep(30)\n"
    rank = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": FOLDER})
    try:
        assert rank.stdout.readline() == b"step 1\n"
        assert rank.stdout.read(4) == b"10%\r"  # a progress bar's line, at once
    finally:
        rank.kill()
        rank.wait()
