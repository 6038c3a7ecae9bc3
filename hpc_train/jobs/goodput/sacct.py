"""Slurm's accounting: one line per allocation of the job (``sacct --duplicates`` lists the requeued ones)."""

from __future__ import annotations

from hpc_train.jobs.goodput.records import Allocation, iso_seconds

SACCT_FIELDS = ["JobID", "State", "ExitCode", "Submit", "Start", "End", "NodeList", "AllocNodes", "AllocTRES"]


def sacct_command(job_id: str) -> list[str]:
    return ["sacct", "-j", job_id, "--duplicates", "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS)]


def parse_sacct(text: str, job_id: str) -> list[Allocation]:
    """sacct's lines for the job itself (not its steps), oldest first; a line that never started is skipped."""
    out = []
    for line in text.splitlines():
        values = dict(zip(SACCT_FIELDS, line.split("|")))
        start = iso_seconds(values.get("Start", ""))
        if values.get("JobID") != job_id or start is None:
            continue
        tres = dict(part.split("=", 1) for part in values.get("AllocTRES", "").split(",") if "=" in part)
        out.append(
            Allocation(
                start=start,
                end=iso_seconds(values.get("End", "")),
                state=(values.get("State") or "").split(" ")[0],
                exit_code=values.get("ExitCode", ""),
                nodelist=values.get("NodeList", ""),
                nodes=_digits(values.get("AllocNodes")) or _digits(tres.get("node")),
                gpus=_digits(tres.get("gres/gpu")),
                submit=iso_seconds(values.get("Submit", "")),
            )
        )
    return sorted(out, key=lambda a: a.start)


def _digits(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def sacct_allocations(job_id: str, slurm_conf: str | None = None) -> tuple[list[Allocation] | None, str | None]:
    """(allocations, None), or (None, why not): sacct may be missing, slow or without a database."""
    from hpc_train.submission import slurm_cmd

    out = slurm_cmd.run(sacct_command(job_id), slurm_conf, timeout=30)
    if out.returncode != 0:
        said = (out.stderr or "").strip().splitlines()  # a Slurm client without its config says a page
        return None, f"sacct failed: {said[0][:160] if said else f'exit {out.returncode}'}"
    found = parse_sacct(out.stdout, job_id)
    return (found, None) if found else (None, f"sacct has no started allocation of job {job_id}")
