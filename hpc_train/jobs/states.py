"""Slurm's job states as hpc_train reads them, and what a requeued job's hold looks like."""

from __future__ import annotations

FINAL_OK = {"COMPLETED"}
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"}
ACTIVE_STATES = PENDING_STATES | {"RUNNING", "COMPLETING", "STAGE_OUT", "UNKNOWN", "PREEMPTED", "READY", "SIGNALING"}
# Slurm holds a requeued job ~2 minutes (BeginTime); released in the requeue's own second, the new
# run's credential is refused ("Job credential revoked") and the job FAILS: release only after this
RELEASE_MARGIN_S = 3


def held_after_requeue(info: dict[str, str]) -> bool:
    """Whether ``scontrol show job`` fields show a requeued job on Slurm's hold (PENDING, BeginTime)."""
    return info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime"
