"""Stacks read from outside a rank that cannot answer (hpc_train.runtime.supervise.outside_stacks): real py-spy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hpc_train.runtime.supervise.hang_report import main_stack
from hpc_train.runtime.supervise.outside_stacks import as_faulthandler, command, dump_from_outside, py_spy

STUCK = """
import threading, time
def deep_in_a_step():
    time.sleep(120)
threading.Thread(target=time.sleep, args=(120,), name="loader", daemon=True).start()
print("ready", flush=True)
deep_in_a_step()
"""


def test_py_spy_comes_with_the_runtime_extra():
    assert py_spy() is not None


def test_a_stopped_process_is_read_from_outside_in_faulthandlers_shape():
    proc = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGSTOP)  # as a stopped rank: it can never answer from inside
        stacks, how = dump_from_outside("localhost", proc.pid, job_id=None)
        assert stacks is not None, how
        frames = main_stack(stacks)
        assert frames[0] == 'File "<string>", line 4 in deep_in_a_step', stacks
        assert frames[-1].endswith("in <module>")
        assert "(loader, idle; read by py-spy)" in stacks  # every thread, not only the main one
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_process_that_is_gone_says_why():
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stacks, how = dump_from_outside("localhost", int(proc.stdout), job_id=None)
    assert stacks is None and "could not read pid" in how


def test_on_slurm_it_runs_on_the_ranks_node_beside_the_hung_step():
    argv = command("/venv/bin/py-spy", "n2", 4242, "17")
    assert argv[:7] == ["srun", "--overlap", "--jobid=17", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--kill-on-bad-exit=0"]
    assert argv[argv.index("/venv/bin/py-spy") :] == [
        "/venv/bin/py-spy",
        "dump",
        "--pid",
        "4242",
        "--nonblocking",
        "--full-filenames",
    ]


def test_lines_that_are_not_frames_are_left_out():
    text = 'Process 1: python x.py\nPython v3.11.7\n\nThread 7 (idle): "MainThread"\n    f (/x.py:3)\n'
    assert as_faulthandler(text) == 'Thread 0x7 (MainThread, idle; read by py-spy):\n  File "/x.py", line 3 in f\n'
