"""The documented loop, recording what a resume must keep: each step's global loss and global samples.

    --steps N          train to step N (counted from 0 across resumes)
    --stop-at S        save step S and end there (the run a later job resumes with --resume-from)
    --save-at S        save step S and go on: the uninterrupted run is also the one a later job resumes
    --batch-size B     ctx.loader's batch_size: per rank in the shape that started the run
    --adam             Adam instead of SGD with momentum (DeepSpeed reshards Adam's ZeRO state alone)

Rank 0 appends one JSON line per step to <job folder>/resume_steps.jsonl: step, loss (the mean over the
data-parallel ranks), samples (the sample ids all ranks read, sorted), world_size, per_rank_batch.
"""

import argparse
import json
import os
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import hpc_train.runtime as rt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--adam", action="store_true")
    args, _ = parser.parse_known_args()

    ctx = rt.init()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)
    torch.manual_seed(0)  # no dropout: nothing random that a new world size would draw differently
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    if args.adam:
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, _ = ctx.prepare(model, optimizer)
    loader = ctx.loader(TensorDataset(x, y, torch.arange(64)), batch_size=args.batch_size, seed=3)
    total = args.stop_at or args.steps
    out = Path(os.environ.get("HPC_TRAIN_JOB_FOLDER", ".")) / "resume_steps.jsonl"

    ckpt = ctx.checkpointer()
    step = ckpt.restore()
    for xb, yb, ids in ctx.batches(loader, start=step, total=total):
        loss = torch.nn.functional.mse_loss(model(xb.to(ctx.device)), yb.to(ctx.device))
        ctx.backward(loss)
        ctx.step()
        step += 1
        mean = ctx.all_reduce(loss.detach().clone(), "mean").item()
        seen = sorted(i for rank_ids in ctx.runtime.gather_object(ids.tolist()) for i in rank_ids)
        if ctx.is_main:
            row = {"step": step, "loss": mean, "samples": seen, "world_size": ctx.world_size}
            with out.open("a") as f:
                f.write(json.dumps({**row, "per_rank_batch": loader.loader.batch_size}) + "\n")
        ckpt.step(step)
        if step == args.save_at:
            ckpt.save(step)
    if args.stop_at:
        ckpt.save(step)
    ckpt.close()
    ctx.print(f"done at step {step}")


if __name__ == "__main__":
    main()
