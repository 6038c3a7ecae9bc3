"""Preemption, time limits and requeues on the real cluster: the result is as if nothing happened."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpc_train.jobs.handle import RELEASE_MARGIN_S, JobHandle, held_after_requeue
from tests.conftest import REPO, once_per_run

pytestmark = pytest.mark.e2e
SCRIPT = REPO / "examples" / "train_resumable.py"
STEPS = 200  # enough for a signal at step 40 and checkpoints every 25-50


def hpc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def submit(job_root: Path, backend: str, *extra: str, script_args: tuple[str, ...] = (), steps: int = STEPS) -> str:
    # 2 nodes x 1 process: every path a 2-node job takes, at half the start-up cost on this 2-core machine
    out = hpc(
        "submit",
        "--site",
        "sandbox",
        "--job-root",
        str(job_root),
        "--backend",
        backend,
        "--nodes",
        "2",
        "--procs-per-node",
        "1",
        "--parsable",
        *extra,
        str(SCRIPT),
        "--",
        "--steps",
        str(steps),
        *script_args,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def no_agent(backend: str) -> tuple[str, ...]:
    """torchrun's ranks started by srun itself, for a job whose subject is not torchrun's agent: the agent's
    ``import torch`` cost each node of each run ~2 s of CPU (the agent's own part in requeues and failures is
    checked where it is the subject: the time-limit interruptions, the crossing requeues, a hung rank, a sick
    node and a node failing its check without spares, torchrun's own tests)."""
    return ("-o", "agent=false") if backend == "torchrun" else ()


def scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30).stdout


def state(job_id: str) -> str:
    """The state ``status`` reports (JobHandle.state), read in this process: the tests poll it every half
    second while they wait, and a ``python -m hpc_train status`` per poll cost 0.1-0.15 s of CPU each, about
    4% of make test's CPU on a 2-core machine. The CLI's own output is checked where a test reads it."""
    return JobHandle.from_id(job_id).state


def log_text(job_root: Path, job_id: str) -> str:
    path = job_root / job_id / f"{job_id}_0_log.out"
    err = job_root / job_id / f"{job_id}_0_log.err"
    return (path.read_text() if path.exists() else "") + (err.read_text() if err.exists() else "")


def wait_for(predicate, timeout: float, what: str, release: str | None = None):
    deadline = time.time() + timeout
    held_since = None
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if release:  # what `submit --wait` does on this site: start a requeued job without Slurm's hold
            info = scontrol("show", "job", "-o", release)
            if not held_after_requeue(dict(w.split("=", 1) for w in info.split() if "=" in w)):
                held_since = None
            elif held_since is None:
                held_since = time.time()
            elif time.time() - held_since >= RELEASE_MARGIN_S:  # see JobHandle.release_if_held
                scontrol("update", f"JobId={release}", "StartTime=now")
                held_since = None
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def progress(job_root: Path, job_id: str, run: int) -> int:
    """The last step rank 0 printed in run ``run``."""
    text = log_text(job_root, job_id)
    part = text.split(f"hpc_train: run {run} of job")
    if len(part) < 2:
        return -1
    steps = re.findall(r"step +(\d+)/", part[-1])
    return int(steps[-1]) if steps else 0


def final_params(job_root: Path, job_id: str) -> dict[str, torch.Tensor]:
    return torch.load(job_root / job_id / "final.pt", weights_only=True)


def reference(tmp_path_factory: pytest.TempPathFactory, backend: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The final parameters of the uninterrupted run (``--no-requeue``) that the interrupted jobs of
    ``backend`` and ``steps`` must match: one sandbox job for the whole run, whichever test asks first
    (several tests compare with the same one). Asked for after a test's own job got its interruptions,
    so the two jobs still run side by side. torchrun's ranks run without its agent: the same ranks on the
    same layout do the same arithmetic either way, and the agent is not what a reference checks."""

    def make(folder: Path) -> None:
        job = submit(folder, backend, "--no-requeue", *no_agent(backend), steps=steps)
        wait_for(lambda: state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 300, f"the {backend} reference job")
        assert state(job) == "COMPLETED", log_text(folder, job)[-3000:]
        shutil.copy(folder / job / "final.pt", folder / "final.pt")

    folder = once_per_run(tmp_path_factory, f"requeue-reference-{backend}-{steps}", make)
    return torch.load(folder / "final.pt", weights_only=True)


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after the interruptions"


def interrupted_run(
    job_root: Path, tmp_path_factory: pytest.TempPathFactory, backend: str, last: str
) -> tuple[dict[str, torch.Tensor], str, dict[str, float]]:
    """A job interrupted by a signal to its batch shell, an admin's requeue, then ``last``: its time limit
    ("time-limit") or the stop signal to every step ("step-signal"); and the final parameters of the same
    job uninterrupted, on the same layout so their arithmetic is identical."""
    time_limit = last == "time-limit"
    steps = 1200 if time_limit else 300
    # The run after the admin's requeue must outlast the time limit's warning, on any machine: Slurm
    # checks limits every 30 s, so the warning for TimeLimit=2 with a 60 s grace comes 60-90 s into the
    # run; the sleep per step makes its >= 1100 remaining steps take >= 110 s however fast the node is.
    step_seconds = "0.1" if time_limit else "0.04"
    job = submit(
        job_root,
        backend,
        "--signal-grace",
        "60",
        "--checkpoint-every",
        "25",
        "--max-restarts",
        "8",
        script_args=("--step-seconds", step_seconds),
        steps=steps,
    )
    timings = {}
    # 1. the scheduler's warning signal, as `scancel --signal` delivers it to the batch shell
    wait_for(lambda: progress(job_root, job, 1) >= 20, 240, "run 1 to train", release=job)
    signalled = time.time()
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
    wait_for(lambda: progress(job_root, job, 2) > 0, 240, "run 2 to train again", release=job)
    timings["signal to training again (s)"] = round(time.time() - signalled, 1)
    # 2. an administrator's requeue: Slurm stops the job at once; ranks save on SIGTERM if they can
    wait_for(lambda: progress(job_root, job, 2) >= 60, 240, "run 2 to get going", release=job)
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    if time_limit:
        # 3. a time limit that the next runs hit: Slurm warns the batch shell 60 s before it
        subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=2"], check=True, capture_output=True)
    else:
        # 3. `scancel --signal=USR2 JOB`: the ranks and whatever launched them get it, not the batch shell;
        # run 3 has >= 150 steps (6 s) left when it is sent
        wait_for(lambda: progress(job_root, job, 3) >= 120, 240, "run 3 to get going", release=job)
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
    uninterrupted = reference(tmp_path_factory, backend, steps)  # while the job runs on
    wait_for(lambda: state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 900, "the job to finish", release=job)
    return uninterrupted, job, timings


# A requeue costs each of these tests a whole second run: Slurm's requeue, the hold the test releases after
# RELEASE_MARGIN_S, the allocation, and python + torch started again on two nodes (10-15 s of a loaded 2-core
# machine); with the reference run beside them they take 40-67 s under make test's four workers.
REQUEUE_RUNS = "a second (or third) run of the job after a requeue, on two nodes, is what this test checks"
TIME_LIMIT_WAIT = (
    "a run stopped by its time limit's warning must outlast that warning, and slurmctld looks at time limits every "
    "30 s (hard-coded): the runs after the administrator's requeue take 60-90 s each on any machine"
)


@pytest.mark.parametrize("backend, last", [("torchrun", "time-limit"), ("deepspeed", "step-signal")])
@pytest.mark.slow(reason=TIME_LIMIT_WAIT)
def test_interruptions_change_nothing(slurm_cluster, sandbox_job_root, tmp_path_factory, backend, last):
    """Three interruptions, each a requeue, and the result is as if none happened. torchrun (its agent):
    the batch shell's signal, an administrator's requeue, then the time limit's warning in each later run.
    DeepSpeed (its launcher): the batch shell's signal, the administrator, then ``scancel --signal=USR2
    JOB`` to every step, which reaches the ranks and the launcher: the same clean stop, save and requeue
    (torchrun's launcher gets it in the crossing test, Horovod's and mpirun's below)."""
    uninterrupted, job, timings = interrupted_run(sandbox_job_root, tmp_path_factory, backend, last)
    text = log_text(sandbox_job_root, job)
    assert state(job) == "COMPLETED", text[-3000:]
    runs = int((sandbox_job_root / job / "runs").read_text())
    assert runs >= 4, text[-3000:]
    assert "stop requested" in text  # the signal, seen through the batch shell's stop file
    if last == "time-limit":  # runs after the admin's requeue were stopped by the time limit's warning
        assert text.count("stop requested") >= 2, text[-3000:]
    else:  # the ranks' own handler, not Python's default action for SIGUSR2
        assert "stopping at step" in text and "signal SIGUSR2" in text, text[-3000:]
        assert "User defined signal 2" not in text and runs == 4, text[-3000:]
    assert_identical(uninterrupted, final_params(sandbox_job_root, job))
    assert f"(run {runs}, {runs - 1} restarts)" in hpc("status", job).stdout
    print(f"\n{backend}: {runs} runs; {timings}")


@pytest.mark.parametrize("backend", ["horovod", "mpi"])
@pytest.mark.slow(reason=REQUEUE_RUNS)
def test_a_preemption_then_a_stop_signal_to_every_step_change_nothing(slurm_cluster, sandbox_job_root, tmp_path_factory, backend):
    """A preemption's warning to the batch shell, then ``scancel --signal=USR2 JOB`` to every step, which
    reaches the ranks and whatever launched them (horovodrun, mpirun): each is a clean stop, save and
    requeue, and the result is as if nothing happened."""
    steps = 300
    job = submit(sandbox_job_root, backend, "--checkpoint-every", "50", script_args=("--step-seconds", "0.03"), steps=steps)
    wait_for(lambda: progress(sandbox_job_root, job, 1) >= 40, 240, "run 1 to train")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
    # run 2 has >= 180 steps (5.4 s) left when every step gets the signal
    wait_for(lambda: progress(sandbox_job_root, job, 2) >= 120, 240, "run 2 to get going", release=job)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    uninterrupted = reference(tmp_path_factory, backend, steps)
    told = watched_state(job, timeout=400)
    text = log_text(sandbox_job_root, job)
    assert "COMPLETED" in told and state(job) == "COMPLETED", told + "\n" + text[-3000:]
    assert "stop requested" in text  # the batch shell's warning, through its stop file
    assert "stopping at step" in text and "signal SIGUSR2" in text, text[-3000:]  # the ranks' own handler
    assert "User defined signal 2" not in text and runs_of(sandbox_job_root, job) == 3, text[-3000:]
    assert_identical(uninterrupted, final_params(sandbox_job_root, job))


@pytest.mark.slow(reason=REQUEUE_RUNS)
def test_restart_budget_stops_a_job_that_always_fails(slurm_cluster, sandbox_job_root):
    # each run gets 12 steps further than the last before rank 1 crashes: progress, so only the budget
    # stops it (a job that fails where it began is ended sooner, by the no-progress rule: test_failures_cluster)
    crash = REPO / "tests" / "e2e" / "faulty_train.py"
    out = hpc(
        "submit",
        "--site",
        "sandbox",
        "--job-root",
        str(sandbox_job_root),
        *no_agent("torchrun"),  # the budget is the subject; torchrun's agent failing: the sick node's test
        "--on-failure",
        "requeue",
        "--max-restarts",
        "2",
        "--checkpoint-every",
        "5",
        "--nodes",
        "2",
        "--procs-per-node",
        "1",
        "--wait",
        str(crash),
        "--",
        "--steps",
        "200",
        "--crash-after",
        "12",
        timeout=400,
    )
    assert out.returncode != 0
    job = out.stdout.split()[2]
    text = log_text(sandbox_job_root, job)
    ranks = "".join(p.read_text() for p in (sandbox_job_root / job).glob(f"{job}_*_log.err"))
    assert [f"injected crash at step {s}" in ranks for s in (12, 22, 32)] == [True] * 3, ranks[-3000:]
    assert "restart budget exhausted (2 restarts)" in text and "not requeueing" not in text, text[-3000:]
    assert int((sandbox_job_root / job / "runs").read_text()) == 3
    assert "FAILED" in out.stderr


def runs_of(job_root: Path, job_id: str) -> int:
    try:
        return int((job_root / job_id / "runs").read_text())
    except (OSError, ValueError):
        return 0


def watched_state(job_id: str, timeout: float) -> str:
    """The job's end as the one poller tells it (``status --watch``: releases held requeues, confirms ends)."""
    out = hpc("status", job_id, "--watch", timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


# make test crosses once (the stop signal to every step, then the administrator); make soak four times, with
# the signal to the batch shell and to every step in turn and the administrator a little later each time
CROSSINGS = [pytest.param(1, id="once"), pytest.param(4, id="four-times", marks=pytest.mark.soak)]


@pytest.mark.parametrize("times", CROSSINGS)
@pytest.mark.slow(reason=REQUEUE_RUNS)
def test_crossing_requeues_end_with_the_last_runs_outcome(slurm_cluster, sandbox_job_root, tmp_path_factory, times):
    """The race CI once lost: the ranks' own requeue crossing an administrator's, with the stop signal sent
    to the batch shell and to every step, then a time limit. Whatever the order, the job's state is its last
    run's outcome, and the result is as if nothing happened."""
    steps = 900 if times > 1 else 300
    job = submit(
        sandbox_job_root,
        "torchrun",
        "--signal-grace",
        "60",
        "--checkpoint-every",
        "25",
        "--max-restarts",
        "12",
        script_args=("--step-seconds", "0.04"),
        steps=steps,
    )
    crossings = [["scancel", "--signal=USR2", job], ["scancel", "--batch", "--signal=USR2", job]] * 2
    for run, signal_cmd in enumerate(crossings[:times], start=1):
        wait_for(lambda run=run: progress(sandbox_job_root, job, run) >= 20, 240, f"run {run} to train", release=job)
        subprocess.run(signal_cmd, check=True)
        time.sleep(0.3 * run)  # the ranks are stopping, saving or requeueing when the administrator strikes
        subprocess.run(["scontrol", "requeue", job], capture_output=True)  # refused once the job already requeued
        wait_for(lambda run=run: runs_of(sandbox_job_root, job) > run, 240, f"run {run + 1} to start", release=job)
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=2"], check=True, capture_output=True)
    uninterrupted = reference(tmp_path_factory, "torchrun", steps)  # while the job runs on
    told = watched_state(job, timeout=900)
    text = log_text(sandbox_job_root, job)
    assert "COMPLETED" in told and state(job) == "COMPLETED", told + "\n" + text[-3000:]
    runs = runs_of(sandbox_job_root, job)
    assert (sandbox_job_root / job / "last_run").read_text().split() == [str(runs), "0", "ended"]
    time.sleep(5)  # a rank of an earlier run requeueing late would bring the finished job back now
    assert state(job) == "COMPLETED" and runs_of(sandbox_job_root, job) == runs
    assert_identical(uninterrupted, final_params(sandbox_job_root, job))
