"""Per-step cost of the numerics check (hpc_train.runtime.numerics) against the same loop without it.

Two processes (torchrun, gloo, the torchrun backend: DDP), both loops in the same processes and the
same Context, interleaved in blocks so drift on a shared machine hits both alike. "without" switches
the check off (no loss seed, no norm, no reading it); "with" is what every job runs. Per block the
median wall and CPU (process_time) ms per step; the ratio is of the medians over all blocks, the
spread the lowest and highest block ratio. Target <= 1.01.

    .venv/bin/python bench/numerics.py [--steps 200 --blocks 8 --hidden 32,512 --batch 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

TARGET = 1.01


class _Off:
    """A guard that checks nothing: the loop as it was before the check."""

    def on_backward(self, loss: Any) -> Any:
        return loss

    def after_step(self, checkpointers: Any) -> None:
        pass

    def start_at(self, step: int) -> None:
        pass


def make_model(hidden: int) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
    )


def block(ctx: Any, batches: list[Any], hidden: int, checked: bool) -> tuple[list[float], list[float]]:
    import torch

    guard = ctx.numerics
    if not checked:
        ctx.numerics, ctx.runtime.numerics = _Off(), None
    try:
        model = make_model(hidden)
        model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3))
        walls, cpus = [], []
        for xb, yb in batches:
            wall, cpu = time.perf_counter(), time.process_time()
            ctx.backward(torch.nn.functional.mse_loss(model(xb), yb))
            ctx.step()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        return walls, cpus
    finally:
        ctx.numerics = ctx.runtime.numerics = guard


def measure(ctx: Any, args: argparse.Namespace, hidden: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(ctx.rank)
    batches = [(torch.randn(args.batch, 64), torch.randn(args.batch, 1)) for _ in range(args.steps)]
    block(ctx, batches, hidden, True), block(ctx, batches, hidden, False)  # warm-up
    on: dict[str, list[float]] = {"wall": [], "cpu": []}
    off: dict[str, list[float]] = {"wall": [], "cpu": []}
    ratios = []
    for index in range(args.blocks):
        order = (True, False) if index % 2 == 0 else (False, True)
        medians = {}
        for checked in order:
            walls, cpus = block(ctx, batches, hidden, checked)
            target = on if checked else off
            target["wall"].extend(walls)
            target["cpu"].extend(cpus)
            medians[checked] = statistics.median(walls)
        ratios.append(medians[True] / medians[False])
    stats = torch.tensor(
        [
            statistics.median(on["wall"]),
            statistics.median(off["wall"]),
            statistics.median(on["cpu"]),
            statistics.median(off["cpu"]),
        ],
        dtype=torch.float64,
    )
    ctx.all_reduce(stats)  # the slower rank sets the pace in data parallel; report the mean of both
    stats /= ctx.world_size
    return {"stats": stats.tolist(), "spread": (min(ratios), max(ratios))}


def worker(args: argparse.Namespace) -> None:
    import hpc_train.runtime as rt

    ctx = rt.init(backend="torchrun", metrics=False)  # the check alone: metrics have their own bench
    results = {hidden: measure(ctx, args, hidden) for hidden in args.hidden}
    if ctx.is_main:
        print(
            f"2-layer MLP 64-H-H-1, batch {args.batch}, {ctx.world_size} processes (DDP, gloo), {args.blocks} x {args.steps} steps"
        )
        print(
            f"{'H':>5} {'without ms':>11} {'with ms':>9} {'ratio':>7} {'block spread':>15} {'CPU without':>12} {'CPU with':>9} {'CPU ratio':>10}"
        )
        for hidden, result in results.items():
            on_wall, off_wall, on_cpu, off_cpu = result["stats"]
            low, high = result["spread"]
            ratio = on_wall / off_wall
            print(
                f"{hidden:>5} {off_wall * 1e3:>11.3f} {on_wall * 1e3:>9.3f} {ratio:>7.3f} {f'{low:.3f}-{high:.3f}':>15} "
                f"{off_cpu * 1e3:>12.3f} {on_cpu * 1e3:>9.3f} {on_cpu / off_cpu:>10.3f}  "
                f"(target <= {TARGET}: {'met' if ratio <= TARGET else 'NOT met'})"
            )
    ctx.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=lambda s: [int(x) for x in s.split(",")], default=[32, 512])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        __file__,
        "--worker",
        f"--steps={args.steps}",
        f"--blocks={args.blocks}",
        f"--batch={args.batch}",
        f"--hidden={','.join(map(str, args.hidden))}",
    ]
    raise SystemExit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
