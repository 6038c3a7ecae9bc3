"""Functions submitted as function jobs by the end-to-end tests (pickled by value)."""

import os
import socket


def where_am_i(tag: str) -> dict:
    keys = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NUM_NODES", "MASTER_ADDR", "HPC_TRAIN_BACKEND", "HPC_TRAIN_SITE")
    return {"tag": tag, "host": socket.gethostname(), **{k: os.environ.get(k) for k in keys}}
