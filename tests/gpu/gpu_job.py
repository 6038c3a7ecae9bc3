"""The training script every GPU test submits to the `local` site: a small model trained through
``hpc_train.runtime``, in the mode the test names (``gpu_job.py MODE [options]``).

What the rank saw is written to ``<job folder>/<mode>.json`` for the test to read. The device is the
runtime's choice (``cuda:0`` on a GPU node, else the CPU), so every mode also runs on a CPU-only machine:
that tries the plumbing there; the tests assert what only a GPU shows.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

import hpc_train.runtime as rt

OUT = Path(os.environ.get("HPC_TRAIN_JOB_FOLDER", "."))
# the heartbeat answers a request within its poll (hpc_train.runtime.lifecycle.heartbeat.POLL_S, 2 s): ample margin
ANSWER_WAIT_S = 30.0


class Probe(torch.nn.Module):
    """An identity layer that records the autocast state the prepared model's forward runs under."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        self.seen = {
            "autocast": torch.is_autocast_enabled(kind),
            "autocast_dtype": str(torch.get_autocast_dtype(kind)),
            "activation_dtype": str(x.dtype),  # the output of the Linear before it
        }
        return x


def regression(width: int, depth: int, samples: int, inputs: int = 32) -> tuple[torch.nn.Module, Probe, TensorDataset]:
    """The same model and data for every run of the same arguments (seeded)."""
    torch.manual_seed(0)
    x = torch.randn(samples, inputs)
    # targets of unit variance: fp16's first loss scale (65536) then leaves its gradients in range
    y = x @ torch.randn(inputs, 1) / inputs**0.5
    probe = Probe()
    layers: list[torch.nn.Module] = [torch.nn.Linear(inputs, width), probe, torch.nn.Tanh()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    return model, probe, TensorDataset(x, y)


def to_cpu(obj: Any) -> Any:
    """A detached CPU copy of every tensor in a (nested) state dict."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def checksum(model: torch.nn.Module) -> float:
    return sum(p.detach().double().sum().item() for p in model.parameters())


def write(name: str, report: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / f".{name}.json.tmp"
    tmp.write_text(json.dumps(report))
    os.replace(tmp, OUT / f"{name}.json")  # whole when it appears: a test may be polling for it


def train(args: argparse.Namespace) -> None:
    """Plain steps (--precision, --profile and the metrics come from the job); with --overflow, one more
    step whose loss is blown up so that fp16's gradients overflow."""
    ctx = rt.init()
    model, probe, data = regression(args.width, args.depth, max(2048, 2 * args.batch))
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=args.lr))
    loader = ctx.loader(data, batch_size=args.batch)
    scaler = ctx.runtime.scaler  # torch.amp.GradScaler under fp16 (hpc_train/runtime/engine/backend.py, prepare)
    losses = []
    for xb, yb in ctx.batches(loader, 0, args.steps):
        xb, yb = xb.to(ctx.device), yb.to(ctx.device)
        loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
        ctx.backward(loss)
        ctx.step()
        losses.append(loss.item())
    report: dict[str, Any] = {
        "device": str(ctx.device),
        "losses": losses,
        "forward": probe.seen,
        "scaler": None if scaler is None else f"{type(scaler).__module__}.{type(scaler).__qualname__}",
        "scaler_enabled": None if scaler is None else scaler.is_enabled(),
        "scale": None if scaler is None else scaler.get_scale(),
    }
    if args.overflow:
        xb, yb = (t.to(ctx.device) for t in next(iter(loader)))
        before, scale = checksum(model), None if scaler is None else scaler.get_scale()
        # finite in fp32; its gradient is cast back to fp16 at the model's output, where it is inf
        ctx.backward(torch.nn.functional.mse_loss(model(xb).float(), yb) * 1e6)
        stepped = ctx.step()
        report["overflow"] = {
            "stepped": stepped,
            "scale_before": scale,
            "scale_after": None if scaler is None else scaler.get_scale(),
            "parameters_unchanged": checksum(model) == before,
            "scale_skips": ctx.numerics.scale_skips,
            "bad_steps": ctx.numerics.bad_steps,
        }
    write("train", report)
    ctx.shutdown()


def memory(args: argparse.Namespace) -> None:
    """--micro-batch auto under a per-process CUDA memory limit: the whole batch does not fit, a part does."""
    ctx = rt.init()
    cuda = ctx.device.type == "cuda"
    if cuda:  # before anything is allocated on the device
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.budget_mb * 2**20 / total, ctx.device)
    torch.manual_seed(0)
    x = torch.randn(2 * args.batch, 64)
    y = x[:, :1].clone()
    # ~192 KiB of activations and their gradients per sample: a batch of 8192 needs 1.5 GiB, 4096 about 0.8
    model = torch.nn.Sequential(torch.nn.Linear(64, 16384), torch.nn.ReLU(), torch.nn.Linear(16384, 1))
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3))
    loader = ctx.loader(TensorDataset(x, y), batch_size=args.batch)
    steps = seen = 0
    for xb, yb in ctx.batches(loader, 0, args.steps):
        xb, yb = xb.to(ctx.device), yb.to(ctx.device)
        seen += len(xb)
        ctx.backward(torch.nn.functional.mse_loss(model(xb), yb))
        steps += ctx.step()
    stats = torch.cuda.memory_stats(ctx.device) if cuda else {}
    write(
        "memory",
        {
            "device": str(ctx.device),
            "steps": steps,
            "seen": seen,
            "batch": args.batch,
            "micro_batch": None if ctx.memory is None else ctx.memory.micro,
            "num_ooms": stats.get("num_ooms", 0),  # the CUDA caching allocator's count of OutOfMemoryErrors raised
            "peak_bytes": torch.cuda.max_memory_allocated(ctx.device) if cuda else None,
            "finite": all(torch.isfinite(p).all().item() for p in model.parameters()),
        },
    )
    ctx.shutdown()


def _collectives(ctx: Any) -> dict[str, Any]:
    """All-reduces on the process group the runtime started (NCCL on a GPU), with what they must give."""
    import torch.distributed as dist

    world = dist.get_world_size()
    value = torch.arange(1.0, 5.0, device=ctx.device) * (ctx.rank + 1)
    expected = sum(torch.arange(1.0, 5.0) * (r + 1) for r in range(world))
    summed = value.clone()
    dist.all_reduce(summed)
    in_dp = value.clone()
    dist.all_reduce(in_dp, group=ctx.parallel.dp_group)  # the mesh's group (hpc_train.runtime.engine.parallel)
    big = torch.full((1 << 20,), 0.5, device=ctx.device)
    dist.all_reduce(big)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return {
        "backend": dist.get_backend(),
        "world": world,
        "summed": summed.cpu().tolist(),
        "in_dp": in_dp.cpu().tolist(),
        "expected": expected.tolist(),
        "big": torch.unique(big).cpu().tolist(),
        "big_expected": 0.5 * world,
        "tensor_device": str(summed.device),
    }


def nccl(args: argparse.Namespace) -> None:
    """The process group of a --parallel dp=1,tp=1,pp=1 job; then the stacks and flight record the
    heartbeat thread writes when asked, as the hang watchdog asks (hpc_train.runtime.supervise.watchdog.collect_dumps)."""
    from hpc_train.runtime.lifecycle.heartbeat import REQUEST, dump_folder

    ctx = rt.init()
    report = {"device": str(ctx.device), **_collectives(ctx), "heartbeat": ctx.heartbeat is not None}
    dumps = dump_folder(OUT, int(os.environ.get("HPC_TRAIN_RUN") or 1))
    dumps.mkdir(parents=True, exist_ok=True)
    (dumps / REQUEST).write_text("1\n")
    deadline = time.time() + ANSWER_WAIT_S
    while time.time() < deadline and not (dumps / f"rank-{ctx.rank}.txt").exists():
        time.sleep(0.1)  # the main thread waits, as one inside a collective would; the heartbeat thread answers
    report["answered"] = (dumps / f"rank-{ctx.rank}.txt").exists()
    write("nccl", report)
    ctx.shutdown()


def hang(args: argparse.Namespace) -> None:
    """Steps with an all-reduce each (so the flight recorder has entries), then blocked for good: waiting
    for a kernel that spins on the GPU (on the CPU: asleep). The test's watchdog is to find and end it."""
    import torch.distributed as dist

    ctx = rt.init()
    model, _, data = regression(64, 0, 2048)
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = ctx.loader(data, batch_size=64)
    steps = 0
    for xb, yb in ctx.batches(loader, 0, args.steps):
        loss = torch.nn.functional.mse_loss(model(xb.to(ctx.device)), yb.to(ctx.device))
        ctx.backward(loss)
        steps += ctx.step()
        dist.all_reduce(loss.detach())
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    write("hang", {"device": str(ctx.device), "pid": os.getpid(), "steps": steps, "backend": dist.get_backend()})
    if ctx.device.type == "cuda":
        torch.cuda._sleep(args.spin_s * 2_000_000_000)  # ~2e9 GPU clock cycles a second (H100/H200 boost clocks)
        torch.cuda.synchronize()  # lets go of the GIL: the heartbeat thread can answer the watchdog
    else:
        time.sleep(args.spin_s)
    write("hang", {"error": "the watchdog did not end this rank"})


def checkpoint(args: argparse.Namespace) -> None:
    """Adam on the device with the job's --checkpoint-every / --async-checkpoint, a reference copy of the
    state at every save; or (--restore-from) only a restore of another job's checkpoints, dumped as loaded."""
    ctx = rt.init()
    model, _, data = regression(256, 1, 2048)
    model, optimizer = ctx.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    loader = ctx.loader(data, batch_size=64)
    ckpt = ctx.checkpointer(folder=args.restore_from)
    step = ckpt.restore()

    def state() -> dict[str, Any]:
        return {"model": ctx.unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}

    if args.restore_from:
        torch.save(to_cpu(state()), OUT / "restored.pt")
        moments = [t for s in optimizer.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
        devices = {
            "parameters": sorted({str(p.device) for p in model.parameters()}),
            "moments": sorted({str(t.device) for t in moments}),  # Adam's "step" stays a CPU tensor (not capturable)
        }
        write("checkpoint", {"device": str(ctx.device), "restored_step": step, "devices": devices})
        ckpt.close()
        ctx.shutdown()
        return
    for xb, yb in ctx.batches(loader, step, args.steps):
        ctx.backward(torch.nn.functional.mse_loss(model(xb.to(ctx.device)), yb.to(ctx.device)))
        ctx.step()
        step += 1
        if ckpt.every and step % ckpt.every == 0:  # taken before the save starts: what it must write
            torch.save(to_cpu(state()), OUT / f"reference-{step}.pt")
        ckpt.step(step)  # an async save returns once it has copied; the next steps change the live tensors
    ckpt.close()
    write("checkpoint", {"device": str(ctx.device), "async": ckpt.async_save, "last_saved": ckpt.last_saved, "steps": step})
    ctx.shutdown()


MODES = {"train": train, "memory": memory, "nccl": nccl, "hang": hang, "checkpoint": checkpoint}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=0, help="hidden width x width layers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--overflow", action="store_true", help="train: one more step whose fp16 gradients overflow")
    parser.add_argument("--budget-mb", type=int, default=1024, help="memory: the process's CUDA memory limit")
    parser.add_argument("--spin-s", type=int, default=60, help="hang: how long the rank stays blocked")
    parser.add_argument("--restore-from", default=None, help="checkpoint: another job's checkpoints folder")
    # launchers may add their own arguments (--local_rank); they are not ours
    args, _ = parser.parse_known_args()
    MODES[args.mode](args)


if __name__ == "__main__":
    main()
