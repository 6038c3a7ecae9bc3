"""A training loop that produces NaN on one rank, for the numerics tests (tests/e2e/test_numerics_cluster.py).

    --nan-rank R --nan-steps 5,6   rank R's batch is NaN at these steps (0-based batch numbers)
    --every N                      checkpoint every N steps (for --on-divergence rollback)
Rank 0 writes the final parameters to <job folder>/final.pt; every rank its own to final-rank<R>.pt.
"""

import argparse
import os

import torch
from torch.utils.data import TensorDataset

import hpc_train.runtime as rt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nan-rank", type=int, default=1)
    parser.add_argument("--nan-steps", default="")
    parser.add_argument("--every", type=int, default=0)
    args, _ = parser.parse_known_args()
    nan_steps = {int(s) for s in args.nan_steps.split(",") if s}
    out = os.environ.get("HPC_TRAIN_JOB_FOLDER", ".")

    ctx = rt.init()
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = x @ torch.randn(16, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9))
    loader = ctx.loader(TensorDataset(x, y), batch_size=8)
    ckpt = ctx.checkpointer(every=args.every) if args.every else None
    step = ckpt.restore() if ckpt else 0
    for xb, yb in ctx.batches(loader, start=step, total=args.steps):
        xb, yb = xb.to(ctx.device), yb.to(ctx.device)
        if ctx.rank == args.nan_rank and step in nan_steps:
            xb = xb * float("nan")
        ctx.backward(torch.nn.functional.mse_loss(model(xb).float(), yb))
        ctx.step()
        step += 1
        if ckpt:
            ckpt.step(step)
    if ckpt:
        ckpt.close()
    params = {k: v.detach().cpu() for k, v in ctx.unwrap(model).state_dict().items()}
    torch.save(params, os.path.join(out, f"final-rank{ctx.rank}.pt"))
    ctx.print(f"done: {args.steps} steps")
    ctx.shutdown()


if __name__ == "__main__":
    main()
