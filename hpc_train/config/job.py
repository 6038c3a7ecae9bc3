"""What the user asked for: the same fields from the CLI, the Python API and (later) job files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal

from hpc_train import contract
from hpc_train.config.duration import optional_duration
from hpc_train.config.fields import After, Before, Flag, Ge, Gt, Le, Model, setting
from hpc_train.config.models import Env, MemSize, SbatchValue, SlurmTime, sbatch_problem
from hpc_train.config.profile_spec import SpecError
from hpc_train.config.profile_spec import parse as parse_profile
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


def _profile(value: str | None) -> str | None:
    # checked and spelled out here, so the job reads back exactly what was decided (hpc_train.config.profile_spec)
    if value is None:
        return None
    try:
        return str(parse_profile(value))
    except SpecError as exc:
        raise ValueError(str(exc)) from None


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
        raise ValueError(
            f"time={value!r} is ambiguous (minutes or seconds?): give {format_slurm_time(example)!r} or {_as_timedelta(example)}"
        )
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


def _resume_from(value: str | None) -> str | None:
    # resolved to the absolute checkpoint folder here, so the job reads back the folder that was checked
    if value is None:
        return None
    from hpc_train.jobs.resume_source import resolve

    return resolve(value)


def _micro_batch(value: Any) -> str | None:
    # "auto" or a whole number of samples, kept as text: the flag, the variable and the API spell it alike
    if value is None:
        return None
    text = str(value).strip().lower()
    if not isinstance(value, bool) and (text == "auto" or (text.isdigit() and int(text) >= 1)):
        return text if text == "auto" else str(int(text))
    raise ValueError(f"expected 'auto' or a whole number of samples of at least 1 (like 8), got {value!r}")


# The --help headings of ``submit`` and ``render``, in this order; a field with ``cli=Flag(heading)`` is a flag
# under its heading (hpc_train.cli.options), in the order of the fields.
WHERE = "where and how"
TRAINING = "training (read by hpc_train.runtime inside the job)"
PREEMPTION = "preemption, time limits and checkpoints"
RESOURCES = "resources"
DEPENDENCIES = "dependencies"
GROUPS = (WHERE, TRAINING, PREEMPTION, RESOURCES, DEPENDENCIES)


@dataclass(frozen=True, kw_only=True)
class JobSpec(Model):
    """One training job. ``None`` means "the site's (or backend's) default"."""

    site: str | None = setting(
        None,
        "site name or path to a site YAML file",
        cli=Flag(WHERE, help="site name or path to a site YAML file (default: detected, else 'local')"),
    )
    backend: str = setting(
        "torchrun", "distributed backend plugin", cli=Flag(WHERE, help="distributed backend (default: torchrun)")
    )
    script: str | None = setting(None, "training script (script jobs)")
    script_args: list[str] = setting(doc="arguments after --", factory=list)
    # resources
    nodes: Annotated[int, Ge(1)] = setting(1, "nodes (default: 1)", cli=Flag(RESOURCES, short="-N"))
    procs_per_node: Annotated[int, Ge(1)] | None = setting(
        None, "processes per node (default: GPUs per node, 1 on CPU)", cli=Flag(RESOURCES)
    )
    gpus_per_node: Annotated[int, Ge(0)] | None = setting(None, "GPUs per node (default: the partition's)", cli=Flag(RESOURCES))
    cpus_per_task: Annotated[int, Ge(1)] | None = setting(None, cli=Flag(RESOURCES))
    mem: Annotated[MemSize, After(_single_line)] = setting(
        None, "memory per node, as sbatch --mem takes it", cli=Flag(RESOURCES, help="memory per node, as sbatch takes it (500G)")
    )
    partition: Line = setting(None, cli=Flag(RESOURCES, short="-p"))
    time: JobTime = setting(
        None,
        "time limit: Slurm format (12:00:00, 2-00:00:00) or a timedelta",
        cli=Flag(RESOURCES, short="-t", help="time limit: 12:00:00, 2-00:00:00, minutes"),
    )
    job_name: Line = setting(None, cli=Flag(RESOURCES, short="-J"))
    account: Line = setting(None, cli=Flag(RESOURCES, short="-A"))
    qos: Line = setting(None, cli=Flag(RESOURCES, short="-q"))
    reservation: Line = setting(None, cli=Flag(RESOURCES))
    constraint: Line = setting(None, cli=Flag(RESOURCES, short="-C"))
    sbatch: Annotated[dict[str, SbatchValue], After(_sbatch_keys)] = setting(
        doc="extra #SBATCH options",
        factory=dict,
        cli=Flag(RESOURCES, metavar="OPTION=VALUE", help="any other sbatch option, e.g. --sbatch mail-type=END (repeatable)"),
    )
    # where and how
    backend_options: dict[str, Any] = setting(
        doc="backend option (repeatable)", factory=dict, cli=Flag(WHERE, flag="--option", short="-o", metavar="KEY=VALUE")
    )
    nccl_profile: Line = setting(None, "NCCL/fabric profile from the site file (PROFILE+OVERLAY stacks them)", cli=Flag(WHERE))
    env: Env = setting(doc="environment variable (repeatable)", factory=dict, cli=Flag(WHERE, short="-e", metavar="NAME=VALUE"))
    python: str | None = setting(
        None, "python on the compute nodes", cli=Flag(WHERE, help="python on the compute nodes (default: this interpreter)")
    )
    container: bool | None = setting(
        None,
        "run in the site's container (default: the site's 'enabled')",
        cli=Flag(WHERE, help="run every task in the site's container image (--no-container: never)"),
    )
    container_image: str | None = setting(
        None,
        "run in this image (implies container)",
        cli=Flag(WHERE, help="run every task in this image (site's container runtime)"),
    )
    workdir: Line = setting(
        None,
        "working directory of the job; default: where you submit from",
        cli=Flag(WHERE, help="working directory of the job (default: here)"),
    )
    job_root: Line = setting(
        None,
        "folder for job folders; default: the site's job_root",
        cli=Flag(WHERE, help="folder for job folders (default: the site's job_root)"),
    )
    snapshot: bool | None = setting(
        None,
        "run the script's project as it is now, from a snapshot (default: the site's, on)",
        cli=Flag(
            WHERE,
            help="run a copy of the script's project taken now, whatever is edited before the job starts or requeues "
            "(default: the site's, on; --no-snapshot runs the files in place)",
        ),
    )
    # training options, read inside the job by hpc_train.runtime (every backend)
    precision: Literal["fp32", "bf16", "fp16"] | None = setting(
        None, "mixed precision (fp16 adds loss scaling)", cli=Flag(TRAINING), env=contract.ENV_PRECISION
    )
    grad_clip: Annotated[float, Gt(0)] | None = setting(
        None,
        "clip the gradient norm to this value",
        cli=Flag(TRAINING, metavar="NORM", help="clip the gradient norm"),
        env=contract.ENV_GRAD_CLIP,
    )
    grad_accum: Annotated[int, Ge(1)] | None = setting(
        None, "micro-batches per optimizer step", cli=Flag(TRAINING, metavar="N"), env=contract.ENV_GRAD_ACCUM
    )
    micro_batch: Annotated[str | None, Before(_micro_batch)] = setting(
        None,
        "samples per forward/backward ('auto': the largest that fits); the loader's batch stays the step's",
        cli=Flag(
            TRAINING,
            metavar="N|auto",
            help="split each loader batch into micro-batches of N samples, accumulated to one step "
            "(auto: the largest that fits; an out-of-memory step is redone with half)",
        ),
        env=contract.ENV_MICRO_BATCH,
    )
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] | None = setting(
        None, "DDP gradient compression", cli=Flag(TRAINING), env=contract.ENV_COMM_HOOK
    )
    activation_checkpointing: bool | None = setting(
        None,
        "recompute activations in backward (less memory)",
        cli=Flag(TRAINING, negatable=False),
        env=contract.ENV_ACTIVATION_CHECKPOINTING,
    )
    # bad numerics (hpc_train.runtime.step.numerics): a non-finite loss or gradient always skips the step
    max_bad_steps: Annotated[int, Ge(0)] | None = setting(
        None,
        "optimizer steps in a row with a non-finite loss or gradient before --on-divergence acts (0: never; default 5)",
        cli=Flag(
            TRAINING,
            metavar="N",
            help="skipped steps in a row (non-finite loss or gradient) before the run stops or rolls back (0: never; default 5)",
        ),
        env=contract.ENV_MAX_BAD_STEPS,
    )
    on_divergence: Literal["stop", "rollback"] | None = setting(
        None,
        "after --max-bad-steps bad steps in a row: stop the run (not retried), or restore the last checkpoint "
        "and go on past the bad batches",
        cli=Flag(
            TRAINING,
            help="after --max-bad-steps bad steps in a row: stop (default; not retried) or rollback to the last checkpoint",
        ),
        env=contract.ENV_ON_DIVERGENCE,
    )
    # preemption and time limits (defaults: the site's requeue policy)
    requeue: bool | None = setting(
        None,
        "save and requeue before the limit / on the warning signal",
        cli=Flag(PREEMPTION, help="save and requeue before the time limit or on the warning signal (default: the site's)"),
    )
    max_restarts: Annotated[int, Ge(0)] | None = setting(
        None, "requeues allowed before the job stops for good", cli=Flag(PREEMPTION, metavar="N")
    )
    signal_grace: Annotated[int, Ge(10)] | None = setting(
        None,
        "seconds of warning before the time limit",
        cli=Flag(PREEMPTION, metavar="SECONDS", help="warning this long before the time limit"),
    )
    on_failure: Literal["fail", "requeue"] | None = setting(
        None, "a crashed run: fail, or requeue within the budget", cli=Flag(PREEMPTION)
    )
    # failures nobody announces (docs/failures.md); defaults: the site's health section
    hang_timeout: Annotated[float | None, Before(optional_duration)] = setting(
        None,
        "no step for this long is a hang: dump stacks, name the rank, restart (300, 5m, off)",
        cli=Flag(
            PREEMPTION,
            metavar="DURATION",
            help="no step for this long is a hang: stacks dumped, the rank named, the run restarted "
            "(300, 5m, off; default: learned from the run's step time)",
        ),
    )
    spare_nodes: Annotated[int, Ge(0)] = setting(
        0,
        "extra nodes in the allocation: a run that fails for a node restarts on them at once, without a requeue",
        cli=Flag(
            PREEMPTION,
            metavar="K",
            help="allocate K more nodes; a run that fails for a node (a hang, a crash there) "
            "restarts on the others inside the allocation, without a requeue or a queue wait",
        ),
    )
    node_check: bool | None = setting(
        None,
        "check every node (GPUs, fabric, the job folder) before a run trains on it; a failing node is avoided",
        cli=Flag(
            PREEMPTION,
            help="check every node (GPUs, fabric, the job folder) before a run trains on it; a node "
            "that fails is replaced by a spare or avoided by a requeue (default: the site's)",
        ),
    )
    straggler_threshold: Annotated[float, Ge(0), Le(10)] | None = setting(
        None,
        "name a rank this much slower than the median (0.2 = 20 %; 0: off)",
        cli=Flag(
            PREEMPTION,
            metavar="FRACTION",
            help="name a rank slower than the median by more than this (default 0.2 = 20 %; 0: off)",
        ),
    )
    checkpoint_every: Annotated[int, Ge(1)] | None = setting(
        None,
        "save every N steps (ckpt.step)",
        cli=Flag(PREEMPTION, metavar="N", help="save every N steps"),
        env=contract.ENV_CHECKPOINT_EVERY,
    )
    keep_checkpoints: Annotated[int, Ge(1)] | None = setting(
        None,
        "how many complete checkpoints to keep",
        cli=Flag(PREEMPTION, metavar="K", help="complete checkpoints to keep (default 2)"),
        env=contract.ENV_KEEP_CHECKPOINTS,
    )
    async_checkpoint: bool | None = setting(
        None, "write periodic checkpoints in the background", cli=Flag(PREEMPTION), env=contract.ENV_ASYNC_CHECKPOINT
    )
    local_checkpoints: bool | None = setting(
        None,
        "save to the site's node-local storage first (default: where the site names it)",
        cli=Flag(
            PREEMPTION,
            help="save checkpoints to the site's node-local storage first (checkpoint_local_dir), copy them to a partner "
            "node and drain them to shared storage in the background (default: on where the site names a folder)",
        ),
    )
    restart_from_scratch: bool | None = setting(
        None,
        "when checkpoints exist but none loads, set them aside and train from step 0 instead of failing",
        cli=Flag(
            PREEMPTION,
            negatable=False,
            help="when the job's checkpoints exist but none loads (damaged), set them aside and train from step 0 instead "
            "of failing (a checkpoint that loads is still resumed from)",
        ),
        env=contract.ENV_RESTART_FROM_SCRATCH,
    )
    resume_from: Annotated[str | None, After(_resume_from)] = setting(
        None,
        "continue the newest committed checkpoint of this job (id or name) or folder, at this job's shape "
        '(docs/checkpointing.md, "Resume under a different shape")',
        cli=Flag(
            PREEMPTION,
            metavar="JOB|FOLDER",
            help="start from the newest committed checkpoint of job JOB (id or name) or of FOLDER (a job or checkpoint "
            "folder), with this job's world size; its own checkpoints, once it has any, win after a requeue",
        ),
        env=contract.ENV_RESUME_FROM,
    )
    exact_resume: bool | None = setting(
        None,
        "fixed DDP gradient buckets so a resumed run is bit-identical",
        cli=Flag(PREEMPTION, help="fix DDP's gradient buckets so resumed runs are bit-identical (default on)"),
        env=contract.ENV_EXACT_RESUME,
    )
    metrics: bool | None = setting(
        None,
        "per-step metrics files in the job folder (on unless False)",
        cli=Flag(TRAINING, help="record step time, throughput, loss, communication (default on; see `report`)"),
        env=contract.ENV_METRICS,
    )
    profile: Annotated[str | None, After(_profile)] = setting(
        None,
        "profile chosen steps and ranks: torch (torch.profiler traces) or nsys (Nsight Systems), e.g. "
        "'torch:wait=5,warmup=2,active=3,ranks=0,last' (docs/profiling.md)",
        cli=Flag(
            TRAINING,
            metavar="torch|nsys[:SPEC]",
            help="profile steps wait..wait+warmup+active of each run on chosen ranks (default 0 and the last): "
            "torch traces or nsys reports in <job>/profile/; SPEC like wait=5,warmup=2,active=3,ranks=0,last",
        ),
        env=contract.ENV_PROFILE,
    )
    # tensor / pipeline parallel layout (hpc_train.submission.layout); checked against the resources by the plan
    parallel: Annotated[str | dict[str, int] | None, After(_parallel)] = setting(
        None,
        "process mesh sizes, e.g. 'dp=2,tp=2,pp=1'",
        cli=Flag(
            TRAINING,
            metavar="dp=N,tp=N,pp=N",
            help="data/tensor/pipeline parallel layout; dp x tp x pp = nodes x processes per node",
        ),
    )
    # dependencies (sbatch --dependency): start after these jobs or sweeps; hpc_train.sweeps.submit expands sweep ids
    after: Annotated[list[str], Before(_after)] = setting(
        doc="job ids this job waits for (--after)",
        factory=list,
        cli=Flag(DEPENDENCIES, metavar="JOB", help="start after this job or sweep (repeatable; ids may be comma-separated)"),
    )
    after_type: Literal["afterok", "afterany", "afternotok", "after", "aftercorr"] = setting(
        "afterok",
        "how --after jobs must end: afterok (succeeded), afterany, afternotok, after (started)",
        cli=Flag(DEPENDENCIES, help="how the --after jobs must end (default afterok: succeeded; afterany: ended at all)"),
    )
