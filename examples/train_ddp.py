"""A plain torchrun DDP script that knows nothing of hpc_train.

It trains a small regression model on synthetic data, checks a cross-rank all-reduce, and writes
what it saw (rank, host, world size, all-reduce sum, losses, a parameter checksum) to
``<out>/rank<R>.json`` so tests can assert on what really happened.

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --steps 50
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default=os.environ.get("HPC_TRAIN_JOB_FOLDER", "."))
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} on {socket.gethostname()}", flush=True)
    torch.manual_seed(0)

    # y = x @ w_true + noise: the loss falls well below its starting value within a few dozen steps
    w_true = torch.randn(16, 1)
    x = torch.randn(4096, 16)
    y = x @ w_true + 0.01 * torch.randn(4096, 1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.MSELoss()

    probe = torch.tensor([float(rank + 1)])
    dist.all_reduce(probe)
    if rank == 0:
        print(f"world size {world}; all-reduce of ranks 1..{world} = {probe.item():.0f}", flush=True)

    losses = []
    step, epoch = 0, 0
    start = time.time()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if rank == 0 and (step % 10 == 0 or step == 1):
                print(f"step {step:4d}/{args.steps}  loss {loss.item():.4f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1

    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    report = {
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "world_size": world,
        "host": socket.gethostname(),
        "allreduce_sum": probe.item(),
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "param_checksum": checksum,
        "seconds": time.time() - start,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    if rank == 0:
        print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {report['seconds']:.1f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
