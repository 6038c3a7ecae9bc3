"""What the user asked for: the same fields from the CLI, the Python API and (later) job files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal

from hpc_train.config.duration import optional_duration
from hpc_train.config.fields import After, Before, Ge, Gt, Le, Model, setting
from hpc_train.config.models import Env, MemSize, SbatchValue, SlurmTime, sbatch_problem
from hpc_train.config.slurm_time import format_slurm_time
from hpc_train.config.text import kind_of, unsafe_char
from hpc_train.errors import UsageError
from hpc_train.submission.layout import canonical as canonical_layout

AFTER_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


def _parallel(value: str | dict[str, int] | None) -> str | None:
    if value is None:
        return None
    try:
        return canonical_layout(value)
    except UsageError as exc:
        raise ValueError(str(exc).replace("\n  hint: ", "; ")) from None


def _as_timedelta(seconds: int) -> str:
    for unit, size in (("hours", 3600), ("minutes", 60)):
        if seconds % size == 0:
            return f"timedelta({unit}={seconds // size})"
    return f"timedelta(seconds={seconds})"


def _job_time(value: Any) -> Any:
    # sbatch reads a bare number as minutes, Python code usually means seconds: time=3600 would ask for
    # 2.5 days. A job says which (a Slurm string or a timedelta); a site file's minutes stay (SlurmTime).
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if seconds <= 0 or seconds != int(seconds):
            raise ValueError(f"expected a positive whole number of seconds, got {value!r}")
        return format_slurm_time(int(seconds))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        example = int(value) if value >= 1 and value == int(value) else 3600
        raise ValueError(f"time={value!r} is ambiguous (minutes or seconds?): give "
                         f"{format_slurm_time(example)!r} or {_as_timedelta(example)}")
    return value


# a job's time limit: a Slurm string (the CLI's --time) or a timedelta, never a bare number
JobTime = Annotated[SlurmTime, Before(_job_time)]


def _after(value: Any) -> list[str]:
    ids = [value] if isinstance(value, (str, int)) else list(value or [])
    words = [w for item in ids for w in str(item).replace(":", ",").split(",") if w.strip()]
    bad = [w for w in words if not AFTER_ID.match(w.strip())]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a Slurm job id (like 1234 or 1234_5)")
    return [w.strip() for w in words]


def _single_line(value: str | None) -> str | None:
    # These become #SBATCH values (a newline would start a directive of the user's choosing) or are
    # shown by squeue and in the terminal (where U+202E would make a name read backwards).
    char = unsafe_char(value) if value is not None else None
    if char is not None:
        raise ValueError(f"must not contain {kind_of(char)}")
    return value


def _sbatch_keys(value: dict[str, Any]) -> dict[str, Any]:
    for key, item in value.items():
        message = sbatch_problem(key, item)
        if message:
            raise ValueError(message)
    return value


Line = Annotated[str | None, After(_single_line)]


@dataclass(frozen=True, kw_only=True)
class JobSpec(Model):
    """One training job. ``None`` means "the site's (or backend's) default"."""

    site: str | None = setting(None, "site name or path to a site YAML file")
    backend: str = setting("torchrun", "distributed backend plugin")
    script: str | None = setting(None, "training script (script jobs)")
    script_args: list[str] = setting(doc="arguments after --", factory=list)
    nodes: Annotated[int, Ge(1)] = 1
    procs_per_node: Annotated[int, Ge(1)] | None = setting(None, "processes per node (default: GPUs per node, 1 on CPU)")
    gpus_per_node: Annotated[int, Ge(0)] | None = None
    cpus_per_task: Annotated[int, Ge(1)] | None = None
    mem: Annotated[MemSize, After(_single_line)] = setting(None, "memory per node, as sbatch --mem takes it")
    partition: Line = None
    time: JobTime = setting(None, "time limit: Slurm format (12:00:00, 2-00:00:00) or a timedelta")
    job_name: Line = None
    account: Line = None
    qos: Line = None
    reservation: Line = None
    constraint: Line = None
    env: Env = setting(factory=dict)
    nccl_profile: Line = None
    backend_options: dict[str, Any] = setting(factory=dict)
    sbatch: Annotated[dict[str, SbatchValue], After(_sbatch_keys)] = setting(doc="extra #SBATCH options", factory=dict)
    job_root: Line = setting(None, "folder for job folders; default: the site's job_root")
    python: str | None = setting(None, "python on the compute nodes")
    container: bool | None = setting(None, "run in the site's container (default: the site's 'enabled')")
    container_image: str | None = setting(None, "run in this image (implies container)")
    workdir: Line = setting(None, "working directory of the job; default: where you submit from")
    # training options, read inside the job by hpc_train.runtime (every backend)
    precision: Literal["fp32", "bf16", "fp16"] | None = None
    grad_clip: Annotated[float, Gt(0)] | None = setting(None, "clip the gradient norm to this value")
    grad_accum: Annotated[int, Ge(1)] | None = setting(None, "micro-batches per optimizer step")
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] | None = setting(None, "DDP gradient compression")
    activation_checkpointing: bool | None = None
    # preemption and time limits (defaults: the site's requeue policy)
    requeue: bool | None = setting(None, "save and requeue before the limit / on the warning signal")
    max_restarts: Annotated[int, Ge(0)] | None = None
    signal_grace: Annotated[int, Ge(10)] | None = setting(None, "seconds of warning before the time limit")
    on_failure: Literal["fail", "requeue"] | None = None
    # failures nobody announces (docs/failures.md); defaults: the site's health section
    hang_timeout: Annotated[float | None, Before(optional_duration)] = setting(
        None, "no step for this long is a hang: dump stacks, name the rank, restart (300, 5m, off)")
    spare_nodes: Annotated[int, Ge(0)] = setting(
        0, "extra nodes in the allocation: a run that fails for a node restarts on them at once, without a requeue")
    straggler_threshold: Annotated[float, Ge(0), Le(10)] | None = setting(
        None, "name a rank this much slower than the median (0.2 = 20 %; 0: off)")
    checkpoint_every: Annotated[int, Ge(1)] | None = setting(None, "save every N steps (ckpt.step)")
    keep_checkpoints: Annotated[int, Ge(1)] | None = setting(None, "how many complete checkpoints to keep")
    async_checkpoint: bool | None = setting(None, "write periodic checkpoints in the background")
    restart_from_scratch: bool | None = setting(
        None, "when checkpoints exist but none loads, set them aside and train from step 0 instead of failing")
    exact_resume: bool | None = setting(None, "fixed DDP gradient buckets so a resumed run is bit-identical")
    metrics: bool | None = setting(None, "per-step metrics files in the job folder (on unless False)")
    # tensor / pipeline parallel layout (hpc_train.submission.layout); checked against the resources by the plan
    parallel: Annotated[str | dict[str, int] | None, After(_parallel)] = setting(
        None, "process mesh sizes, e.g. 'dp=2,tp=2,pp=1'")
    # dependencies (sbatch --dependency): start after these jobs or sweeps; hpc_train.sweeps.submit expands sweep ids
    after: Annotated[list[str], Before(_after)] = setting(doc="job ids this job waits for (--after)", factory=list)
    after_type: Literal["afterok", "afterany", "afternotok", "after", "aftercorr"] = setting(
        "afterok", "how --after jobs must end: afterok (succeeded), afterany, afternotok, after (started)")
