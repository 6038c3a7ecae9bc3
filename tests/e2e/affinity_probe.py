"""Each process of the job writes where it may run: its CPUs, its thread count and its Slurm task's CPU
request, to ``<job folder>/affinity/rank-N.json`` (tests/e2e/test_cpu_binding_cluster.py).

A plain script: it reads its rank from the launcher's environment and starts no process group.
"""

import json
import os
import socket
from pathlib import Path

import torch

from hpc_train.runtime import detect

env = detect()
folder = Path(os.environ["HPC_TRAIN_JOB_FOLDER"]) / "affinity"
folder.mkdir(exist_ok=True)
record = {
    "rank": env.rank,
    "local_rank": env.local_rank,
    "host": socket.gethostname(),
    "cpus": sorted(os.sched_getaffinity(0)),
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    "torch_threads": torch.get_num_threads(),
    "slurm_cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK"),
}
(folder / f"rank-{env.rank}.json").write_text(json.dumps(record))
