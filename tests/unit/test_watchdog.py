"""The hang watchdog off Slurm, against real processes: one that trains and then blocks, one that ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hpc_train.runtime.supervise import watchdog
from hpc_train.runtime.supervise.watchdog import Settings, StepClock, limit

# a rank that makes 30 steps with hpc_train's heartbeat, then blocks (or ends) as a hung rank would
RANK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hpc_train.runtime.lifecycle.heartbeat import Heartbeat, dump_folder
    job = Path(sys.argv[1])
    beat = Heartbeat(job / "heartbeats", int(sys.argv[2]), 1, dump_folder(job, 1), poll_s=0.2)
    for _ in range(30):
        time.sleep(0.01)
        beat.beat()
    if sys.argv[3] == "hang":
        time.sleep(1000)
    beat.finishing()
    beat.close()
""")


def env(job: Path, timeout: str, world: int = 2) -> dict[str, str]:
    return {
        **os.environ,
        "HPC_TRAIN_JOB_FOLDER": str(job),
        "HPC_TRAIN_HEARTBEATS": str(job / "heartbeats"),
        "HPC_TRAIN_RUN": "1",
        "HPC_TRAIN_NODES": str(world),
        "HPC_TRAIN_PROCS_PER_NODE": "1",
        "HPC_TRAIN_HANG_TIMEOUT": timeout,
        "SLURM_JOB_ID": "",
    }


def start_ranks(job: Path, how: str, world: int = 2) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", RANK, str(job), str(rank), how], env=env(job, "3", world))
        for rank in range(world)
    ]


def test_a_blocked_run_is_declared_hung_with_stacks_and_ended(tmp_path):
    ranks = start_ranks(tmp_path, "hang")
    # the watchdog watches rank 0's process as "the step" and kills it when it declares the hang
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.supervise.watchdog", "--step-pid", str(ranks[0].pid)],
        env=env(tmp_path, "3"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.time() - started
    ranks[0].wait(timeout=10)
    ranks[1].kill()
    [hang] = [json.loads(line) for line in (tmp_path / "hangs.jsonl").read_text().splitlines()]
    assert ranks[0].returncode == -9 and out.returncode == 0, out.stderr
    # the verdict came at the first poll past the limit (a bound on quiet_s itself is the load's, not ours)
    assert hang["quiet_s"] >= 3 and (hang["quiet_at_last_poll_s"] or 0) <= 3 and took < 3 + 15, (hang, took)
    for rank in (0, 1):  # both ranks answered from their heartbeat thread while the main thread slept
        assert "in <module>" in (Path(hang["dumps"]) / f"rank-{rank}.txt").read_text()
    assert "hang in run 1: no rank active" in out.stderr
    assert (tmp_path / "hang_run").read_text().strip() == "1"


def test_a_stopped_rank_is_named_and_its_stacks_read_from_outside(tmp_path):
    ranks = start_ranks(tmp_path, "hang")
    beat = tmp_path / "heartbeats" / "rank-1.json"
    deadline = time.time() + 30
    while time.time() < deadline and json.loads(beat.read_text() if beat.exists() else '{"steps": 0}')["steps"] < 30:
        time.sleep(0.1)
    os.kill(ranks[1].pid, signal.SIGSTOP)  # it can never answer from inside now
    try:
        out = subprocess.run(
            [sys.executable, "-m", "hpc_train.runtime.supervise.watchdog", "--step-pid", str(ranks[0].pid)],
            env=env(tmp_path, "3"),
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        ranks[1].kill()
        ranks[0].kill()
    [hang] = [json.loads(line) for line in (tmp_path / "hangs.jsonl").read_text().splitlines()]
    [culprit] = hang["culprits"]
    assert culprit["rank"] == 1 and culprit["reason"].startswith("did not answer"), (culprit, out.stderr)
    assert culprit["top"] and culprit["top"][0].endswith("in <module>"), culprit  # its sleep, read by py-spy
    text = (Path(hang["dumps"]) / "rank-1.txt").read_text()
    assert "no answer from inside; read by py-spy" in text and "read by py-spy):" in text, text


# two gloo ranks with the flight recorder on; rank 1 stops calling collectives after 5, rank 0 waits in the 6th
COLLECTIVES = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    from hpc_train.runtime.lifecycle.heartbeat import Heartbeat, dump_folder
    job, rank = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    beat = Heartbeat(job / "heartbeats", rank, 1, dump_folder(job, 1), poll_s=0.2)
    t = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(t)
    beat.beat()
    if rank == 1:
        time.sleep(1000)  # inside the script's own code: busy, in the stacks' terms, like a slow data loader
    dist.all_reduce(t)
""")


def test_the_flight_recorder_names_the_rank_that_has_not_entered_the_collective(tmp_path):
    environ = {
        **env(tmp_path, "3"),
        "TORCH_FR_BUFFER_SIZE": "100",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29400 + os.getpid() % 500),
    }
    ranks = [subprocess.Popen([sys.executable, "-c", COLLECTIVES, str(tmp_path), str(r)], env=environ) for r in (0, 1)]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "hpc_train.runtime.supervise.watchdog", "--step-pid", str(ranks[0].pid)],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for rank in ranks:
            rank.kill()
    [hang] = [json.loads(line) for line in (tmp_path / "hangs.jsonl").read_text().splitlines()]
    [culprit] = hang["culprits"]
    assert culprit["rank"] == 1, (hang["culprits"], out.stderr)
    assert culprit["reason"] == (
        "has not entered collective #6 (gloo:all_reduce, process group 0) that the others wait in; its last was #5"
    ), culprit
    record = json.loads((Path(hang["dumps"]) / "rank-0.fr.json").read_text())
    assert record["entries"][-1]["profiling_name"] == "gloo:all_reduce"


def test_a_run_that_finishes_is_left_alone(tmp_path):
    ranks = start_ranks(tmp_path, "end")
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.supervise.watchdog", "--step-pid", str(ranks[0].pid)],
        env=env(tmp_path, "3"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    for rank in ranks:
        assert rank.wait(timeout=30) == 0
    assert out.returncode == 0 and not (tmp_path / "hangs.jsonl").exists(), out.stderr


def settings(tmp_path: Path, timeout: float | None, world: int = 2) -> Settings:
    return Settings(job_folder=tmp_path, heartbeats=tmp_path, run=1, world=world, timeout=timeout, stop_file=None, job_id=None)


def test_start_up_has_its_own_longer_allowance(tmp_path):
    started = {0: {"steps": 0, "at": 1.0}, 1: {"steps": 5, "at": 1.0}}
    allowed, why = limit(settings(tmp_path, 10), started, StepClock())
    assert allowed == watchdog.START_S and why == "start-up allowance"
    assert limit(settings(tmp_path, 10), {0: {"steps": 5, "at": 1.0}}, StepClock())[1] == "start-up allowance"


def test_the_timeout_is_learned_from_the_run_unless_given(tmp_path):
    clock = StepClock()
    for steps in range(1, 101):
        clock.observe(steps, steps * 30.0)  # 30 s a step: K x 30 s is past the floor
    training = {0: {"steps": 100, "at": 3000.0}, 1: {"steps": 100, "at": 3000.0}}
    allowed, why = limit(settings(tmp_path, None), training, clock)
    assert allowed == watchdog.K * 30.0 and why.startswith("learned")
    fast = StepClock()
    fast.observe(1, 0.0)
    fast.observe(1000, 10.0)
    assert limit(settings(tmp_path, None), training, fast)[0] == watchdog.FLOOR_S
    assert limit(settings(tmp_path, 42), training, clock) == (42, "--hang-timeout")


def test_plain_scripts_get_a_longer_learned_limit_than_runtime_scripts(tmp_path):
    clock = StepClock()
    clock.observe(10, 100.0)
    clock.observe(20, 101.0)  # 0.1 s a step: the floors decide
    runtime = {0: {"steps": 20, "at": 101.0}, 1: {"steps": 20, "at": 101.0}}
    plain = {rank: {**beat, "plain": True} for rank, beat in runtime.items()}
    assert limit(settings(tmp_path, None), runtime, clock)[0] == watchdog.FLOOR_S
    assert limit(settings(tmp_path, None), plain, clock)[0] == watchdog.PLAIN_FLOOR_S
    assert limit(settings(tmp_path, 42), plain, clock) == (42, "--hang-timeout")


def dump(cpu: float, stack: str = 'File "/jobs/train.py", line 44 in <module>') -> str:
    return f"rank 0 on n1 (pid 7), 0 steps this run, last at 03:20:23, cpu {cpu:.3f} s\nThread 0x00007f00 (most recent call first):\n  {stack}\n"


def test_ranks_sit_still_only_with_the_same_stack_and_next_to_no_cpu():
    assert watchdog.sat_still({0: dump(1.0), 1: dump(2.0)}, {0: dump(1.01), 1: dump(2.2)}) == ""
    assert "rank 1 works (3.0 s of CPU in 5 s)" in watchdog.sat_still({0: dump(1.0), 1: dump(2.0)}, {0: dump(1.0), 1: dump(5.0)})
    moved = {0: dump(1.0, 'File "/jobs/train.py", line 45 in <module>')}
    assert "rank 0 moves" in watchdog.sat_still({0: dump(1.0)}, moved)
    assert "not every rank answered" in watchdog.sat_still({0: dump(1.0), 1: dump(1.0)}, {0: dump(1.0)})
    assert "does not say its CPU time" in watchdog.sat_still({0: dump(1.0)}, {0: dump(1.0).replace(", cpu 1.000 s", "")})
