"""Bad numerics: a non-finite loss on one rank skips the step on every rank, is counted and reported,
stops the run after --max-bad-steps in a row, or rolls back to the last checkpoint.

The multi-process tests start real ranks (torchrun with gloo; mpirun for the mpi and horovod backends)
that train the same small model twice in the same processes: once with NaN injected into one rank's
batch, once skipping those batches altogether. The two must end with the very same parameters.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_train import contract
from hpc_train.jobs import report
from hpc_train.runtime.context import Context
from hpc_train.runtime.engine.backend import FUSED_PROBE_ELEMENTS, BackendRuntime, _flag_view
from hpc_train.runtime.launch.environment import detect
from hpc_train.runtime.options import RuntimeOptions
from hpc_train.runtime.step.numerics import DivergenceError, NumericsGuard
from tests.conftest import REPO
from tests.rank_launcher import run_world

SCRIPT = """\
import json, sys
from pathlib import Path
import torch
from torch.utils.data import TensorDataset
from hpc_train.runtime.context import init
from hpc_train.runtime.step.numerics import DivergenceError

folder, backend, spec = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
ctx = init(backend)
torch.manual_seed(0)
x = torch.randn(96, 8)
data = TensorDataset(x, x.sum(1, keepdim=True))

def train(nan_steps, skip, every=0):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    loader = ctx.loader(data, batch_size=4)
    ckpt = ctx.checkpointer(folder / "ckpt", every=every) if every else None
    for step, (xb, yb) in enumerate(ctx.batches(loader, 0, spec["steps"])):
        if step in skip:
            continue
        if ctx.rank == spec["nan_rank"] and step in nan_steps:
            xb = xb * float("nan")
        ctx.backward(torch.nn.functional.mse_loss(model(xb), yb))
        ctx.step()
        if ckpt:
            ckpt.step(step + 1)
    if ckpt:
        ckpt.close()
    return [p.detach().reshape(-1).tolist() for p in ctx.unwrap(model).parameters()]

out = folder / f"rank{ctx.rank}.json"
try:
    params = train(spec["nan"], [], spec.get("every", 0))
except DivergenceError as exc:
    out.write_text(json.dumps({"error": str(exc)}))
    raise
events = list(ctx.numerics.events)
reference = train([], spec["skip"])  # metered too: the same gradient averaging path, later step numbers
out.write_text(json.dumps({"params": params, "reference": reference, "events": events}))
ctx.shutdown()
"""

TORCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def run(
    tmp_path: Path, spec: dict, backend: str = "torchrun", env: dict | None = None, launcher: str | None = None
) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    environ = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        contract.ENV_METRICS_DIR: str(tmp_path / "metrics"),
        contract.ENV_STOP_FILE: str(tmp_path / "no-stop-file"),
        contract.ENV_NO_RETRY_FILE: str(tmp_path / contract.NO_RETRY),
        **(env or {}),
    }
    for name in (*TORCH_ENV, contract.ENV_JOB_FOLDER, contract.ENV_METRICS, contract.ENV_LAUNCHER):
        environ.pop(name, None)  # a unit test's runtime.init() left a world of one in this process
    args = [str(script), str(tmp_path), backend, json.dumps(spec)]
    if (launcher or backend) == "torchrun":
        return run_world(args, environ, REPO, nproc=2, timeout=240, out_dir=tmp_path / "out")
    command = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, *args]
    return subprocess.run(command, cwd=REPO, env=environ, capture_output=True, text=True, timeout=240)


def results(tmp_path: Path) -> list[dict]:
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def tensors(params: list[list[float]]) -> list[torch.Tensor]:
    return [torch.tensor(p, dtype=torch.float64) for p in params]


def lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics" / contract.STEPS).read_text().splitlines()]


STEPS = 16
FRAMEWORKS = pytest.mark.frameworks  # mpirun, Horovod, DeepSpeed: not in make test-unit


# DeepSpeed: its ZeRO optimizer skips a non-finite step itself (counted, not skipped twice); without ZeRO
# the engine steps a plain torch optimizer, and hpc_train's check drops the gradients before it
BACKENDS = {
    "torchrun": {},
    "mpi": {},
    "horovod": {},
    "deepspeed": {},
    "deepspeed-zero0": {contract.ENV_BACKEND_OPTIONS: json.dumps({"zero_stage": 0})},
}


@pytest.mark.parametrize("backend", [b if b == "torchrun" else pytest.param(b, marks=FRAMEWORKS) for b in sorted(BACKENDS)])
def test_a_nan_on_one_rank_skips_that_step_on_every_rank_as_if_the_batch_were_not_there(tmp_path, backend, extensions):
    env = {**BACKENDS[backend], "TORCH_EXTENSIONS_DIR": str(extensions)}
    launcher = "torchrun" if backend.startswith("deepspeed") else backend
    out = run(tmp_path, {"steps": STEPS, "nan_rank": 1, "nan": [5], "skip": [5]}, backend.split("-")[0], env, launcher)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    ranks = results(tmp_path)
    finals = [tensors(r["params"]) for r in ranks]
    assert all(torch.isfinite(t).all() for t in finals[0])
    assert all(torch.equal(a, b) for a, b in zip(*finals))  # every rank skipped: the replicas are the same
    # the same as a run whose data skips batch 5 outright: the skipped step changed nothing, momentum included
    assert all(torch.equal(a, b) for a, b in zip(finals[0], tensors(ranks[0]["reference"])))
    events = [[{k: v for k, v in e.items() if k != "time"} for e in r["events"]] for r in ranks]
    assert events[0] == events[1]  # every rank agreed on what happened, and on who saw it
    assert [(e["step"], e["ranks"], e["reason"], e["action"]) for e in events[0]] == [(6, [1], "loss", "skipped")]
    assert out.stderr.count("hpc_train numerics: step 6 skipped on every rank: non-finite loss on rank 1") == 1
    written = lines(tmp_path)
    rows = {r["step"]: r for r in written if "event" not in r}
    assert rows[6]["nonfinite"] == 1 and rows[6].get("grad_norm") is None
    assert all(rows[s]["grad_norm"] > 0 and "nonfinite" not in rows[s] for s in range(1, 2 * STEPS) if s != 6)
    assert [e["step"] for e in written if e.get("event") == "bad_step"] == [6]
    summary = report.summarize(report.load(tmp_path / "metrics"))
    assert [e["step"] for e in summary["skipped_steps"]] == [6] and summary["grad_norm"]["max"] > 0
    text = report.format_summary(summary)
    assert "bad steps       1 skipped for a non-finite loss or gradient (steps 6)" in text
    assert "step 6 (run 1): loss not finite on rank 1; skipped" in text and "grad norm" in text


def test_bad_steps_in_a_row_stop_the_run_with_a_message_and_the_no_retry_file(tmp_path):
    out = run(
        tmp_path, {"steps": STEPS, "nan_rank": 0, "nan": list(range(4, STEPS)), "skip": []}, env={contract.ENV_MAX_BAD_STEPS: "2"}
    )
    assert out.returncode != 0
    message = "training diverged: 2 optimizer step(s) in a row had a non-finite loss or gradient (steps 5-6)"
    assert all(message in r["error"] for r in results(tmp_path)), out.stderr[-3000:]  # every rank stops, none hangs
    assert "DivergenceError: " + message in out.stderr and "--on-divergence rollback" in out.stderr
    assert message in (tmp_path / contract.NO_RETRY).read_text()  # the batch script will not requeue it
    bad = [e for e in lines(tmp_path) if e.get("event") == "bad_step"]
    assert [(e["step"], e["consecutive"], e["action"]) for e in bad] == [(5, 1, "skipped"), (6, 2, "stop")]
    assert lines(tmp_path)[-1]["event"] == "run_end"  # the metrics were closed as the rank ended


def test_rollback_restores_the_last_checkpoint_and_goes_on_past_the_bad_batches(tmp_path):
    # checkpoints after batches 4 and 8; batches 9 and 10 are bad on rank 0: back to 8, on from batch 11
    spec = {"steps": STEPS, "nan_rank": 0, "nan": [9, 10], "skip": [8, 9, 10], "every": 4}
    env = {contract.ENV_MAX_BAD_STEPS: "2", contract.ENV_ON_DIVERGENCE: "rollback"}
    out = run(tmp_path, spec, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = results(tmp_path)
    finals = [tensors(r["params"]) for r in ranks]
    assert all(torch.equal(a, b) for a, b in zip(*finals))
    # batch 8's update was undone with the rollback, 9 and 10 skipped: as a run that never read 8-10
    assert all(torch.equal(a, b) for a, b in zip(finals[0], tensors(ranks[0]["reference"])))
    assert [(e["event"], e["step"], e.get("restored")) for e in ranks[0]["events"]] == [
        ("bad_step", 10, None),
        ("bad_step", 11, None),
        ("rollback", 11, 8),
    ]
    assert "rolled back to the checkpoint of step 8 after 2 bad steps in a row" in out.stderr
    summary = report.format_summary(report.summarize(report.load(tmp_path / "metrics")))
    assert "rollback        at step 11 to the checkpoint of step 8 (run 1)" in summary


# -- in one process ------------------------------------------------------------------------------------
def make_ctx(**options) -> Context:
    env = detect({})
    runtime = BackendRuntime(env, RuntimeOptions(**options))
    runtime.init()
    return Context(env, "torchrun", runtime, metrics=False)


def model_and_optimizer(ctx: Context, inputs: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Linear(inputs, 1)
    return ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_finite_loss_trains_bit_for_bit_as_without_the_check():
    ctx = make_ctx()
    model, _ = model_and_optimizer(ctx)
    torch.manual_seed(0)
    plain = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(8, 4)
        ctx.backward(model(x).pow(2).mean())
        assert ctx.step()
        plain(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters()))
    assert ctx.numerics.events == [] and ctx.numerics.bad_steps == 0


def test_a_non_finite_gradient_with_a_finite_loss_is_skipped_too():
    ctx = make_ctx(grad_clip=1.0)  # the norm clipping computes is the one checked
    model, _ = model_and_optimizer(ctx)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(8, 4)
    ctx.backward(model(x).mean())
    for p in model.parameters():
        p.grad[0] = math.inf  # as an overflow in backward would leave it
    assert ctx.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert [(e["reason"], e["ranks"]) for e in ctx.numerics.events] == [("gradient", [])]
    assert all(p.grad is None for p in model.parameters())  # dropped, not carried into the next step


# a few elements: the fused pass; past FUSED_PROBE_ELEMENTS: the sum of sums
PROBES = pytest.mark.parametrize("inputs", [4, FUSED_PROBE_ELEMENTS + 1], ids=["fused-pass", "sum-of-sums"])


@PROBES
@pytest.mark.parametrize(
    "weight, bias",
    [(math.inf, 0.0), (math.inf, -math.inf), (0.0, math.nan), (3e38, 3e38)],
    ids=["inf", "inf-and-minus-inf-sum-to-nan", "nan", "finite-values-past-fp32-range-together"],
)
def test_without_clipping_or_metrics_the_cheaper_probe_finds_every_non_finite_gradient(inputs, weight, bias):
    ctx = make_ctx()  # no --grad-clip, metrics off: the check reads the probe, not the norm
    model, _ = model_and_optimizer(ctx, inputs)
    ctx.backward(model(torch.randn(8, inputs)).mean())
    model.weight.grad[0, 0], model.bias.grad[0] = weight, bias
    finite = all(math.isfinite(v) for v in (weight, bias))  # 3e38 twice: summed as doubles, no false alarm
    assert ctx.step()
    assert [e["reason"] for e in ctx.numerics.events] == ([] if finite else ["gradient"])


@PROBES
def test_after_a_bad_gradient_the_probe_sees_the_next_good_step_as_good(inputs):
    ctx = make_ctx()
    model, _ = model_and_optimizer(ctx, inputs)
    ctx.backward(model(torch.randn(8, inputs)).mean())
    model.bias.grad[0] = math.nan
    assert ctx.step()
    ctx.backward(model(torch.randn(8, inputs)).mean())
    kept = [p.grad.clone() for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    assert ctx.step()
    assert [e["step"] for e in ctx.numerics.events] == [1]  # the flag of step 1 is not step 2's
    # the probe left the gradients as they were (x * 1): the update is exactly lr times them
    assert all(torch.equal(p, b.add(g, alpha=-0.1)) for p, b, g in zip(model.parameters(), before, kept))


@pytest.mark.parametrize("bad", [False, True], ids=["finite", "nan"])
def test_a_loss_of_several_elements_is_seeded_and_judged_as_on_a_device(bad):
    guard = NumericsGuard()
    loss = torch.tensor([1.0, math.nan if bad else 2.0], requires_grad=True)
    seeded = guard.on_backward(loss)
    assert seeded is not loss and seeded.grad_fn is not None  # multiplied by its seed, in the graph
    assert torch.equal(seeded.detach(), loss.detach()) or bad  # a finite loss keeps every bit
    assert guard._loss_bad() is bad


def test_what_is_not_a_tensor_passes_through_the_guard_unchanged():
    guard, loss = NumericsGuard(), 0.5
    assert guard.on_backward(loss) is loss and guard._seeds == []


def test_the_probe_reads_its_flag_from_the_tensor_where_torch_has_no_numpy():
    class NoNumpy:
        def numpy(self):
            raise RuntimeError("Numpy is not available")

    flag = NoNumpy()
    assert _flag_view(flag) is flag
    found = torch.zeros(1)
    view = _flag_view(found)
    found.fill_(1.0)
    assert view[0] == 1.0  # a view of the flag's memory, not a copy


def test_fp16_scaler_overflows_stay_the_scalers_own_and_are_counted_apart():
    ctx = make_ctx(precision="fp16", max_bad_steps=1)
    model, _ = model_and_optimizer(ctx)
    ctx.runtime.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # overflows until it has come down
    for _ in range(3):
        ctx.backward(model(torch.randn(8, 4)).float().pow(2).mean() * 1e4)
        assert ctx.step()  # never DivergenceError: a scale search is not divergence
    assert ctx.numerics.scale_skips >= 1 and ctx.numerics.bad_steps == 0
    assert ctx.runtime.scaler.get_scale() < 2.0**127


def test_max_bad_steps_zero_never_stops_and_a_good_step_ends_the_streak():
    ctx = make_ctx(max_bad_steps=0)
    model, _ = model_and_optimizer(ctx)
    for i in range(6):
        x = torch.randn(8, 4) * (math.nan if i != 3 else 1.0)
        ctx.backward(model(x).pow(2).mean())
        ctx.step()
    assert [e["consecutive"] for e in ctx.numerics.events] == [1, 2, 3, 1, 2]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_rollback_without_a_checkpointer_stops_with_the_reason():
    ctx = make_ctx(max_bad_steps=1, on_divergence="rollback")
    model, _ = model_and_optimizer(ctx)
    ctx.backward(model(torch.full((2, 4), math.nan)).sum())
    with pytest.raises(DivergenceError, match=r"needs the job's checkpoints \(ctx.checkpointer\(\)\)"):
        ctx.step()


def test_the_guard_reads_its_settings_from_the_runtime_options():
    guard = NumericsGuard.for_runtime(BackendRuntime(detect({}), RuntimeOptions(max_bad_steps=7, on_divergence="rollback")))
    assert (guard.max_bad_steps, guard.on_divergence) == (7, "rollback")
    with pytest.raises(ValueError, match="on_divergence must be one of"):
        RuntimeOptions(on_divergence="retry")
    assert RuntimeOptions.from_env({contract.ENV_MAX_BAD_STEPS: "3", contract.ENV_ON_DIVERGENCE: "rollback"}).max_bad_steps == 3


@pytest.mark.parametrize(
    "flag, message",
    [
        (["--max-bad-steps", "-1"], "max_bad_steps"),
        (["--on-divergence", "retry"], "on_divergence"),
    ],
)
def test_bad_option_values_are_refused_before_submission_naming_the_option(tmp_path, flag, message):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", "render", "--site", "local", *flag, str(script)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert message.replace("_", "-") in out.stderr or message in out.stderr, out.stderr


@pytest.mark.parametrize("action", ["rollback", "stop"])
def test_on_divergence_with_max_bad_steps_zero_is_refused_naming_both_and_what_would_do(tmp_path, capsys, action):
    from hpc_train.cli import main

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert main(["render", "--site", "local", "--on-divergence", action, "--max-bad-steps", "0", str(script)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"--on-divergence: '{action}' never acts with --max-bad-steps 0" in err, err
    assert f"give --max-bad-steps N (N >= 1: {action} after N bad steps in a row" in err and "drop --on-divergence" in err
    # each alone is meaningful: 0 skips bad steps for ever, and rollback acts after the default 5
    assert main(["render", "--site", "local", "--max-bad-steps", "0", str(script)]) == 0
    assert main(["render", "--site", "local", "--on-divergence", action, "--max-bad-steps", "1", str(script)]) == 0
