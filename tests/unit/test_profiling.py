"""--profile in the job: torch.profiler traces of the chosen steps on the chosen ranks (real gloo runs of two
processes), nsys through a stand-in ``nsys`` on PATH that records its arguments and runs the rank as its child
(as Nsight Systems does), NVTX-style ranges around the step's parts, and nothing at all when it is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_train import contract
from hpc_train.jobs import traces
from hpc_train.runtime.boot import FOLDER as BOOT
from hpc_train.runtime.boot import hpc_train_nsys
from hpc_train.runtime.context import Context
from hpc_train.runtime.engine.backend import AllReduceRuntime
from hpc_train.runtime.launch.environment import detect
from hpc_train.runtime.observe.profiling import Ranges
from hpc_train.runtime.options import RuntimeOptions
from tests.conftest import REPO, free_port
from tests.rank_launcher import run_world

SCRIPT = """\
import json, os, sys
import torch
import hpc_train.runtime as rt

ctx = rt.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
for _ in range(int(os.environ["STEPS"])):
    ctx.backward(model(torch.randn(8, 16)).pow(2).mean())
    ctx.step()
seen = {"argv": sys.argv[1:], "pid": os.getpid(), "wrapped": os.environ.get("HPC_TRAIN_NSYS_WRAPPED")}
with open(os.path.join(os.environ["HPC_TRAIN_JOB_FOLDER"], f"rank{ctx.rank}.json"), "w") as f:
    json.dump(seen, f)
ctx.shutdown()
"""

# Nsight Systems' stand-in: the arguments it was given, then the application as its child process
STUB = """\
#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["NSYS_STUB_LOG"], "a") as f:
    f.write(json.dumps({{"argv": args, "pid": os.getpid()}}) + "\\n")
app = next(i for i, a in enumerate(args) if i > 0 and not a.startswith("-"))
raise SystemExit(subprocess.call(args[app:]))
"""


def job_env(tmp_path: Path, profile: str, steps: int, **extra: str) -> dict[str, str]:
    folder = tmp_path / "job"
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STEPS": str(steps), contract.ENV_METRICS: "0"}
    env.update({contract.ENV_JOB_FOLDER: str(folder), contract.ENV_PROFILE: profile, **extra})
    for name in (contract.ENV_RUN, contract.ENV_NSYS_WRAPPED, contract.ENV_LAUNCH_ADDED_ARGS, contract.ENV_STOP_FILE):
        env.pop(name, None)
    return env


def torchrun(
    tmp_path: Path, env: dict[str, str], *args: str, procs: int = 2, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """The ranks forked (tests/rank_launcher.py), or under torchrun where each must start a new interpreter
    (``fresh``: nsys wraps a rank's python as it starts)."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    if not fresh:
        return run_world([str(script), *args], env, REPO, nproc=procs, timeout=180, out_dir=tmp_path / "out")
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={procs}", "--master-addr=127.0.0.1"]
    command += [f"--master-port={free_port()}", str(script), *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def trace_steps(path: Path) -> list[int]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))


def test_two_gloo_ranks_trace_only_the_chosen_rank_and_steps(tmp_path):
    out = torchrun(tmp_path, job_env(tmp_path, "torch:wait=2,warmup=1,active=2,ranks=1", steps=8))
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "job" / "profile" / "run-1"
    files = sorted(p.name for p in run.iterdir())
    assert len(files) == 1 and files[0].startswith("rank-1.") and files[0].endswith(".pt.trace.json"), files
    trace = run / files[0]
    assert trace_steps(trace) == [3, 4]  # wait 2 + warm-up 1: steps 3 and 4 of the run, nothing else
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" and e["name"] == "aten::addmm" for e in events)
    assert any("all_reduce" in e.get("name", "") or "allreduce" in e.get("name", "") for e in events)  # DDP's gradients
    assert "rank 1 records steps 3-4 of this run with torch" in out.stderr and "rank 0 records" not in out.stderr
    # the login side reads it: the rank, its steps, communication apart from compute
    summary = traces.summary(tmp_path / "job")
    assert summary is not None and [(t["rank"], t["steps"]) for t in summary["traces"]] == [(1, [3, 4])]
    assert 0 < summary["traces"][0]["comm_share"] < 1 and summary["top"]


def make_ctx(profile: str | None, monkeypatch, tmp_path: Path) -> Context:
    monkeypatch.setenv(contract.ENV_JOB_FOLDER, str(tmp_path))
    monkeypatch.delenv(contract.ENV_RUN, raising=False)
    env = detect({})
    runtime = AllReduceRuntime(env, RuntimeOptions(profile=profile))
    runtime.init()
    return Context(env, "torchrun", runtime, metrics=False)


def train(ctx: Context, steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(steps):
        ctx.backward(model(torch.randn(8, 4)).pow(2).mean())
        assert ctx.step()
    return model


def test_the_wait_steps_do_not_step_the_torch_profiler(monkeypatch, tmp_path):
    ctx = make_ctx("torch:wait=4,warmup=1,active=1", monkeypatch, tmp_path)
    train(ctx, 3)
    profiler = ctx.profiler
    assert profiler is not None and profiler.started and profiler._torch.step_num == 0  # three steps, no profiler step
    train_more = ctx.runtime.model
    ctx.backward(train_more(torch.randn(8, 4)).pow(2).mean())
    ctx.step()  # step 4 starts the warm-up: the skipped steps are stepped through at once
    assert profiler._torch.step_num == 4
    ctx.shutdown()


def test_a_run_that_ends_inside_its_window_keeps_what_it_recorded(monkeypatch, tmp_path, capsys):
    ctx = make_ctx("torch:wait=1,warmup=1,active=5", monkeypatch, tmp_path)
    train(ctx, 4)  # steps 0-3, then step 4 under way when the script shuts down: 2-4 of 2-6
    ctx.shutdown()
    (trace,) = (tmp_path / "profile" / "run-1").glob("rank-0.*.pt.trace.json")
    assert trace_steps(trace) == [2, 3, 4]
    assert ctx.profiler is not None and ctx.profiler.done
    assert "trace of steps 2-4 (the run ended inside its window)" in capsys.readouterr().err


def test_off_or_on_another_rank_nothing_is_wrapped_or_hooked(monkeypatch, tmp_path, capsys):
    for profile in (None, "torch:ranks=3"):
        ctx = make_ctx(profile, monkeypatch, tmp_path)
        assert ctx.profiler is None
        model = train(ctx, 2)
        assert {"backward", "step", "synchronize_gradients"}.isdisjoint(vars(ctx.runtime)) and "forward" not in vars(model)
        ctx.shutdown()
    assert "names rank(s) [3], which this job of 1 does not have" in capsys.readouterr().err
    assert not (tmp_path / "profile").exists()


def test_on_the_cpu_profiling_adds_no_ranges(monkeypatch, tmp_path):
    ctx = make_ctx("nsys:wait=0,warmup=0,active=1", monkeypatch, tmp_path)
    assert ctx.profiler is not None and ctx.profiler.ranges is None and not ctx.profiler.cuda
    model = train(ctx, 2)
    assert "backward" not in vars(ctx.runtime) and "forward" not in vars(model)
    ctx.shutdown()


def test_ranges_mark_forward_backward_the_step_its_communication_and_checkpoints(monkeypatch, tmp_path):
    ctx = make_ctx("torch:wait=10", monkeypatch, tmp_path)
    assert ctx.profiler is not None
    marks: list[str] = []
    # NVTX needs CUDA: the same ranges, recorded; the model, runtime and checkpointer are the real ones
    ctx.profiler.ranges = Ranges(marks.append, lambda: marks.append("end"))
    model = train(ctx, 1)
    assert marks == ["forward", "end", "backward", "end", "optimizer step", "gradient communication", "end", "end"]
    marks.clear()
    ctx.checkpointer(str(tmp_path / "ckpt"), async_save=False).save(1)
    assert marks == ["checkpoint", "end"] and (tmp_path / "ckpt" / "step-00000001" / "COMMIT").is_file()
    assert "forward" in vars(model)
    ctx.shutdown()


# -- nsys ---------------------------------------------------------------------------------------------


def stub_nsys(tmp_path: Path) -> tuple[Path, Path]:
    stub = tmp_path / "bin" / "nsys"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    return stub, tmp_path / "nsys.log"


def nsys_env(tmp_path: Path, profile: str, steps: int) -> dict[str, str]:
    stub, log = stub_nsys(tmp_path)
    env = job_env(tmp_path, profile, steps, NSYS_STUB_LOG=str(log))
    env.update({contract.ENV_PROFILE_SCRIPT: str(tmp_path / "job.py"), "PYTHONPATH": BOOT})
    env["PATH"] = f"{stub.parent}{os.pathsep}{env['PATH']}"  # the site says nothing: nsys on PATH
    env.pop(contract.ENV_NSYS, None)
    return env


def test_nsys_runs_the_chosen_ranks_python_under_it_with_a_capture_range(tmp_path):
    out = torchrun(tmp_path, nsys_env(tmp_path, "nsys:wait=1,warmup=1,active=2,ranks=1", steps=5), "--lr", "1e-3", fresh=True)
    assert out.returncode == 0, out.stderr[-3000:]
    calls = [json.loads(line) for line in (tmp_path / "nsys.log").read_text().splitlines()]
    assert len(calls) == 1  # rank 1 only, once: its child and the children's children are not wrapped again
    argv = calls[0]["argv"]
    output = tmp_path / "job" / "profile" / "run-1" / "rank-1"
    assert argv == [
        "profile",
        "--trace=cuda,nvtx,osrt",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--force-overwrite=true",
        f"--output={output}",
        sys.executable,
        "-u",
        str(tmp_path / "job.py"),
        "--lr",
        "1e-3",
    ]
    seen = {r: json.loads((tmp_path / "job" / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert seen[0]["wrapped"] is None and seen[1]["wrapped"] == str(calls[0]["pid"])  # the stub was rank 1's process
    assert seen[1]["pid"] != calls[0]["pid"] and seen[1]["argv"] == ["--lr", "1e-3"]  # the script ran as its child
    assert output.parent.is_dir()
    # on the CPU the runtime says why the report holds nothing (the capture range is CUDA's profiler API)
    assert "rank 1 runs on the CPU: nsys's capture range is CUDA's profiler API" in out.stderr


def test_nsys_under_the_launch_shim_keeps_the_script_its_own_arguments(tmp_path):
    # srun and mpirun: the shim adds --local_rank=N for DeepSpeed-style scripts and records it for the
    # process it becomes; under nsys the script runs in nsys's child, which must take that record over
    env = nsys_env(tmp_path, "nsys:wait=0,warmup=0,active=1", steps=2)
    env.update({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NNODES": "1", "SLURM_NODEID": "0"})
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    (tmp_path / "job.py").write_text(SCRIPT)
    command = [sys.executable, "-m", "hpc_train.runtime.launch.worker", "--local-rank-arg", "--", str(tmp_path / "job.py"), "x"]
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    (call,) = [json.loads(line) for line in (tmp_path / "nsys.log").read_text().splitlines()]
    assert call["argv"][-3:] == [str(tmp_path / "job.py"), "--local_rank=0", "x"]
    seen = json.loads((tmp_path / "job" / "rank0.json").read_text())
    assert seen["argv"] == ["x"] and seen["pid"] != call["pid"]


def test_the_wrapper_leaves_launchers_tools_and_other_scripts_alone(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    env = {contract.ENV_PROFILE_SCRIPT: str(script), "RANK": "3", "WORLD_SIZE": "4"}
    assert hpc_train_nsys.runs_the_script(env, str(script))
    assert not hpc_train_nsys.runs_the_script(env, "-m")  # torch.distributed.run, the launch shim, hpc_train's tools
    assert not hpc_train_nsys.runs_the_script(env, str(tmp_path / "other.py"))
    assert not hpc_train_nsys.runs_the_script({}, str(script))
    assert hpc_train_nsys.rank_and_world(env) == (3, 4)
    assert hpc_train_nsys.rank_and_world({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == (1, 2)
    assert hpc_train_nsys.rank_and_world({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == (5, 8)
    assert hpc_train_nsys.rank_and_world({"SLURM_PROCID": "5"}) is None
    argv = hpc_train_nsys.command(
        {contract.ENV_NSYS: "/opt/nsys", contract.ENV_JOB_FOLDER: "/j", contract.ENV_RUN: "2"}, 3, ["py", "-u", "t.py"], "/py"
    )
    assert argv[0] == "/opt/nsys" and "--output=/j/profile/run-2/rank-3" in argv and argv[-3:] == ["/py", "-u", "t.py"]


@pytest.mark.parametrize("record, adopted", [({"pid": 10, "args": ["--local_rank=0"]}, 20), ({"pid": 11, "args": []}, 11)])
def test_nsyss_child_takes_over_only_the_wrapped_processs_launch_record(record, adopted):
    env = {contract.ENV_LAUNCH_ADDED_ARGS: json.dumps(record)}
    hpc_train_nsys.adopt_launch_record(env, 10, 20)
    assert json.loads(env[contract.ENV_LAUNCH_ADDED_ARGS])["pid"] == adopted
