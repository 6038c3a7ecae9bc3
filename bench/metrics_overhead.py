"""Per-step cost of hpc_train's metrics: the same training loop with metrics on and off, same run.

Two processes (torchrun, gloo) train a small classifier through ``hpc_train.runtime``, as three
replicas stepped in turns of 5 steps: one with metrics on (DDP comm-hook timing, loss, samples, and
rank 0 writing JSON lines, TensorBoard events and the Prometheus file to a temporary folder, flushed
every 2 s as in a job), one with metrics and straggler detection on (the same, plus a gather of
every rank's compute time every ``--straggler-window`` steps), one with metrics off (DDP's built-in
all-reduce, nothing recorded). Medians of per-step times, plus the flushes' and gathers' totals
spread over the steps; the ratios are each of the first two / off. Target <= 1.01.

    .venv/bin/python bench/metrics_overhead.py [--model cnn|mlp --steps 100 --blocks 4 --width N --batch 32
                                                --straggler-window 50]

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
STRAGGLER_WINDOW, STRAGGLER_THRESHOLD = "HPC_TRAIN_STRAGGLER_WINDOW", "HPC_TRAIN_STRAGGLER_THRESHOLD"  # hpc_train.contract


def make_model(kind: str, width: int):
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    if kind == "cnn":
        # a small CIFAR-10 classifier: three conv blocks and a linear head (0.3 M parameters at width 64)
        return nn.Sequential(
            nn.Conv2d(3, width // 2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width // 2, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, 10),
        )
    # an MNIST-sized MLP, 784 -> width -> width -> 10: little compute per parameter, the worst case
    return nn.Sequential(nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def example_input(kind: str, batch: int):
    import torch

    return torch.randn(batch, 3, 32, 32) if kind == "cnn" else torch.randn(batch, 784)


def timed(obj, name: str, totals: list[float]) -> None:
    """Add the wall and CPU time of every ``obj.name()`` call to ``totals``: work done on one step in many
    (a flush every 2 s, a gather every window) that a median of step times would hide."""
    method = getattr(obj, name)

    def wrapper(*a, **kw):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return method(*a, **kw)
        finally:
            totals[0] += time.perf_counter() - start
            totals[1] += time.process_time() - cpu

    setattr(obj, name, wrapper)


CONFIGS = ("off", "on", "straggler")  # no metrics; metrics without straggler detection; metrics with it


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import hpc_train.runtime as rt
    from hpc_train.runtime.observe.metrics import MetricsRecorder

    ctx = rt.init(backend="torchrun", metrics=False)
    torch.manual_seed(ctx.rank)
    batches = [(example_input(args.model, args.batch), torch.randint(0, 10, (args.batch,))) for _ in range(args.steps)]
    loss_fn = torch.nn.CrossEntropyLoss()
    folder = tempfile.mkdtemp(prefix="hpc_train-metrics-bench-")
    recorders = {
        "on": MetricsRecorder(Path(folder, "on"), rank=ctx.rank, world_size=ctx.world_size),
        "straggler": MetricsRecorder(Path(folder, "straggler"), rank=ctx.rank, world_size=ctx.world_size),
    }
    recorders["straggler"].attach(ctx.runtime)  # as in a job: the monitor gathers through the runtime
    monitor = recorders["straggler"].straggler
    assert monitor is not None and recorders["on"].straggler is None
    flushes = {name: [0.0, 0.0] for name in recorders}
    gathers = [0.0, 0.0]
    for name, recorder in recorders.items():
        timed(recorder, "flush", flushes[name])
    timed(monitor, "close_window", gathers)

    def prepared(config: str):
        ctx.metrics = ctx.runtime.metrics = recorders.get(config)
        model = make_model(args.model, args.width)
        return ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))

    # Three replicas, stepped in turns of a few steps each (the order rotating): load from other
    # processes on the machine then falls on all alike. Each with metrics has its own recorder (the DDP
    # comm hook is bound to it); both ranks step each replica equally often, so the gathers match.
    models = {config: prepared(config) for config in CONFIGS}

    def run(config: str, xb: torch.Tensor, yb: torch.Tensor) -> tuple[float, float]:
        ctx.metrics = ctx.runtime.metrics = recorders.get(config)
        model, opt = models[config]
        ctx.runtime.model, ctx.runtime.optimizer = model, opt  # ctx.step() steps this replica
        start, cpu = time.perf_counter(), time.process_time()
        ctx.backward(loss_fn(model(xb), yb))
        ctx.step()
        return time.perf_counter() - start, time.process_time() - cpu

    for xb, yb in batches[:20]:  # warm-up: allocator, gloo buffers, autograd graph caches, writers opened
        for config in CONFIGS:
            run(config, xb, yb)
    for recorder in recorders.values():
        recorder.flush()
    for totals in (*flushes.values(), gathers):
        totals[:] = [0.0, 0.0]  # opening the writers (imports, files) is paid once per run, not per step
    times: dict[str, list[tuple[float, float]]] = {config: [] for config in CONFIGS}
    windows_before = monitor._count // monitor.window
    turn = 5
    for b in range(args.blocks):
        for i in range(0, len(batches), turn):
            shift = (i // turn + b) % len(CONFIGS)
            for config in CONFIGS[shift:] + CONFIGS[:shift]:
                for xb, yb in batches[i : i + turn]:
                    times[config].append(run(config, xb, yb))
    windows = monitor._count // monitor.window - windows_before
    for recorder in recorders.values():
        recorder.close()
    steps = len(times["off"])
    # wall time is what a job feels; CPU time (all threads of the process) is what metrics add, and is
    # not inflated when other work on the machine takes the cores
    medians = [statistics.median(t[k] for t in times[config]) for k in (0, 1) for config in CONFIGS]
    extras = [totals[k] / steps for k in (0, 1) for totals in (flushes["on"], flushes["straggler"], gathers)]
    stats = torch.tensor(medians + extras, dtype=torch.float64)
    dist.all_reduce(stats)  # the slower rank sets the pace in data parallel; report the mean of both
    stats /= ctx.world_size
    if ctx.is_main:
        report(args, ctx.world_size, steps, windows, monitor.window, stats.tolist(), folder)
    ctx.shutdown()


def report(args: argparse.Namespace, world: int, steps: int, windows: int, window: int, stats: list[float], folder: str) -> None:
    off, on, strag, c_off, c_on, c_strag, w_on, w_strag, g, cw_on, cw_strag, cg = stats
    with open(os.path.join(folder, "straggler", "steps.jsonl")) as f:
        lines = f.readlines()
    ranks_lines = sum('"event": "ranks"' in line or '"event":"ranks"' in line for line in lines)
    params = sum(p.numel() for p in make_model(args.model, args.width).parameters())
    print(
        f"{args.model} width {args.width} ({params / 1e6:.2f} M parameters), batch {args.batch}, "
        f"{world} processes, {args.blocks} x {args.steps} steps each way, in turns of 5"
    )
    print(f"{'median per step':<40} {'wall ms':>10} {'CPU ms':>10}")
    print(f"{'metrics off':<40} {off * 1e3:>10.3f} {c_off * 1e3:>10.3f}")
    print(f"{'metrics on, step path':<40} {on * 1e3:>10.3f} {c_on * 1e3:>10.3f}")
    print(f"{'  + writes (flush), per step':<40} {w_on * 1e3:>10.3f} {cw_on * 1e3:>10.3f}")
    print(f"{'metrics + stragglers, step path':<40} {strag * 1e3:>10.3f} {c_strag * 1e3:>10.3f}")
    print(f"{'  + writes (flush), per step':<40} {w_strag * 1e3:>10.3f} {cw_strag * 1e3:>10.3f}")
    print(f"{f'  + gathers ({windows} of {window} steps), per step':<40} {g * 1e3:>10.3f} {cg * 1e3:>10.3f}")
    total_on, total_strag = on + w_on, strag + w_strag + g
    cpu_on, cpu_strag = c_on + cw_on, c_strag + cw_strag + cg
    for label, wall, cpu in (
        ("metrics on / off", total_on / off, cpu_on / c_off),
        ("metrics + stragglers / off", total_strag / off, cpu_strag / c_off),
    ):
        for name, ratio in (("wall", wall), ("CPU", cpu)):
            print(f"ratio {label}, {name:>4} time: {ratio:.3f} (target <= {TARGET}) -> {'met' if ratio <= TARGET else 'NOT met'}")
    print(
        f"straggler detection alone (stragglers / on): wall {total_strag / total_on:.3f}, CPU {cpu_strag / cpu_on:.3f}; "
        f"gathers alone: {g / off * 100:.3f}% of a step"
    )
    print(f"[{len(lines)} JSON lines ({ranks_lines} per-rank windows) written to {folder}/straggler]")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, help="channels (cnn, default 64) or hidden units (mlp, default 1024)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--straggler-window", type=int, default=50, help="steps per straggler window (the default's)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.width = args.width or (64 if args.model == "cnn" else 1024)
    if args.worker:
        worker(args)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", STRAGGLER_WINDOW: str(args.straggler_window)}
    env.pop(STRAGGLER_THRESHOLD, None)  # the default threshold: detection on
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        __file__,
        "--worker",
        f"--model={args.model}",
        f"--steps={args.steps}",
        f"--blocks={args.blocks}",
        f"--width={args.width}",
        f"--batch={args.batch}",
    ]
    raise SystemExit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
