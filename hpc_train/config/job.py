"""What the user asked for: the same fields from the CLI, the Python API and (later) job files."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from hpc_train.config.models import EnvValue, Model, SbatchValue, _check_env_names
from hpc_train.config.slurm_time import parse_slurm_time
from hpc_train.errors import UsageError
from hpc_train.layout import canonical as canonical_layout

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# sbatch options hpc_train sets itself; passing them through --sbatch would contradict the plan.
RESERVED_SBATCH = {"nodes", "ntasks-per-node", "ntasks", "output", "error", "job-name", "time", "partition", "gres"}
SBATCH_KEY = re.compile(r"^[a-z][a-z0-9-]*$")
AFTER_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


class JobSpec(Model):
    """One training job. ``None`` means "the site's (or backend's) default"."""

    site: str | None = Field(None, description="site name or path to a site YAML file")
    backend: str = Field("torchrun", description="distributed backend plugin")
    script: str | None = Field(None, description="training script (script jobs)")
    script_args: list[str] = Field(default_factory=list, description="arguments after --")
    nodes: int = Field(1, ge=1)
    procs_per_node: int | None = Field(None, ge=1, description="processes per node (default: GPUs per node, 1 on CPU)")
    gpus_per_node: int | None = Field(None, ge=0)
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | None = Field(None, description="memory per node, as sbatch --mem takes it")
    partition: str | None = None
    time: str | int | None = Field(None, description="time limit, Slurm format (12:00:00, 2-00:00:00)")
    job_name: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    env: dict[str, EnvValue] = Field(default_factory=dict)
    nccl_profile: str | None = None
    backend_options: dict[str, Any] = Field(default_factory=dict)
    sbatch: dict[str, SbatchValue] = Field(default_factory=dict, description="extra #SBATCH options")
    job_root: str | None = Field(None, description="folder for job folders; default: the site's job_root")
    python: str | None = Field(None, description="python on the compute nodes")
    container: bool | None = Field(None, description="run in the site's container (default: the site's 'enabled')")
    container_image: str | None = Field(None, description="run in this image (implies container)")
    workdir: str | None = Field(None, description="working directory of the job; default: where you submit from")
    # training options, read inside the job by hpc_train.runtime (every backend)
    precision: Literal["fp32", "bf16", "fp16"] | None = None
    grad_clip: float | None = Field(None, gt=0, description="clip the gradient norm to this value")
    grad_accum: int | None = Field(None, ge=1, description="micro-batches per optimizer step")
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] | None = Field(None, description="DDP gradient compression")
    activation_checkpointing: bool | None = None
    # preemption and time limits (defaults: the site's requeue policy)
    requeue: bool | None = Field(None, description="save and requeue before the limit / on the warning signal")
    max_restarts: int | None = Field(None, ge=0)
    signal_grace: int | None = Field(None, ge=10, description="seconds of warning before the time limit")
    on_failure: Literal["fail", "requeue"] | None = None
    checkpoint_every: int | None = Field(None, ge=1, description="save every N steps (ckpt.step)")
    keep_checkpoints: int | None = Field(None, ge=1, description="how many complete checkpoints to keep")
    async_checkpoint: bool | None = Field(None, description="write periodic checkpoints in the background")
    exact_resume: bool | None = Field(None, description="fixed DDP gradient buckets so a resumed run is bit-identical")
    metrics: bool | None = Field(None, description="per-step metrics files in the job folder (on unless False)")
    # tensor / pipeline parallel layout (hpc_train.layout); checked against the resources by the plan
    parallel: str | dict[str, int] | None = Field(None, description="process mesh sizes, e.g. 'dp=2,tp=2,pp=1'")
    # dependencies (sbatch --dependency): start after these jobs or sweeps; hpc_train.sweep expands sweep ids
    after: list[str] = Field(default_factory=list, description="job ids this job waits for (--after)")
    after_type: Literal["afterok", "afterany", "afternotok", "after", "aftercorr"] = Field(
        "afterok", description="how --after jobs must end: afterok (succeeded), afterany, afternotok, after (started)")

    _env_names = field_validator("env")(_check_env_names)

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            parse_slurm_time(value)
        return value

    @field_validator("parallel")
    @classmethod
    def _parallel(cls, value: str | dict[str, int] | None) -> str | None:
        if value is None:
            return None
        try:
            return canonical_layout(value)
        except UsageError as exc:
            raise ValueError(str(exc).replace("\n  hint: ", "; ")) from None

    @field_validator("after", mode="before")
    @classmethod
    def _after(cls, value: Any) -> list[str]:
        ids = [value] if isinstance(value, (str, int)) else list(value or [])
        words = [w for item in ids for w in str(item).replace(":", ",").split(",") if w.strip()]
        bad = [w for w in words if not AFTER_ID.match(w.strip())]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a Slurm job id (like 1234 or 1234_5)")
        return [w.strip() for w in words]

    @field_validator("job_name", "account", "qos", "reservation", "constraint", "partition", "mem")
    @classmethod
    def _single_line(cls, value: str | None) -> str | None:
        # These become #SBATCH values: a newline would start a directive of the user's choosing.
        if value is not None and _CONTROL.search(value):
            raise ValueError("must not contain newlines or other control characters")
        return value

    @field_validator("sbatch")
    @classmethod
    def _sbatch_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if not SBATCH_KEY.match(key):
                raise ValueError(f"{key!r} is not an sbatch long option name (like 'mail-type')")
            if key in RESERVED_SBATCH:
                raise ValueError(f"--{key} is set by hpc_train; use the job option for it instead")
            if isinstance(item, str) and _CONTROL.search(item):
                raise ValueError(f"value of {key!r} must not contain newlines or other control characters")
        return value
