"""Per-step cost of --profile outside its active window: the same training loop with profiling off and on
(waiting for its window), in the same processes.

Two processes (torchrun, gloo) train a small CIFAR-10 CNN through ``hpc_train.runtime`` as three replicas
stepped in turns of 5 steps, the order rotating each turn: profiling off (no profiler: what every rank
that is not chosen, and every job without --profile, runs), ``torch`` waiting (the torch.profiler created
and started at the first forward, its window far ahead: every chosen rank's steps before the warm-up) and
``nsys`` waiting (the capture range not yet open). Per-step wall and CPU time: medians, the spread
(25th to 75th percentile), and the ratios on / off. Target <= 1.01.

    .venv/bin/python bench/profiling.py [--steps 100 --blocks 4 --width 64 --batch 32]
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
CONFIGS = ("off", "torch", "nsys")
WAITING = ":wait=1000000000,warmup=1,active=1"  # the window far ahead: every measured step waits


def make_model(width: int):
    import torch

    torch.manual_seed(0)
    nn = torch.nn
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


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import hpc_train.runtime as rt
    from hpc_train.config.profile_spec import parse
    from hpc_train.runtime.profiling import Profiler

    ctx = rt.init(backend="torchrun", metrics=False)
    torch.manual_seed(ctx.rank)
    batches = [(torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))) for _ in range(args.steps)]
    loss_fn = torch.nn.CrossEntropyLoss()
    folder = Path(tempfile.mkdtemp(prefix="hpc_train-profiling-bench-"))
    # what profiler_for gives a chosen rank in a job (CPU: no ranges)
    profilers = {kind: Profiler(parse(kind + WAITING), ctx.rank, folder / kind) for kind in ("torch", "nsys")}

    def prepared(config: str):
        ctx.profiler = profilers.get(config)  # the Context's hooks: watch() in prepare, step() in ctx.step()
        model = make_model(args.width)
        return ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))

    models = {config: prepared(config) for config in CONFIGS}

    def run(config: str, xb: torch.Tensor, yb: torch.Tensor) -> tuple[float, float]:
        ctx.profiler = profilers.get(config)
        model, opt = models[config]
        ctx.runtime.model, ctx.runtime.optimizer = model, opt  # ctx.step() steps this replica
        start, cpu = time.perf_counter(), time.process_time()
        ctx.backward(loss_fn(model(xb), yb))
        ctx.step()
        return time.perf_counter() - start, time.process_time() - cpu

    for xb, yb in batches[:20]:  # warm-up: allocator, gloo buffers, autograd caches; starts both profilers
        for config in CONFIGS:
            run(config, xb, yb)
    assert all(p.started and not p.done for p in profilers.values())
    times: dict[str, list[tuple[float, float]]] = {config: [] for config in CONFIGS}
    turn = 5
    for b in range(args.blocks):
        for i in range(0, len(batches), turn):
            shift = (i // turn + b) % len(CONFIGS)
            for config in CONFIGS[shift:] + CONFIGS[:shift]:
                for xb, yb in batches[i : i + turn]:
                    times[config].append(run(config, xb, yb))
    assert profilers["torch"]._torch.step_num == 0  # never stepped: the window was never near
    # what a waiting step adds, alone: the step-time medians above cannot resolve a fraction of a microsecond
    alone = Profiler(parse("torch" + WAITING), ctx.rank, folder / "alone")
    alone.started, calls = True, 200_000
    start = time.perf_counter()
    for _ in range(calls):
        alone.step()
    per_call = (time.perf_counter() - start) / calls
    # medians and quartiles of wall and CPU time per config, averaged over the ranks (the slower sets the pace)
    stats = []
    for k in (0, 1):
        for config in CONFIGS:
            values = sorted(t[k] for t in times[config])
            q1, _, q3 = statistics.quantiles(values, n=4)
            stats += [statistics.median(values), q1, q3]
    stats.append(per_call)
    tensor = torch.tensor(stats, dtype=torch.float64)
    dist.all_reduce(tensor)
    tensor /= ctx.world_size
    if ctx.is_main:
        report(args, ctx.world_size, len(times["off"]), tensor.tolist())
    ctx.profiler = None
    ctx.shutdown()


def report(args: argparse.Namespace, world: int, steps: int, stats: list[float]) -> None:
    per_call = stats.pop()
    rows = {
        (k, config): stats[(k * len(CONFIGS) + i) * 3 : (k * len(CONFIGS) + i) * 3 + 3]
        for k in (0, 1)
        for i, config in enumerate(CONFIGS)
    }
    params = sum(p.numel() for p in make_model(args.width).parameters())
    print(
        f"cnn width {args.width} ({params / 1e6:.2f} M parameters), batch {args.batch}, {world} processes (gloo), "
        f"{args.blocks} x {args.steps} steps each way, in turns of 5, the order rotating"
    )
    print(f"{'per step':<34} {'wall ms (median, q1-q3)':>26} {'CPU ms (median, q1-q3)':>26}")
    labels = {"off": "profiling off", "torch": "torch, waiting for its window", "nsys": "nsys, waiting for its window"}
    for config in CONFIGS:
        cells = [f"{m * 1e3:.3f} ({a * 1e3:.3f}-{b * 1e3:.3f})" for m, a, b in (rows[(k, config)] for k in (0, 1))]
        print(f"{labels[config]:<34} {cells[0]:>26} {cells[1]:>26}")
    for config in ("torch", "nsys"):
        for k, name in ((0, "wall"), (1, "CPU")):
            ratio = rows[(k, config)][0] / rows[(k, "off")][0]
            print(
                f"ratio {config} waiting / off, {name:>4} time: {ratio:.4f} (target <= {TARGET}) -> {'met' if ratio <= TARGET else 'NOT met'}"
            )
    share = per_call / rows[(0, "off")][0]
    print(f"a waiting step's own cost, measured alone: {per_call * 1e6:.3f} us per ctx.step() = {share * 100:.4f}% of a step")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("HPC_TRAIN_PROFILE", "HPC_TRAIN_METRICS"):  # hpc_train.contract: the bench sets its own
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__, "--worker"]
    cmd += [f"--steps={args.steps}", f"--blocks={args.blocks}", f"--width={args.width}", f"--batch={args.batch}"]
    raise SystemExit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
