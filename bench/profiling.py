"""Per-step cost of --profile outside its active window: the same training loop with profiling off and on
(waiting for its window), in the same processes.

Two processes (torchrun, gloo) train a small CIFAR-10 CNN through ``hpc_train.runtime`` as three replicas
stepped in turns of 5 steps, the order rotating each turn: profiling off (no profiler: what every rank
that is not chosen, and every job without --profile, runs), ``torch`` waiting (the torch.profiler created
and started at the first forward, its window far ahead: every chosen rank's steps before the warm-up) and
``nsys`` waiting (the capture range not yet open). Per-step wall and CPU time: medians, the ratios
waiting / off with the spread of the block ratios, and the microseconds per step (bench/_interleave.py).
Target <= 1.01.

    .venv/bin/python bench/profiling.py [--steps 100 --blocks 4 --width 64 --batch 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _interleave as bench

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

    import hpc_train.runtime as rt
    from hpc_train.config.profile_spec import parse
    from hpc_train.runtime.observe.profiling import Profiler

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

    def run(config: str, xb: torch.Tensor, yb: torch.Tensor) -> bench.Sample:
        ctx.profiler = profilers.get(config)
        model, opt = models[config]
        ctx.runtime.model, ctx.runtime.optimizer = model, opt  # ctx.step() steps this replica

        def step() -> None:
            ctx.backward(loss_fn(model(xb), yb))
            ctx.step()

        return bench.timed(step)

    for xb, yb in batches[:20]:  # warm-up: allocator, gloo buffers, autograd caches; starts both profilers
        for config in CONFIGS:
            run(config, xb, yb)
    assert all(p.started and not p.done for p in profilers.values())
    runs, turn = bench.Runs(CONFIGS), 5
    for b in range(args.blocks):
        found: dict[str, list[bench.Sample]] = {config: [] for config in CONFIGS}
        for i in range(0, len(batches), turn):
            for config in bench.rotation(CONFIGS, i // turn + b):
                found[config] += [run(config, xb, yb) for xb, yb in batches[i : i + turn]]
        runs.add_block(found)
    assert profilers["torch"]._torch.step_num == 0  # never stepped: the window was never near
    # what a waiting step adds, alone: the step-time medians above cannot resolve a fraction of a microsecond
    alone = Profiler(parse("torch" + WAITING), ctx.rank, folder / "alone")
    alone.started, calls = True, 200_000
    start = time.perf_counter()
    for _ in range(calls):
        alone.step()
    per_call = (time.perf_counter() - start) / calls
    values = bench.mean_over_ranks([*runs.vector(), per_call], ctx.all_reduce, ctx.world_size)
    if ctx.is_main:
        report(args, ctx.world_size, bench.Summary(CONFIGS, values[:-1]), values[-1])
    ctx.profiler = None
    ctx.shutdown()


def report(args: argparse.Namespace, world: int, summary: bench.Summary, per_call: float) -> None:
    params = sum(p.numel() for p in make_model(args.width).parameters())
    print(
        f"cnn width {args.width} ({params / 1e6:.2f} M parameters), batch {args.batch}, {world} processes (gloo), "
        f"{args.blocks} blocks x {args.steps} steps each way, in turns of 5, the order rotating"
    )
    print(f"{'per step':<34} {'wall ms':>9} {'CPU ms':>9}")
    labels = {"off": "profiling off", "torch": "torch, waiting for its window", "nsys": "nsys, waiting for its window"}
    for config in CONFIGS:
        wall, cpu = summary.median(config)
        print(f"{labels[config]:<34} {wall * 1e3:>9.3f} {cpu * 1e3:>9.3f}")
    for config in ("torch", "nsys"):
        for line in summary.compare(config, "off").lines(f"ratio {config} waiting / off", TARGET):
            print(line)
    share = per_call / summary.median("off")[0]
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
    bench.torchrun(
        __file__, [f"--steps={args.steps}", f"--blocks={args.blocks}", f"--width={args.width}", f"--batch={args.batch}"]
    )


if __name__ == "__main__":
    main()
