"""One training script for every backend: change ``--backend`` at submit time, nothing here.

    python -m hpc_train submit --site sandbox --backend deepspeed --nodes 2 --procs-per-node 2 examples/train.py

It trains a small regression model on synthetic data through ``hpc_train.runtime`` and writes what
each rank saw (host, world size, losses, a parameter checksum) to ``<job folder>/rank<R>.json``.
"""

import argparse
import json
import os
import socket
import sys
import time

import torch
from torch.utils.data import TensorDataset

import hpc_train.runtime as rt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default=os.environ.get("HPC_TRAIN_JOB_FOLDER", "."))
    # launchers may add their own arguments (--local_rank, --deepspeed_config); they are not ours
    args, _ = parser.parse_known_args()

    ctx = rt.init()
    print(
        f"rank {ctx.rank}/{ctx.world_size} on {socket.gethostname()} (backend {ctx.backend}, launcher {ctx.launcher})", flush=True
    )
    torch.manual_seed(0)  # same initial weights everywhere; the backends also broadcast rank 0's
    w_true = torch.randn(16, 1)
    x = torch.randn(4096, 16)
    y = x @ w_true + 0.01 * torch.randn(4096, 1)

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = ctx.prepare(model, optimizer)
    loader = ctx.loader(TensorDataset(x, y), batch_size=args.batch_size)
    loss_fn = torch.nn.MSELoss()

    losses, steps, start = [], 0, time.time()
    while steps < args.steps:
        for xb, yb in loader:
            xb, yb = xb.to(ctx.device), yb.to(ctx.device)
            loss = loss_fn(model(xb).float(), yb)
            ctx.backward(loss)
            if ctx.step():
                steps += 1
                losses.append(loss.item())
                if steps % 10 == 0 or steps == 1:
                    ctx.print(f"step {steps:4d}/{args.steps}  loss {loss.item():.4f}")
                if steps >= args.steps:
                    break

    probe = ctx.all_reduce(torch.tensor([float(ctx.rank + 1)]))
    params = ctx.unwrap(model).parameters()
    checksum = sum(p.detach().double().sum().item() for p in params)
    report = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "host": socket.gethostname(),
        "backend": ctx.backend,
        "launcher": ctx.launcher,
        "allreduce_sum": probe.item(),
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "param_checksum": checksum,
        "seconds": time.time() - start,
        "argv": sys.argv[1:],  # what the job gave the script, as the script sees it
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(report, f)
    ctx.print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {report['seconds']:.1f}s")
    ctx.shutdown()


if __name__ == "__main__":
    main()
