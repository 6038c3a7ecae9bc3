"""Which snapshots a job still needs: those of every job and sweep this machine submitted that the
scheduler still holds (pending, running, requeued, held). Their records name the tree they run
(JobRecord.code, SweepRecord.code); one ``squeue`` per cluster says which are still queued.

When a cluster cannot be asked (its controller down, squeue missing), every tree its jobs name is
kept: a collection must never take the code of a job that may still start.
"""

from __future__ import annotations

import json
from collections import defaultdict

from hpc_train.jobs.handle import state_dir
from hpc_train.jobs.states import ACTIVE_STATES
from hpc_train.submission import slurm_cmd


def needed_trees() -> set[str]:
    """The digests of the snapshots a queued job (or sweep task) runs."""
    by_conf: dict[str | None, dict[str, str]] = defaultdict(dict)  # slurm_conf -> job id -> digest
    keep: set[str] = set()
    for record in records():
        code = record.get("code")
        if not isinstance(code, dict) or not code.get("digest"):
            continue
        if record.get("scheduler") == "local":
            if local_active(str(record.get("job_id"))):
                keep.add(code["digest"])
            continue
        ids = [a.get("job_id") for a in record.get("arrays", [])] or [record.get("job_id")]
        for job_id in filter(None, ids):
            by_conf[record.get("slurm_conf")][str(job_id)] = code["digest"]
    for conf, digests in by_conf.items():
        queued = still_queued(list(digests), conf)
        keep |= {d for job_id, d in digests.items() if queued is None or job_id in queued}
    return keep


def records() -> list[dict]:
    found = []
    for folder in ("jobs", "sweeps"):
        for path in sorted((state_dir() / folder).glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                found.append(data)
    return found


def still_queued(job_ids: list[str], slurm_conf: str | None) -> set[str] | None:
    """The ids among ``job_ids`` the controller still holds (an array's by its own id); None: unknown."""
    out = slurm_cmd.run(["squeue", "-h", "-o", "%F %i", "-j", ",".join(job_ids)], slurm_conf, timeout=60)
    if out.returncode != 0:
        # squeue refuses the whole list when one id is long gone: ask for each, so one old job does not
        # keep every tree (and a controller that is down keeps them all)
        return one_by_one(job_ids, slurm_conf) if "Invalid job id" in out.stderr else None
    queued = set()
    for line in out.stdout.split("\n"):
        queued.update(line.split())
    return {i.split("_")[0] for i in queued}


def one_by_one(job_ids: list[str], slurm_conf: str | None) -> set[str] | None:
    queued = set()
    for job_id in job_ids:
        out = slurm_cmd.run(["squeue", "-h", "-o", "%F", "-j", job_id], slurm_conf, timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            queued.add(job_id)
        elif out.returncode != 0 and "Invalid job id" not in out.stderr:
            return None
    return queued


def local_active(job_id: str) -> bool:
    from hpc_train.jobs.handle import JobHandle

    try:
        return JobHandle.from_id(job_id).state in ACTIVE_STATES
    except Exception:  # a record this version cannot read: its job may still run
        return True
