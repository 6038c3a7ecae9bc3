"""The training loop that survives preemptions and time limits, under any backend.

    python -m hpc_train submit --site sandbox --backend torchrun --nodes 2 --checkpoint-every 20 \\
        examples/train_resumable.py -- --steps 400

On the scheduler's warning signal (or the wall clock nearing the limit) every rank saves the same
step, rank 0 requeues the job, and the next run continues from there. At the end rank 0 writes the
final parameters to ``<job folder>/final.pt`` so runs can be compared bit for bit.
"""

import argparse
import os
import socket
import time

import torch
from torch.utils.data import TensorDataset

import hpc_train.runtime as rt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="slow each step down (for tests)")
    parser.add_argument("--out", default=os.environ.get("HPC_TRAIN_JOB_FOLDER", "."))
    args, _ = parser.parse_known_args()

    ctx = rt.init()
    torch.manual_seed(0)
    w_true = torch.randn(16, 1)
    x = torch.randn(2048, 16)
    y = x @ w_true + 0.01 * torch.randn(2048, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = ctx.prepare(model, optimizer)
    loader = ctx.loader(TensorDataset(x, y), batch_size=16)
    loss_fn = torch.nn.functional.mse_loss
    total_steps = args.steps

    # the loop of docs/checkpointing.md, plus progress lines and the tests' slow-down
    ckpt = ctx.checkpointer()
    step = ckpt.restore()
    ctx.print(f"rank 0 on {socket.gethostname()}: starting at step {step} of {total_steps} (backend {ctx.backend})")
    for xb, yb in ctx.batches(loader, start=step, total=total_steps):
        loss = loss_fn(model(xb.to(ctx.device)).float(), yb.to(ctx.device))
        ctx.backward(loss)
        ctx.step()
        step += 1
        if step % 20 == 0:
            ctx.print(f"step {step:5d}/{total_steps}  loss {loss.item():.5f}")
        if args.step_seconds:
            time.sleep(args.step_seconds)
        ckpt.step(step)
    ckpt.close()
    if ctx.is_main:
        params = {k: v.detach().cpu() for k, v in ctx.unwrap(model).state_dict().items()}
        torch.save(params, os.path.join(args.out, "final.pt"))
        print(f"done: {total_steps} steps", flush=True)
    ctx.shutdown()


if __name__ == "__main__":
    main()
