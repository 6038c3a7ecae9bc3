"""Goodput: how much of a job's allocation trained new steps, where the rest went, and how each run ended.

Pure functions over the job folder (read on the login node, never imports torch):

- ``metrics/steps.jsonl``: ``run_start``/``run_end`` events, one line per step (``time`` is the end of
  the step, ``step_s`` its length), ``"event": "ranks"`` windows of per-rank compute times;
- ``metrics/stragglers.jsonl``, ``hangs.jsonl``, ``suspect_nodes.jsonl``, ``exclude_nodes``, ``hang_run``,
  ``run_start_step``, ``runs``, ``last_run`` (the batch script's and the runtime's files, hpc_train.contract);
- the batch log (``<job>_0_log.out``/``.err``): ``hpc_train: run N of job J on HOST at DATE`` as each run
  begins, ``run N failed (exit S); requeueing|restarting inside the allocation``, rank 0's
  ``run N: stopping at step S: REASON`` and ``saved step S to ...``;
- the committed checkpoints' step numbers (a save stalls the step after it);
- optionally Slurm's accounting, one line per allocation (``sacct --duplicates`` lists the requeued ones).

Allocated time is split so the parts add up to it: productive (steps no later run redid, less the
stalls and the straggler wait inside them), start-up, restart downtime, recomputed steps, checkpoint
stalls, hang detection, straggler slowdown and the rest ("other": shutdown, what no record explains).
Queue wait after a requeue is lost too, but not allocated: it is no GPU-hour.
Without sacct the allocations are estimated from the job's own records (``estimated``).

One module per job: ``records`` (the types), ``job_folder`` and ``batch_log`` and ``sacct`` (the three
sources), ``runs`` (how each run ended), ``ledger`` (where the time went), ``summary`` (the whole), ``text``.
"""

from __future__ import annotations

from hpc_train.jobs.goodput.batch_log import log_paths, parse_log_line, read_batch_log
from hpc_train.jobs.goodput.job_folder import read
from hpc_train.jobs.goodput.records import CAUSES, Allocation, BatchLog, Files, Goodput, RunView
from hpc_train.jobs.goodput.sacct import parse_sacct, sacct_allocations, sacct_command
from hpc_train.jobs.goodput.summary import load, summarize
from hpc_train.jobs.goodput.text import as_dict, format_lines, run_table

__all__ = [
    "CAUSES",
    "Allocation",
    "BatchLog",
    "Files",
    "Goodput",
    "RunView",
    "as_dict",
    "format_lines",
    "load",
    "log_paths",
    "parse_log_line",
    "parse_sacct",
    "read",
    "read_batch_log",
    "run_table",
    "sacct_allocations",
    "sacct_command",
    "summarize",
]
