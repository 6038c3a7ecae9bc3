"""Hang detection for scripts that never import hpc_train.runtime (runtime/boot/hpc_train_watch.py): two
real gloo ranks running a plain torch script with the job's boot folder first on PYTHONPATH, as the batch
script runs them, and the real watchdog beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from hpc_train import contract
from hpc_train.runtime.boot import FOLDER as BOOT
from tests.conftest import REPO, free_port
from tests.unit.test_watchdog import env

# plain torch: an all-reduce of the gradients by hand, an optimizer step; after 20 steps rank 1 "hangs"
# (sleeps while rank 0 waits in the all-reduce), or both "evaluate" (compute, no step, no collective)
PLAIN = textwrap.dedent("""
    import sys, time
    import torch, torch.distributed as dist
    how = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(40):
        if step == 20 and how == "hang" and rank == 1:
            time.sleep(1000)
        if step == 20 and how == "evaluate":
            end = time.time() + 8
            while time.time() < end:  # a quarter of a core: working, as the watchdog sees it
                sum(range(300000)); time.sleep(0.01)
        model(torch.randn(8, 4)).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.02)
    dist.barrier()
""")


def start_plain_ranks(tmp_path: Path, source: str, how: str, **extra: str) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """Two gloo ranks of a plain script, with the job's boot folder first on PYTHONPATH as the batch script runs them."""
    script = tmp_path / "plain.py"
    script.write_text(source)
    environ = {
        **env(tmp_path, "3"),
        "PYTHONPATH": os.pathsep.join([BOOT, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        **extra,
    }
    ranks = [subprocess.Popen([sys.executable, str(script), how], env={**environ, "RANK": str(r)}) for r in (0, 1)]
    return ranks, environ


def run(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess, list[subprocess.Popen]]:
    ranks, environ = start_plain_ranks(tmp_path, PLAIN, how)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "hpc_train.runtime.supervise.watchdog", "--step-pid", str(ranks[0].pid)],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for rank in ranks:  # a finished rank may still be exiting when the watchdog has seen it finish
            try:
                rank.wait(timeout=0 if how == "hang" else 30)
            except subprocess.TimeoutExpired:
                rank.kill()
                rank.wait()
    return out, ranks


def test_a_plain_scripts_hung_rank_is_found_by_its_optimizer_steps(tmp_path):
    out, _ = run(tmp_path, "hang")
    [hang] = [json.loads(line) for line in (tmp_path / "hangs.jsonl").read_text().splitlines()]
    beats = {int(rank): beat for rank, beat in hang["ranks"].items()}
    assert beats[0]["steps"] == beats[1]["steps"] == 20, hang  # every optimizer step counted, once
    assert [c["rank"] for c in hang["culprits"]] == [1], out.stderr
    rank1 = (tmp_path / "dumps" / "run-1" / "rank-1.txt").read_text()
    assert "time.sleep(1000)" in rank1 or "plain.py" in rank1, rank1


def test_a_plain_script_that_stops_stepping_to_evaluate_is_not_a_hang(tmp_path):
    out, ranks = run(tmp_path, "evaluate")
    assert not (tmp_path / "hangs.jsonl").exists(), out.stderr
    assert "no rank waits in a collective and " in out.stderr and ": not a hang" in out.stderr, out.stderr
    assert ranks[0].returncode == 0  # trained to the end: the watchdog let it


def hooked(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(BOOT)
    import hpc_train_watch

    monkeypatch.setenv("HPC_TRAIN_HEARTBEATS", str(tmp_path / "heartbeats"))
    monkeypatch.setenv("HPC_TRAIN_JOB_FOLDER", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(contract.ENV_WATCHED_PID, str(os.getpid()))  # install() sets it; undone after the test
    assert hpc_train_watch.install()  # torch.optim is imported here already: hooked at once
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_runtime_script_keeps_its_own_heartbeat_and_the_hook_stands_down(tmp_path, monkeypatch):
    from hpc_train.runtime.lifecycle.heartbeat import Heartbeat, dump_folder

    model, optimizer = hooked(monkeypatch, tmp_path)
    own = Heartbeat(tmp_path / "heartbeats", 0, 1, dump_folder(tmp_path, 1))  # as the Context makes it
    try:
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
        assert own.steps == 0 and Heartbeat.current is own  # only ctx.step() counts, never the hook
        assert not own.plain
    finally:
        own.close()
    assert Heartbeat.current is None


def test_a_plain_rank_heartbeat_starts_at_import_torch_and_counts_every_step(tmp_path, monkeypatch):
    from hpc_train.runtime.lifecycle.heartbeat import Heartbeat

    model, optimizer = hooked(monkeypatch, tmp_path)
    record = json.loads((tmp_path / "heartbeats" / "rank-0.json").read_text())
    assert (record["plain"], record["rank"], record["steps"]) == (True, 0, 0)  # watched before its first step
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizer.step()
    beat = Heartbeat.current
    try:
        assert beat is not None and beat.plain and beat.steps == 2
    finally:
        assert beat is not None
        beat.close()
    optimizer.step()  # the hook goes on counting into its own (closed) heartbeat; remove it for the next tests
    sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks.clear()


# before any optimizer step: rank 1 stops before its first collective while rank 0 waits in it ("hang"),
# or both evaluate with collectives and never step ("evaluate"), which must run to its end
NEVER_STEPPED = textwrap.dedent("""
    import sys, time
    import torch, torch.distributed as dist
    how = sys.argv[1]
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if how == "hang" and dist.get_rank() == 1:
        time.sleep(1000)
    for _ in range(100000 if how == "hang" else 250):  # about 13 s
        dist.all_reduce(t)  # rank 1 waits in it most of the time: in the stacks' terms, like a hang
        if dist.get_rank() == 0:
            time.sleep(0.05)
""")


# before any process group: rank 1 never joins the rendezvous rank 0 waits in ("hang": it sleeps), or
# joins it after preparing its data, working, for 18 s ("prepare"): long enough that the watchdog's second
# look (its 4 s allowance, then two looks RECHECK_S = 2 s apart here, each waiting up to 5 s for answers,
# later on a loaded machine) still finds rank 1 working (with 5 s between the looks, 14 s had once been too
# short). It works a quarter of the time (~0.5 s of CPU between the looks where the watchdog's idle bound is
# 0.25 s x 2/5), on one line so both looks see the same stack
BEFORE_GROUP = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    how = sys.argv[1]
    if os.environ["RANK"] == "1":
        if how == "hang":
            time.sleep(1000)
        end = time.time() + 12
        while time.time() < end: sum(range(300000))
    dist.init_process_group("gloo")
    dist.barrier()
""")


def watch_in_process(tmp_path: Path, how: str, monkeypatch, source: str = NEVER_STEPPED) -> list[subprocess.Popen]:
    from hpc_train.runtime.supervise import watchdog

    ranks, environ = start_plain_ranks(tmp_path, source, how, TORCH_FR_BUFFER_SIZE="100")
    for key in ("HPC_TRAIN_JOB_FOLDER", "HPC_TRAIN_HEARTBEATS", "HPC_TRAIN_RUN", "HPC_TRAIN_NODES", "HPC_TRAIN_PROCS_PER_NODE"):
        monkeypatch.setenv(key, environ[key])
    monkeypatch.delenv("HPC_TRAIN_HANG_TIMEOUT", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(watchdog, "PLAIN_START_S", 4.0)  # 30 min in a job
    monkeypatch.setattr(watchdog, "RECHECK_S", 2.0)  # 5 s in a job: the two looks' rule, not its pace, is checked
    monkeypatch.setattr(watchdog, "IDLE_CPU_S", watchdog.IDLE_CPU_S * 2.0 / 5.0)  # the same share of the time
    # a watch that never ends fails, not hangs; a bound, not a pace: the "evaluate" test failed once in a make
    # test-unit loop beside make test (its output not kept), and run again under that load (17 on the two
    # cores) it took 28-119 s: the 90 s this was is the one bound of this test that such a load crosses
    deadline = threading.Timer(240, lambda: [r.kill() for r in ranks])
    deadline.start()
    try:
        watchdog.main(["--step-pid", str(ranks[0].pid)])
    finally:
        deadline.cancel()
        for rank in ranks:
            try:
                rank.wait(timeout=0 if how == "hang" else 30)
            except subprocess.TimeoutExpired:
                rank.kill()
                rank.wait()
    return ranks


def test_a_plain_script_hung_before_its_first_optimizer_step_is_found_by_its_collectives(tmp_path, monkeypatch, capfd):
    watch_in_process(tmp_path, "hang", monkeypatch)
    [hang] = [json.loads(line) for line in (tmp_path / "hangs.jsonl").read_text().splitlines()]
    assert hang["limit"] == "start-up allowance" and hang["limit_s"] == 4.0, hang
    assert [c["rank"] for c in hang["culprits"]] == [1], capfd.readouterr().err


def test_a_plain_script_that_never_steps_but_keeps_communicating_is_not_a_hang(tmp_path, monkeypatch, capfd):
    ranks = watch_in_process(tmp_path, "evaluate", monkeypatch)
    err = capfd.readouterr().err
    assert not (tmp_path / "hangs.jsonl").exists(), err
    assert "no optimizer step yet" in err and "its collectives go on: not a hang" in err, err
    assert [r.returncode for r in ranks] == [0, 0]  # ran to its end: the watchdog let it


def test_a_rank_that_never_joins_the_rendezvous_is_named_by_stacks_and_cpu_that_stand_still(tmp_path, monkeypatch, capfd):
    watch_in_process(tmp_path, "hang", monkeypatch, BEFORE_GROUP)
    err = capfd.readouterr().err
    [hang] = [json.loads(line) for line in (tmp_path / "hangs.jsonl").read_text().splitlines()]
    assert hang["limit"] == "start-up allowance", hang
    assert [c["rank"] for c in hang["culprits"]] == [1], err  # not in the rendezvous rank 0 waits in
    line = BEFORE_GROUP.splitlines().index("        time.sleep(1000)") + 1
    assert f'plain.py", line {line} in <module>' in (tmp_path / "dumps" / "run-1" / "rank-1.txt").read_text()


def test_a_rank_that_works_before_it_joins_the_rendezvous_is_not_a_hang(tmp_path, monkeypatch, capfd):
    # rank 1 computes without pause: when it computed a third of the time (18 s), a machine loaded six times
    # over (make test beside a make test-unit loop) gave it 0.1 s of CPU in 2 s, the watchdog's threshold
    ranks = watch_in_process(tmp_path, "prepare", monkeypatch, BEFORE_GROUP)
    err = capfd.readouterr().err
    assert not (tmp_path / "hangs.jsonl").exists(), err
    # rank 0 waits in the rendezvous ("but rank 1 works") or, on a machine loaded enough that its first look
    # came before rank 0 got there, waits in no collective yet ("and rank 1 works"): rank 1's work is the verdict
    assert "rank 1 works (" in err and "s of CPU in 2 s): not a hang" in err, err
    assert [r.returncode for r in ranks] == [0, 0]  # it joined, and both ran to the end


def test_a_python_started_by_a_rank_does_not_beat_as_that_rank(tmp_path):
    # a compile worker or a spawned data loader inherits RANK and the boot folder; only the rank beats
    environ = {
        **env(tmp_path, "3"),
        "PYTHONPATH": os.pathsep.join([BOOT, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "RANK": "0",
    }
    environ.pop(contract.ENV_WATCHED_PID, None)
    beat = tmp_path / "heartbeats" / "rank-0.json"
    # the rank imports torch (its heartbeat starts), then a python of its own does; that one says whose beat it finds
    look = f"import json, os, torch; print(json.loads(open({str(beat)!r}).read())['pid'] == os.getppid())"
    rank = f"import subprocess, sys, torch; subprocess.run([sys.executable, '-c', {look!r}], check=True)"
    out = subprocess.run([sys.executable, "-c", rank], env=environ, check=True, timeout=120, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr[-2000:]  # the file is still the rank's, not its child's
    assert json.loads(beat.read_text())["plain"] is True
    beat.unlink()
    subprocess.run(
        [sys.executable, "-c", "import torch"], env={**environ, contract.ENV_WATCHED_PID: "1"}, check=True, timeout=120
    )
    assert not beat.exists()  # started with another process's pid as the rank's: not the rank


# A DeepSpeed rank where a watchdog runs: the launch shim adds --local_rank=0 (as the deepspeed launcher does),
# the boot folder's watch starts the plain heartbeat once `import torch` has finished. A script that then
# imports hpc_train.runtime reads exactly its own arguments; a plain one keeps the launcher's (issue 31).
ARGV_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    if sys.argv[-3] == "runtime":  # before the runtime is imported: the launcher's word may still be first
        import hpc_train.runtime
        from hpc_train.runtime.lifecycle.heartbeat import Heartbeat
        assert Heartbeat is sys.modules["hpc_train.runtime.lifecycle.heartbeat"].Heartbeat
    print(json.dumps(sys.argv[1:]))
""")


@pytest.mark.parametrize(
    "kind, seen",
    [("runtime", ["runtime", "--lr", "1e-4"]), ("plain", ["--local_rank=0", "plain", "--lr", "1e-4"])],
)
def test_the_launchers_local_rank_is_taken_off_for_a_runtime_script_where_the_watchdog_runs(tmp_path, kind, seen):
    script = tmp_path / "train.py"
    script.write_text(ARGV_SCRIPT)
    environ = {**env(tmp_path, "30", world=1), "PYTHONPATH": os.pathsep.join([BOOT, str(REPO)]), "RANK": "0"}
    environ.pop(contract.ENV_WATCHED_PID, None)
    shim = [sys.executable, "-m", "hpc_train.runtime.launch.worker", "--local-rank-arg", "--", str(script), kind, "--lr", "1e-4"]
    out = subprocess.run(shim, env=environ, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == seen
    assert json.loads((tmp_path / "heartbeats" / "rank-0.json").read_text())["plain"] is True  # the watch ran
