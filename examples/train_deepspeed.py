"""A DeepSpeed script written for the ``deepspeed`` launcher, knowing nothing of hpc_train.

It reads ``--local_rank`` and ``--deepspeed_config`` as that launcher's scripts do:

    deepspeed --num_gpus 2 examples/train_deepspeed.py --deepspeed --deepspeed_config ds.json
    python -m hpc_train submit --backend deepspeed ... examples/train_deepspeed.py -- --deepspeed --deepspeed_config ds.json
"""

import argparse
import json
import os
import socket

import deepspeed
import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=os.environ.get("HPC_TRAIN_JOB_FOLDER", "."))
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    w_true = torch.randn(16, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 16, generator=generator)
        loss = torch.nn.functional.mse_loss(engine(x), x @ w_true)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    checksum = sum(p.detach().double().sum().item() for p in engine.module.parameters())
    report = {
        "rank": rank,
        "local_rank_arg": args.local_rank,
        "host": socket.gethostname(),
        "world_size": dist.get_world_size(),
        "config": args.deepspeed_config,
        "zero_stage": engine.zero_optimization_stage(),
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "param_checksum": checksum,
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    if rank == 0:
        print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
