"""A folder the batch script puts first on PYTHONPATH: its ``sitecustomize`` runs in every Python of
the job, plain scripts too (see sitecustomize.py), hpc_train_nsys.py, which it runs under --profile nsys,
hpc_train_gc.py, which pauses the garbage collector while torch imports, and hpc_train_watch.py, which turns
a plain script's optimizer steps into its heartbeat.
Nothing else lives here, so nothing else is shadowed."""

from pathlib import Path

FOLDER = str(Path(__file__).resolve().parent)
