"""examples/train_resumable.py's loop with real faults, for the failure tests (tests/e2e/test_failures_cluster.py).

    --hang RANK:STEP[:stop]  in run 1, rank RANK stops making progress at STEP: it blocks in a sleep
                             (the GIL free, like a rank stuck in I/O), or with ``:stop`` sends itself
                             SIGSTOP (nothing in the process runs, not even its heartbeat thread)
    --crash-at STEP          in every run, rank 1 raises at STEP (a crash loop)
    --crash-after N          in every run, rank 1 raises N steps after where the run began (each run
                             gets further: a job that fails again and again, yet makes progress)
    --sick-node FILE         in run 1 rank 1 writes its host to FILE and fails at start, the way a bad
                             GPU fails; in every later run, any rank on that host fails the same way
Rank 0 writes the final parameters to <job folder>/final.pt and every run's hosts to <job folder>/hosts-R.
"""

import argparse
import os
import signal
import socket
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import hpc_train.runtime as rt


def sick_node(path: str, rank: int, run: int) -> None:
    if run == 1 and rank == 1:
        with open(path, "w") as out:
            out.write(socket.gethostname())
    if os.path.exists(path) and Path(path).read_text().strip() == socket.gethostname():
        raise RuntimeError(f"CUDA error: uncorrectable ECC error encountered (injected on {socket.gethostname()})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--hang", default="")
    parser.add_argument("--sick-node", default="")
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--crash-after", type=int, default=-1)
    args = parser.parse_args()
    out = os.environ.get("HPC_TRAIN_JOB_FOLDER", ".")
    run = int(os.environ.get("HPC_TRAIN_RUN") or 1)

    ctx = rt.init()
    with open(os.path.join(out, f"hosts-{run}-rank-{ctx.rank}"), "w") as f:
        f.write(socket.gethostname())
    if args.sick_node:
        sick_node(args.sick_node, ctx.rank, run)
    hang_rank, hang_step, how = (args.hang + "::").split(":")[:3] if args.hang else ("-1", "-1", "")
    torch.manual_seed(0)
    w_true = torch.randn(16, 1)
    x = torch.randn(2048, 16)
    y = x @ w_true + 0.01 * torch.randn(2048, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9))
    loader = ctx.loader(TensorDataset(x, y), batch_size=16)
    ckpt = ctx.checkpointer()
    step = ckpt.restore()
    crash_at = step + args.crash_after if args.crash_after >= 0 else args.crash_at
    ctx.print(f"run {run}: starting at step {step} of {args.steps}")
    for xb, yb in ctx.batches(loader, start=step, total=args.steps):
        if run == 1 and ctx.rank == int(hang_rank) and step == int(hang_step):
            ctx.print(f"rank {ctx.rank}: hanging at step {step}")
            if how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(10**6)
        if ctx.rank == 1 and step == crash_at:
            raise RuntimeError(f"injected crash at step {step}")
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        ctx.backward(loss)
        ctx.step()
        step += 1
        if step % 20 == 0:
            ctx.print(f"step {step:5d}/{args.steps}  loss {loss.item():.5f}")
        if args.step_seconds:
            time.sleep(args.step_seconds)
        ckpt.step(step)
    ckpt.close()
    if ctx.is_main:
        params = {k: v.detach().cpu() for k, v in ctx.unwrap(model).state_dict().items()}
        torch.save(params, os.path.join(out, "final.pt"))
    ctx.shutdown()


if __name__ == "__main__":
    main()
