"""The job folder's file names: one home for what the batch script, the runtime and the login side
write and read there. A typo in one of them used to fail silently (a poll reading a file nobody
writes); the template gets them from here (``files.RUNS``), Python imports them.

Imported by both sides: it imports nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

RUNS = "runs"  # the run counter: the batch script adds one at the start of every run
LAST_RUN = "last_run"  # "RUN STATUS requeued|ended", written by the batch script as each run ends
CHECKPOINTS = "checkpoints"  # HPC_TRAIN_CHECKPOINT_DIR: step-N/ folders with a COMMIT marker
STOP_REQUESTED = "stop_requested"  # HPC_TRAIN_STOP_FILE: the batch shell got the scheduler's warning
REQUEUE_REQUESTED = "requeue_requested"  # HPC_TRAIN_REQUEUED_FILE: rank 0 requeued; Slurm ends the run
NO_RETRY = "no_retry"  # HPC_TRAIN_NO_RETRY_FILE: why --on-failure requeue must not retry this run
METRICS = "metrics"  # the metrics folder (steps.jsonl, TensorBoard events, the Prometheus textfile)
STEPS = "steps.jsonl"  # one JSON line per optimizer step, in METRICS
RECORD = "hpc_train.json"  # the job's record (hpc_train.jobs.handle.JobRecord)

#: the names as the template sees them: ``{{ files.RUNS }}``
FILES = SimpleNamespace(**{name: value for name, value in globals().items() if name.isupper() and isinstance(value, str)})
