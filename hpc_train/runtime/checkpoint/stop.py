"""What a run that must stop (a time limit, a preemption, a stop signal) does once its last step is saved:
requeue the job, or end it with a code that says to resubmit. Rank 0 decides, and records the decision
for the batch script (supervise/retries), which decides alone only after a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpc_train import contract, log_lines
from hpc_train.runtime.lifecycle.preemption import requeue
from hpc_train.runtime.log import log
from hpc_train.runtime.supervise import retries

EXIT_STOPPED = 3  # stopped for a time limit or preemption without a requeue: resubmit to continue


def requeue_or_stop(run: int, max_restarts: int | None, step: int, reason: str, folder: Path) -> int:
    """Rank 0: requeue the job unless its restart budget is spent; the run's exit code (0 once requeued)."""
    log(log_lines.STOPPING.text(run=run, step=step, reason=reason))
    if max_restarts is not None and run > max_restarts:
        message = f"restart budget exhausted ({max_restarts} restarts); step {step} is saved in {folder}, resubmit to continue"
        log(message)
        retries.record_here(EXIT_STOPPED, "not_retried", "restart_budget", message)
        return EXIT_STOPPED
    done, message = requeue()
    log(message)
    if not done:
        retries.record_here(EXIT_STOPPED, "not_retried", "requeue_failed", message)
        return EXIT_STOPPED
    marker = os.environ.get(contract.ENV_REQUEUED_FILE)
    if marker:  # the batch script then waits for Slurm instead of ending the job
        Path(marker).touch()
    retries.record_here(0, "requeued", "stopped", reason)
    return 0
