"""Per-step cost of hpc_train.runtime against the same loop written by hand with raw DDP.

Two processes (torchrun, gloo), both loops in the same processes, interleaved in blocks so drift on a
shared machine hits both alike; medians of per-step times; the ratio is ours / raw. Target <= 1.02.

    .venv/bin/python bench/runtime_overhead.py [--steps 200 --blocks 6 --hidden 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

TARGET = 1.02


def make_model(hidden: int):
    import torch

    torch.manual_seed(0)
    # the shape of examples/train.py's model; --hidden widens it
    return torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hpc_train.runtime as rt

    ctx = rt.init(backend="torchrun")
    torch.manual_seed(ctx.rank)
    batches = [(torch.randn(32, 16), torch.randn(32, 1)) for _ in range(args.steps)]
    loss_fn = torch.nn.MSELoss()

    def raw_block() -> list[float]:
        model = DDP(make_model(args.hidden))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        times = []
        for xb, yb in batches:
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            opt.step()
            times.append(time.perf_counter() - start)
        return times

    def ours_block() -> list[float]:
        model = make_model(args.hidden)
        model, _opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
        times = []
        for xb, yb in batches:
            start = time.perf_counter()
            ctx.backward(loss_fn(model(xb), yb))
            ctx.step()
            times.append(time.perf_counter() - start)
        return times

    raw_block(), ours_block()  # warm-up: allocator, gloo buffers, autograd graph caches
    raw, ours = [], []
    for block in range(args.blocks):
        order = (raw_block, ours_block) if block % 2 == 0 else (ours_block, raw_block)
        for fn in order:
            (raw if fn is raw_block else ours).extend(fn())
    stats = torch.tensor([statistics.median(raw), statistics.median(ours)], dtype=torch.float64)
    dist.all_reduce(stats)  # the slower rank sets the pace in data parallel; report the mean of both
    stats /= ctx.world_size
    if ctx.is_main:
        m_raw, m_ours = stats.tolist()
        print(f"model 16-{args.hidden}-1, batch 32, {ctx.world_size} processes, {args.blocks} x {args.steps} steps each")
        print(f"{'loop':<32} {'median ms/step':>15}")
        print(f"{'raw DDP by hand':<32} {m_raw * 1e3:>15.3f}")
        print(f"{'hpc_train.runtime':<32} {m_ours * 1e3:>15.3f}")
        ratio = m_ours / m_raw
        print(f"ratio runtime/raw: {ratio:.3f} (target <= {TARGET}) -> {'met' if ratio <= TARGET else 'NOT met'}")
    ctx.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=32)
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
        f"--hidden={args.hidden}",
    ]
    raise SystemExit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
