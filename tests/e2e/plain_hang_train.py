"""A plain torchrun DDP script that knows nothing of hpc_train: rank 1 blocks at a given step in the job's
first run (tests/e2e/test_failures_cluster.py: hang detection for scripts that never import the runtime).

    torchrun ... plain_hang_train.py --steps 150 --hang-step 60
"""

import argparse
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--hang-step", type=int, default=60)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = os.environ.get("HPC_TRAIN_RUN", "1")  # the job's run number: only the first one hangs
    folder = Path(os.environ["HPC_TRAIN_JOB_FOLDER"])
    (folder / f"plain-hosts-{run}-rank-{rank}").write_text(socket.gethostname())
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if run == "1" and rank == 1 and step == args.hang_step:
            time.sleep(3600)  # stuck: rank 0 waits for it in DDP's all-reduce
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
