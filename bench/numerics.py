"""Per-step cost of the numerics check (hpc_train.runtime.step.numerics) against the same loop without it.

Two processes (torchrun, gloo, the torchrun backend: DDP), both loops in the same processes and the
same Context, interleaved in blocks (bench/_interleave.py). "without" switches the check off (no loss
seed, no norm, no reading it); "with" is what every job runs. Printed per width: median wall and CPU
ms per step, the ratio with the spread of the block ratios, and the microseconds per step the check
adds. Target <= 1.01 on the default (H=32) model.

    .venv/bin/python bench/numerics.py [--steps 100 --blocks 24 --hidden 32,512 --batch 64 --procs 2]

``--procs 1`` runs one rank (no DDP, no communication) and prints the microseconds the check adds against
10 (1 % of the default ~1 ms two-rank step): two ranks on two shared cores spread the block ratios wider
than the 1 % looked for.

Last, the check's own calls timed where they run (``in place``: the loss read, the gradient probe, the
decision and the streak, each call's median): a figure a neighbour on a shared machine moves far less than
the with/without difference, which swung from +6 to +97 us between identical runs on a 2-core VM.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import _interleave as bench

TARGET = 1.01
ADDED_US_TARGET = 10.0  # 1 % of the default model's ~1 ms two-rank step (--procs 1: one rank, no communication)


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


def measure(ctx: Any, args: argparse.Namespace, hidden: int) -> tuple[bench.Summary, dict[str, float]]:
    import torch

    torch.manual_seed(ctx.rank)
    batches = [(torch.randn(args.batch, 64), torch.randn(args.batch, 1)) for _ in range(args.steps)]
    guard = ctx.numerics

    def loop(checked: bool) -> list[bench.Sample]:
        if not checked:
            ctx.numerics, ctx.runtime.numerics = _Off(), None
        try:
            model = make_model(hidden)
            model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3))

            def step(batch: Any) -> None:
                ctx.backward(torch.nn.functional.mse_loss(model(batch[0]), batch[1]))
                ctx.step()

            return bench.timed_steps(batches, step)
        finally:
            ctx.numerics = ctx.runtime.numerics = guard

    runs = bench.interleave({"with": lambda: loop(True), "without": lambda: loop(False)}, args.blocks)
    calls = in_place(ctx, lambda: loop(True), max(1, args.blocks // 3))
    return bench.Summary(runs.names, bench.mean_over_ranks(runs.vector(), ctx.all_reduce, ctx.world_size)), calls


# the check's calls in a step, by what they do: (the object's attribute on the Context, its method)
CALLS = {
    "loss read": ("numerics", "on_backward"),
    "gradient probe": ("runtime", "clip_gradients"),
    "decision": ("numerics", "check"),
    "streak": ("numerics", "after_step"),
}


def in_place(ctx: Any, loop: Callable[[], Any], rounds: int) -> dict[str, float]:
    """Median seconds of each of the check's calls, timed inside ``rounds`` runs of the checked loop."""
    found: dict[str, list[float]] = {name: [] for name in CALLS}

    def timer(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                found[name].append(time.perf_counter() - start)

        return timed

    owners = {name: getattr(ctx, owner) for name, (owner, _) in CALLS.items()}
    for name, (_, method) in CALLS.items():  # on the instances: the runtime's step calls self.clip_gradients()
        setattr(owners[name], method, timer(name, getattr(owners[name], method)))
    try:
        for _ in range(rounds):
            loop()
    finally:
        for name, (_, method) in CALLS.items():
            delattr(owners[name], method)
    return {name: statistics.median(times) for name, times in found.items()}


def worker(args: argparse.Namespace) -> None:
    import hpc_train.runtime as rt

    ctx = rt.init(backend="torchrun", metrics=False)  # the check alone: metrics have their own bench
    results = {hidden: measure(ctx, args, hidden) for hidden in args.hidden}
    if ctx.is_main:
        print(
            f"MLP 64-H-H-1, batch {args.batch}, {ctx.world_size} processes (DDP, gloo), {args.blocks} blocks x {args.steps} steps each loop"
        )
        for hidden, (summary, calls) in results.items():
            (off_wall, off_cpu), (on_wall, on_cpu) = summary.median("without"), summary.median("with")
            print(
                f"H={hidden}: without the check {off_wall * 1e3:.3f} ms wall, {off_cpu * 1e3:.3f} ms CPU; "
                f"with it {on_wall * 1e3:.3f} ms wall, {on_cpu * 1e3:.3f} ms CPU"
            )
            comparison, label = summary.compare("with", "without"), f"H={hidden} ratio with/without"
            lines = comparison.lines(label, TARGET) if ctx.world_size > 1 else comparison.added_lines(label, ADDED_US_TARGET)
            for line in lines:
                print(line)
            parts = ", ".join(f"{name} {seconds * 1e6:.1f}" for name, seconds in calls.items())
            print(f"{'':>{len(label)}}  in place, rank 0: {sum(calls.values()) * 1e6:.1f} us per step ({parts}; timer included)")
    ctx.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=lambda s: [int(x) for x in s.split(",")], default=[32, 512])
    parser.add_argument("--procs", type=int, default=2, help="ranks (1: the check's own cost, without gloo's noise)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args_out = [f"--steps={args.steps}", f"--blocks={args.blocks}", f"--batch={args.batch}"]
    bench.torchrun(__file__, [*args_out, f"--hidden={','.join(map(str, args.hidden))}"], procs=args.procs)


if __name__ == "__main__":
    main()
