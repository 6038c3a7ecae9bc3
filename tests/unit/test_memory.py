"""--micro-batch: batches split and accumulated to the same step, auto's probe, a step redone after an OOM.

The out-of-memory errors are real: the ranks run under an address-space limit (RLIMIT_AS) the test sets
before torch allocates, so a micro-batch too big for it raises the CPU allocator's own error.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from hpc_train.runtime.context import Context
from hpc_train.runtime.engine.backend import BackendRuntime
from hpc_train.runtime.launch.environment import detect
from hpc_train.runtime.options import RuntimeOptions
from hpc_train.runtime.step import memory
from tests.conftest import REPO
from tests.rank_launcher import run_world

# One rank's job: a batch of 2048 needs ~500 MB of activations and gradients, 512 a quarter of that.
# The activations (batch x 16384) are what fill the budget: 8 inputs, not 64, do the same with an eighth of the
# first layer's arithmetic (the two jobs of each test took 31.4 s of CPU with 64, 27.8 s with 8).
SCRIPT = """\
import ctypes, json, os, resource, sys
from pathlib import Path
import torch

def vm_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))

budget = int(os.environ.get("TEST_MEMORY_BUDGET_MB", "0")) * 2**20
if budget:  # torch's libraries are mapped, no tensor is allocated yet
    # glibc reads MALLOC_ARENA_MAX when a process starts, and a rank forked from the tests' server
    # (tests/rank_launcher.py) started long before: without the cap each new thread's arena reserved
    # 64 MB of the budget, and a run under load ran out of it at any micro-batch (and of threads)
    if os.environ.get("MALLOC_ARENA_MAX"):
        assert ctypes.CDLL(None).mallopt(-8, int(os.environ["MALLOC_ARENA_MAX"])) == 1  # M_ARENA_MAX
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + budget, resource.RLIM_INFINITY))

from torch.utils.data import TensorDataset
import hpc_train.runtime as rt

out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["HPC_TRAIN_JOB_FOLDER"])
ctx = rt.init()
torch.manual_seed(0)
x = torch.randn(2 * 2 * 2048, 8)
y = x[:, :1].clone()
model = torch.nn.Sequential(torch.nn.Linear(8, 16384), torch.nn.ReLU(), torch.nn.Linear(16384, 1))
model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.001))
loader = ctx.loader(TensorDataset(x, y), batch_size=2048)
steps, seen = 0, 0
for xb, yb in ctx.batches(loader, 0, 4):
    seen += len(xb)
    ctx.backward(torch.nn.functional.mse_loss(model(xb), yb))
    steps += ctx.step()
params = torch.cat([p.detach().reshape(-1) for p in ctx.unwrap(model).parameters()]).double()
result = {"steps": steps, "seen": seen, "micro_batch": ctx.memory.micro, "checksum": params.sum().item(), "norm": params.norm().item()}
(out / f"rank{ctx.rank}.json").write_text(json.dumps(result))
ctx.shutdown()
"""

BUDGET_MB = 400  # over what torch maps at import: a batch of 2048 needs ~650 MB more, one of 512 ~280 MB


def run_job(folder: Path, micro_batch: str, budget_mb: int = BUDGET_MB) -> tuple[list[dict], list[dict], str]:
    """Two gloo ranks under torchrun with the torchrun backend (DDP); (ranks' results, metrics lines, log)."""
    folder.mkdir(parents=True)
    script = folder / "job.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",  # glibc's per-thread arenas would each reserve 64 MB of the address space
        "HPC_TRAIN_BACKEND": "torchrun",
        "HPC_TRAIN_MICRO_BATCH": micro_batch,
        "HPC_TRAIN_METRICS_DIR": str(folder / "metrics"),
        "HPC_TRAIN_STOP_FILE": str(folder / "no-stop-file"),
        "TEST_MEMORY_BUDGET_MB": str(budget_mb),
    }
    env.pop("HPC_TRAIN_JOB_FOLDER", None)
    done = run_world([str(script), str(folder)], env, REPO, nproc=2, timeout=240, out_dir=folder)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    lines = [json.loads(line) for line in (folder / "metrics" / "steps.jsonl").read_text().splitlines()]
    return ranks, lines, done.stdout + done.stderr


def losses(lines: list[dict]) -> list[float]:
    return [line["loss"] for line in lines if "step" in line and "event" not in line and "loss" in line]


def events(lines: list[dict], kind: str) -> list[dict]:
    return [line for line in lines if line.get("event") == kind]


def assert_same_training(a: list[dict], b: list[dict], lines_a: list[dict], lines_b: list[dict]) -> None:
    for ra, rb in zip(a, b):
        assert ra["steps"] == rb["steps"] == 4
        assert ra["checksum"] == pytest.approx(rb["checksum"], rel=1e-7, abs=1e-9)
        assert ra["norm"] == pytest.approx(rb["norm"], rel=1e-9)
    assert a[0]["checksum"] == a[1]["checksum"]  # the ranks stayed in step
    assert len(losses(lines_a)) == 4 and losses(lines_a) == pytest.approx(losses(lines_b), rel=1e-6)


def test_an_out_of_memory_step_is_redone_with_half_the_micro_batch(tmp_path):
    big, lines, log = run_job(tmp_path / "big", "2048")
    assert "DefaultCPUAllocator: can't allocate memory" in log  # the allocator's own error, under the limit
    assert "micro-batch 1024 of the batch of 2048 (2 per step; out of memory with 2048)" in log
    final = big[0]["micro_batch"]
    assert final < 2048 and big[1]["micro_batch"] == final  # the ranks agreed
    changes = events(lines, "micro_batch")
    assert changes[0]["reason"] == "--micro-batch" and changes[-1]["micro_batch"] == final
    assert all(c["reason"].startswith("out of memory") for c in changes[1:]) and changes[1]["step"] == 1
    peaks = events(lines, "run_end")[-1]  # every rank's peak, gathered at the end
    assert peaks["device"] == "cpu" and len(peaks["peak_bytes"]) == 2 and all(p > 2**20 for p in peaks["peak_bytes"])
    assert all(r["peak_mem_bytes"] > 2**20 for r in lines if "step" in r and "event" not in r and "peak_mem_bytes" in r)
    # the same global batch throughout: a run with the smaller micro-batch from the start trains alike. It
    # gets room to spare: 1024 sits near this budget's edge (a fresh clone's run once ran out of it at the
    # first step), and what it checks is the training, not the limit
    small, small_lines, small_log = run_job(tmp_path / "small", str(final), budget_mb=BUDGET_MB + 300)
    assert "out of memory with" not in small_log and small[0]["micro_batch"] == final
    assert_same_training(big, small, lines, small_lines)


def test_auto_picks_a_micro_batch_that_fits_and_leaves_the_model_as_it_was(tmp_path):
    auto, lines, log = run_job(tmp_path / "auto", "auto")
    chosen = events(lines, "micro_batch")[0]
    assert chosen["reason"] == "auto" and chosen["batch"] == 2048 and chosen["micro_batch"] < 2048
    assert chosen["probed"][0] == "1" and chosen["probed"][-1].endswith("(too big)")
    assert f"micro-batch {chosen['micro_batch']} of the batch of 2048" in log
    # had the probe's steps (real backward and SGD steps) stayed in the model, the weights would differ
    fixed, fixed_lines, _ = run_job(tmp_path / "fixed", str(auto[0]["micro_batch"]))
    assert_same_training(auto, fixed, lines, fixed_lines)


# -- one process ------------------------------------------------------------------------------------------


def make_ctx(micro_batch: str | None) -> Context:
    env = detect({})
    runtime = BackendRuntime(env, RuntimeOptions(micro_batch=micro_batch))
    runtime.init()
    return Context(env, "torchrun", runtime, metrics=False)


def train(micro_batch: str | None, steps: int = 3, optimizer: type = torch.optim.SGD) -> tuple[list[float], list[bool], Context]:
    ctx = make_ctx(micro_batch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    model, _ = ctx.prepare(model, optimizer(model.parameters(), lr=0.01))
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    stepped = []
    for xb, yb in ctx.batches(ctx.loader(data, batch_size=16, seed=1), 0, steps):
        ctx.backward(torch.nn.functional.mse_loss(model(xb), yb))
        stepped.append(ctx.step())
    return [p.detach().clone() for p in model.parameters()], stepped, ctx


def test_micro_batches_make_the_step_of_the_whole_batch():
    whole, whole_steps, _ = train(None)
    split, split_steps, _ = train("4")
    assert whole_steps == [True] * 3
    assert split_steps == ([False] * 3 + [True]) * 3  # four micro-batches, one step per batch the script gave
    for a, b in zip(whole, split):
        assert torch.allclose(a, b, atol=1e-6)
    uneven, uneven_steps, _ = train("6")  # 6 + 6 + 4: each weighted by its share of the batch
    assert uneven_steps == [False, False, True] * 3
    for a, b in zip(whole, uneven):
        assert torch.allclose(a, b, atol=1e-6)


def test_auto_probe_puts_model_optimizer_and_rng_back():
    # Adam: the probe's optimizer steps create state, dropout draws random numbers; neither may stay
    fixed, _, _ = train("16", optimizer=torch.optim.Adam)
    auto, stepped, ctx = train("auto", optimizer=torch.optim.Adam)
    assert ctx.memory.micro == 16 and stepped == [True] * 3
    for a, b in zip(fixed, auto):
        assert torch.equal(a, b)


def test_a_restored_run_keeps_the_halved_micro_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_STOP_FILE", str(tmp_path / "no-stop-file"))
    ctx = make_ctx("8")
    ctx.prepare(torch.nn.Linear(2, 1), None)
    ctx.memory.micro = 2  # as after two out-of-memory halvings
    ckpt = ctx.checkpointer(tmp_path / "ckpt")
    ckpt.save(5)
    ckpt.close()
    again = make_ctx("8")
    again.prepare(torch.nn.Linear(2, 1), None)
    restored = again.checkpointer(tmp_path / "ckpt")
    try:
        assert restored.restore() == 5
    finally:
        restored.close()  # its stop-file watcher must not outlive the test
    assert again.memory.micro == 2


def test_the_allocators_errors_are_recognised():
    with pytest.raises(RuntimeError) as real:
        torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator's own error
    assert memory.is_oom(real.value)
    assert memory.is_oom(MemoryError()) and memory.is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not memory.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert memory.parse("auto") is None and memory.parse("8") == 8
    with pytest.raises(ValueError, match="'auto' or at least 1"):
        memory.parse("0")


def test_batches_are_cut_and_outputs_joined_along_the_first_dimension():
    x, y = torch.arange(10).reshape(5, 2), torch.arange(5)
    assert memory.pieces(5, 2) == [(0, 2), (2, 4), (4, 5)]
    cut = memory._slice({"x": x, "y": [y], "scale": torch.tensor(2.0)}, 5, 2, 4)
    assert cut["x"].tolist() == [[4, 5], [6, 7]] and cut["y"][0].tolist() == [2, 3] and cut["scale"].item() == 2.0
    assert memory.batch_len((x, y)) == 5
    joined = memory._merge([(x[:2], torch.tensor(1.0)), (x[2:], torch.tensor(4.0))], [2, 3])
    assert torch.equal(joined[0], x) and joined[1].item() == pytest.approx(1.0 * 2 / 5 + 4.0 * 3 / 5)


# -- bad input: refused before submission -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--micro-batch", "0"], "--micro-batch: expected 'auto' or a whole number of samples of at least 1 (like 8), got '0'"),
        (["--micro-batch", "lots"], "got 'lots'"),
        (["--micro-batch", "auto", "--backend", "deepspeed"], "backend 'deepspeed' cannot change the micro-batch as it runs"),
        (["--micro-batch", "8", "--grad-accum", "4"], "--micro-batch sets the accumulation itself"),
    ],
)
def test_bad_micro_batch_settings_are_refused_before_submission(tmp_path, capsys, args, message):
    from hpc_train.cli import main

    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["render", "--site", "local", *args, str(script)]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    if "deepspeed" in args:
        assert "ds_config" in err and "--backend mpi or torchrun" in err  # the backend's reason, and who can


# -- out of memory in the optimizer step: its state is the parameters' size, not the batch's ------------------

# 33.6 M parameters (134 MB): weights, gradients and DDP's buckets fit in the budget with room for the step's
# averaging; SGD without momentum updates in place, Adam's first step adds two moments and a temporary of that size.
OPTIMIZER_SCRIPT = (
    SCRIPT.split("out = Path")[0]
    + """\
ctx = rt.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1))
optimizer = torch.optim.Adam if sys.argv[1] == "adam" else torch.optim.SGD
model, opt = ctx.prepare(model, optimizer(model.parameters(), lr=0.001))
x = torch.randn(2 * 2 * 16, 4096)
loader = ctx.loader(TensorDataset(x, x[:, :1].clone()), batch_size=16)
for xb, yb in ctx.batches(loader, 0, 2):
    ctx.backward(torch.nn.functional.mse_loss(model(xb), yb))
    ctx.step()
print(f"rank {ctx.rank} trained 2 steps", flush=True)
ctx.shutdown()
"""
)
OPTIMIZER_BUDGET_MB = 850  # SGD ran out below 700 here, Adam still at 1000


def run_optimizer_job(folder: Path, optimizer: str, micro_batch: str = "8") -> subprocess.CompletedProcess:
    folder.mkdir(parents=True)
    script = folder / "job.py"
    script.write_text(OPTIMIZER_SCRIPT)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
        "HPC_TRAIN_BACKEND": "torchrun",
        "HPC_TRAIN_MICRO_BATCH": micro_batch,
        "HPC_TRAIN_METRICS": "0",
        "HPC_TRAIN_NO_RETRY_FILE": str(folder / "no-retry"),
        "HPC_TRAIN_STOP_FILE": str(folder / "no-stop-file"),
        "TEST_MEMORY_BUDGET_MB": str(OPTIMIZER_BUDGET_MB),
    }
    env.pop("HPC_TRAIN_JOB_FOLDER", None)
    return run_world([str(script), optimizer], env, REPO, nproc=2, timeout=240, out_dir=folder)


def test_out_of_memory_in_the_optimizer_step_stops_with_why_a_smaller_micro_batch_cannot_help(tmp_path):
    sgd = run_optimizer_job(tmp_path / "sgd", "sgd")  # the same job with a stateless optimizer fits the budget
    assert sgd.returncode == 0, sgd.stdout[-3000:] + sgd.stderr[-3000:]
    assert "rank 0 trained 2 steps" in sgd.stdout and not (tmp_path / "sgd" / "no-retry").exists()
    adam = run_optimizer_job(tmp_path / "adam", "adam")
    log = adam.stdout + adam.stderr
    assert adam.returncode != 0 and "trained 2 steps" not in log
    assert "OptimizerOutOfMemory: rank " in log, log[-3000:]
    assert "out of memory in the optimizer step (Adam, 33,570,817 parameters): RuntimeError: " in log
    assert "DefaultCPUAllocator: can't allocate memory" in log  # the allocator's own error, under the limit
    assert "a smaller --micro-batch cannot help and the step is not redone" in log
    assert "out of memory with 8" not in log and "micro-batch 4 of" not in log  # no halving was tried
    assert "a smaller --micro-batch cannot help" in (tmp_path / "adam" / "no-retry").read_text()  # not requeued
    # auto's probe meets it at one sample: the same reason, not "not even one sample fits"
    auto = run_optimizer_job(tmp_path / "auto", "adam", "auto")
    log = auto.stdout + auto.stderr
    assert auto.returncode != 0 and "not even one sample fits" not in log
    assert (
        "out of memory in the optimizer step (Adam, 33,570,817 parameters): --micro-batch auto's probe of one sample: RuntimeError: "
        in log
    )
