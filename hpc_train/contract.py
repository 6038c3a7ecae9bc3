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
HEARTBEATS = "heartbeats"  # rank-N.json: each rank's last step and when (hpc_train.runtime.heartbeat)
DUMPS = "dumps"  # run-R/rank-N.txt: every thread's stack, written when the watchdog asks
HANGS = "hangs.jsonl"  # one line per hang the watchdog declared: who was behind, where, how long
HANG_RUN = "hang_run"  # the run the watchdog ended (its number): the batch script retries it
SUSPECT_NODES = "suspect_nodes.jsonl"  # nodes a hang or crash points at, and why; requeues avoid them
EXCLUDE_NODES = "exclude_nodes"  # the ExcNodeList the failure path sets after it requeues (comma-separated)
RUN_START_STEP = "run_start_step"  # "RUN STEP": the newest committed checkpoint when the run began
STRAGGLERS = "stragglers.jsonl"  # one line per rank named slower than the others (hpc_train.runtime.straggler)

# Variables the plan exports and the job reads (their values are set on the login side).
ENV_HANG_TIMEOUT = "HPC_TRAIN_HANG_TIMEOUT"  # seconds without a step before a hang; "0" turns detection off
ENV_STRAGGLER_THRESHOLD = "HPC_TRAIN_STRAGGLER_THRESHOLD"  # fraction slower than the median: 0.2 = 20 %
ENV_STRAGGLER_WINDOW = "HPC_TRAIN_STRAGGLER_WINDOW"  # steps per comparison window
ENV_HEARTBEATS = "HPC_TRAIN_HEARTBEATS"  # set when a watchdog runs: the folder the ranks beat into
ENV_EXCLUDE_SUSPECTS = "HPC_TRAIN_EXCLUDE_SUSPECTS"  # "1": a requeue after a hang or crash avoids its node

#: the names as the template sees them: ``{{ files.RUNS }}``
FILES = SimpleNamespace(**{name: value for name, value in globals().items()
                           if name.isupper() and isinstance(value, str) and not name.startswith("ENV_")})
