"""The launcher guard: a launcher that forks the ranks survives the job's stop signal; the ranks see it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from hpc_train.testing import plan_job

RANK = textwrap.dedent("""
    import os, signal, sys, time
    from hpc_train.runtime.lifecycle.preemption import StopWatcher
    watcher = StopWatcher({"HPC_TRAIN_STOP_SIGNAL": "USR2"}).start()   # what every rank's checkpointer does
    os.kill(os.getppid(), signal.SIGUSR2)   # scancel --signal reaches the launcher...
    os.kill(os.getpid(), signal.SIGUSR2)    # ...and every rank
    time.sleep(0.2)
    print("rank saw:", watcher.reason, flush=True)
""")
LAUNCHER = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {RANK!r}]).returncode)"


def guarded(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.launch.signal_guard", *argv], capture_output=True, text=True, timeout=60
    )


def test_the_launcher_survives_the_stop_signal_and_the_rank_still_sees_it():
    out = guarded("--ignore=USR2", "--", "-c", LAUNCHER)
    assert out.returncode == 0, out.stderr
    assert "rank saw: signal SIGUSR2" in out.stdout


def test_without_the_guard_the_same_launcher_dies_of_it():
    out = subprocess.run([sys.executable, "-c", LAUNCHER], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGUSR2  # what killed torchrun's launchers


def test_bad_arguments_are_refused_with_usage():
    out = guarded("--ignore=NOPE", "--", "-c", "pass")
    assert out.returncode == 2 and "not a signal" in out.stderr and "usage" in out.stderr
    assert guarded("--ignore=USR2").returncode == 2


def test_torchrun_is_guarded_only_when_the_job_can_be_told_to_stop(plugins):
    launch = " ".join(plan_job(plugins, "sandbox", backend="torchrun", nodes=2).launch)
    assert "-m hpc_train.runtime.launch.signal_guard --ignore=USR2 -- -m torch.distributed.run" in launch
    unguarded = " ".join(plan_job(plugins, "sandbox", backend="torchrun", nodes=2, requeue=False).launch)
    assert "signal_guard" not in unguarded and "-m torch.distributed.run" in unguarded
