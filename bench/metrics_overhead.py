"""Per-step cost of hpc_train's metrics: the same training loop with metrics on and off, same run.

Two processes (torchrun, gloo) train a small classifier through ``hpc_train.runtime``, as two
replicas stepped in turns of 5 steps: one with metrics on (DDP comm-hook timing, loss, samples, and
rank 0 writing JSON lines, TensorBoard events and the Prometheus file to a temporary folder, flushed
every 2 s as in a job), one with metrics off (DDP's built-in all-reduce, nothing recorded). Medians
of per-step times; the ratio is on / off. Target <= 1.01.

    .venv/bin/python bench/metrics_overhead.py [--model cnn|mlp --steps 100 --blocks 4 --width N --batch 32]

The default model is a small CIFAR-10 CNN. ``--model mlp`` is the worst case for the DDP hook: on
CPU a Python communication hook divides the gradient bucket in a pass of its own, where DDP's
built-in all-reduce divides while copying gradients into the bucket.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.01


def make_model(kind: str, width: int):
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    if kind == "cnn":
        # a small CIFAR-10 classifier: three conv blocks and a linear head (0.3 M parameters at width 64)
        return nn.Sequential(nn.Conv2d(3, width // 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(width // 2, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(2 * width, 10))
    # an MNIST-sized MLP, 784 -> width -> width -> 10: little compute per parameter, the worst case
    return nn.Sequential(nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def example_input(kind: str, batch: int):
    import torch

    return torch.randn(batch, 3, 32, 32) if kind == "cnn" else torch.randn(batch, 784)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import hpc_train.runtime as rt
    from hpc_train.runtime.metrics import MetricsRecorder

    ctx = rt.init(backend="torchrun", metrics=False)
    torch.manual_seed(ctx.rank)
    batches = [(example_input(args.model, args.batch), torch.randint(0, 10, (args.batch,))) for _ in range(args.steps)]
    loss_fn = torch.nn.CrossEntropyLoss()
    folder = tempfile.mkdtemp(prefix="hpc_train-metrics-bench-")
    recorder = MetricsRecorder(Path(folder), rank=ctx.rank, world_size=ctx.world_size)
    # the writes happen in flush(), every 2 s, on one step in many: a median would hide them, so
    # their total is measured and spread over the steps
    flush, flush_s, flush_cpu = recorder.flush, [0.0], [0.0]

    def timed_flush():
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return flush()
        finally:
            flush_s[0] += time.perf_counter() - start
            flush_cpu[0] += time.process_time() - cpu

    recorder.flush = timed_flush

    def prepared(metrics_on: bool):
        ctx.metrics = ctx.runtime.metrics = recorder if metrics_on else None
        model = make_model(args.model, args.width)
        return ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))

    # Two replicas, one wrapped with metrics (comm-hook timing) and one without, stepped in turns of a
    # few steps: load from other processes on the machine then falls on both alike.
    models = {True: prepared(True), False: prepared(False)}

    def run(metrics_on: bool, xb: torch.Tensor, yb: torch.Tensor) -> tuple[float, float]:
        ctx.metrics = ctx.runtime.metrics = recorder if metrics_on else None
        model, opt = models[metrics_on]
        ctx.runtime.model, ctx.runtime.optimizer = model, opt  # ctx.step() steps this replica
        start, cpu = time.perf_counter(), time.process_time()
        ctx.backward(loss_fn(model(xb), yb))
        ctx.step()
        return time.perf_counter() - start, time.process_time() - cpu

    for xb, yb in batches[:20]:  # warm-up: allocator, gloo buffers, autograd graph caches, writers opened
        run(True, xb, yb), run(False, xb, yb)
    recorder.flush()
    flush_s[0] = flush_cpu[0] = 0.0  # opening the writers (imports, files) is paid once per run, not per step
    off, on = [], []
    turn = 5
    for b in range(args.blocks):
        for i in range(0, len(batches), turn):
            for metrics_on in ((False, True) if (i // turn + b) % 2 == 0 else (True, False)):
                for xb, yb in batches[i:i + turn]:
                    (on if metrics_on else off).append(run(metrics_on, xb, yb))
    recorder.close()
    # wall time is what a job feels; CPU time (all threads of the process) is what metrics add, and is
    # not inflated when other work on the machine takes the cores
    stats = torch.tensor([statistics.median(t for t, _ in off), statistics.median(t for t, _ in on), flush_s[0] / len(on),
                          statistics.median(c for _, c in off), statistics.median(c for _, c in on), flush_cpu[0] / len(on)],
                         dtype=torch.float64)
    dist.all_reduce(stats)  # the slower rank sets the pace in data parallel; report the mean of both
    stats /= ctx.world_size
    if ctx.is_main:
        with open(os.path.join(folder, "steps.jsonl")) as f:
            lines = sum(1 for _ in f)
        m_off, m_on, writes, c_off, c_on, c_writes = stats.tolist()
        params = sum(p.numel() for p in make_model(args.model, args.width).parameters())
        print(f"{args.model} width {args.width} ({params / 1e6:.2f} M parameters), batch {args.batch}, "
              f"{ctx.world_size} processes, {args.blocks} x {args.steps} steps each way, in turns of {turn}")
        print(f"{'median per step':<34} {'wall ms':>10} {'CPU ms':>10}")
        print(f"{'metrics off':<34} {m_off * 1e3:>10.3f} {c_off * 1e3:>10.3f}")
        print(f"{'metrics on, step path':<34} {m_on * 1e3:>10.3f} {c_on * 1e3:>10.3f}")
        print(f"{'  + writes (flush), per step':<34} {writes * 1e3:>10.3f} {c_writes * 1e3:>10.3f}")
        for name, ratio in (("wall", (m_on + writes) / m_off), ("CPU", (c_on + c_writes) / c_off)):
            print(f"ratio on/off, {name:>4} time: {ratio:.3f} (target <= {TARGET}) -> {'met' if ratio <= TARGET else 'NOT met'}")
        print(f"[{lines} JSON lines written to {folder}]")
    ctx.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, help="channels (cnn, default 64) or hidden units (mlp, default 1024)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.width = args.width or (64 if args.model == "cnn" else 1024)
    if args.worker:
        worker(args)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__, "--worker",
           f"--model={args.model}", f"--steps={args.steps}", f"--blocks={args.blocks}", f"--width={args.width}",
           f"--batch={args.batch}"]
    raise SystemExit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
