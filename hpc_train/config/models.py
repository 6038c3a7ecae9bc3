"""Site configuration models. Unknown keys are rejected: a typo in a site file must never be ignored.

Plain frozen dataclasses (hpc_train.config.fields): pydantic validates them (hpc_train.config.validate).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from hpc_train import contract
from hpc_train.config.duration import optional_duration
from hpc_train.config.fields import After, Before, Ge, Gt, Le, Model, Pattern, setting
from hpc_train.config.slurm_time import parse_slurm_time
from hpc_train.config.text import kind_of, shorten, unsafe_char
from hpc_train.fabric.nccl import check_name, profile_errors

# Every pattern is matched whole (fullmatch): `$` would let a trailing newline through.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Names that end up in #SBATCH values, file names and hook lookups: no spaces, quotes or control chars.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# a storage key becomes part of a variable name, HPC_TRAIN_<KEY>_DIR, exported by the job script
STORAGE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]*")
MEM_SIZE = re.compile(r"[0-9]+[KMGTkmgt]?")  # sbatch --mem: megabytes unless a unit follows
MEM_FORMS = "a number of megabytes (64000), or one with a unit K, M, G or T (500G)"
MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
# sbatch options hpc_train sets itself, and what sets them instead; a second value would contradict the plan
RESERVED_SBATCH = {
    "nodes": "--nodes",
    "ntasks-per-node": "--procs-per-node",
    "ntasks": "--nodes and --procs-per-node",
    "output": "job_root",
    "error": "job_root",
    "job-name": "--job-name",
    "time": "--time, or a partition's default_time",
    "partition": "--partition, or default_partition",
    "gres": "--gpus-per-node, or a partition's gpus_per_node and gpu_type",
}


def _scalar_to_str(value: Any) -> Any:
    # YAML reads NCCL_IB_GID_INDEX: 3 as an int and NCCL_P2P_DISABLE: true as a bool; the environment is text.
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _integer(value: Any) -> Any:
    # 8.0 for 8 is a mistake in a site file (and true for 1 everywhere: hpc_train.config.validate.no_bool_int)
    if isinstance(value, (bool, float)):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid environment variable name (letters, digits, _)")
    typo = check_name(name)  # a misspelt NCCL_ name is silently ignored by NCCL: stop it here
    if typo is not None and typo.error:
        raise ValueError(f"{typo.message} ({typo.hint})")
    return name


def _check_env_names(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        _env_name(name)
    return env


def _time_input(value: Any) -> Any:
    if isinstance(value, (bool, float)):  # `12:00` would be text now; `yes` or `1.5` is YAML guessing a type
        raise ValueError(f"expected a Slurm time such as '12:00:00' or minutes, got {value!r} (quote it)")
    if value is not None and not isinstance(value, (str, int)):
        raise ValueError(f"expected a Slurm time such as '12:00:00' or minutes, got {shorten(repr(value))}")
    return value


def _check_time(value: str | int | None) -> str | int | None:
    if value is not None:
        parse_slurm_time(value)
    return value


def _safe_name(value: str | None) -> str | None:
    if value is not None and not SAFE_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid name (letters, digits, '.', '_', '+', '-')")
    return value


def _partition_name(name: str) -> str:
    if not SAFE_NAME.fullmatch(name):
        raise ValueError(f"partition name {name!r} is not valid (letters, digits, '.', '_', '+', '-')")
    return name


def _profile_names(value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    for name, error in profile_errors(value).items():  # names were checked per profile (NcclProfile)
        raise ValueError(f"{name}: {error}")
    return value


def mem_size_problem(value: str) -> str | None:
    """What is wrong with a memory size as sbatch --mem reads it, or None; with the fix when one is near."""
    if MEM_SIZE.fullmatch(value):
        return None
    fixed = re.sub(r"\s+", "", value).upper().removesuffix("B").removesuffix("I")  # '5 GB', '5gb', '5GiB'
    near = f"; did you mean {fixed!r}?" if MEM_SIZE.fullmatch(fixed) and fixed != value else ""
    return f"{value!r} is not a memory size: {MEM_FORMS}{near}"


def mem_megabytes(value: str) -> float:
    """A valid memory size (MEM_SIZE) in megabytes, as sbatch counts them (K = 1/1024 M, G = 1024 M)."""
    unit = value[-1].upper() if value[-1].isalpha() else "M"
    return int(value.rstrip("KMGTkmgt")) * MEM_UNITS[unit]


def _mem_size(value: str | None) -> str | None:
    message = mem_size_problem(value) if value is not None else None
    if message:
        raise ValueError(message)
    return value


def _storage_key(key: str) -> str:
    if not STORAGE_KEY.fullmatch(key):
        fixed = key.replace("-", "_").replace(".", "_")
        hint = f"; did you mean {fixed!r}?" if STORAGE_KEY.fullmatch(fixed) else ""
        raise ValueError(
            f"{key!r} is not a storage name: letters, digits and _ (it becomes the variable {contract.storage_dir_env('<NAME>')}){hint}"
        )
    return key


def sbatch_problem(key: str, value: Any, set_by: str = "the job option for it") -> str | None:
    """What is wrong with one extra #SBATCH option (site, partition or --sbatch), or None."""
    if not SBATCH_KEY.fullmatch(key):
        fixed = key.strip().lstrip("-").replace("_", "-").lower()
        hint = f"; did you mean {fixed!r}?" if SBATCH_KEY.fullmatch(fixed) else ""
        return f"{key!r} is not an sbatch long option name (like 'mail-type'){hint}"
    if key in RESERVED_SBATCH:
        return f"--{key} is set by hpc_train; use {set_by if set_by != 'site' else RESERVED_SBATCH[key]} instead"
    char = unsafe_char(value) if isinstance(value, str) else None
    if char is not None:
        return f"value of {key!r} must not contain {kind_of(char)}: sbatch reads each option as one line"
    return None


def _site_sbatch_key(key: str) -> str:
    message = sbatch_problem(key, None, set_by="site")  # values: the loader refuses control characters anywhere
    if message:
        raise ValueError(message)
    return key


def _local_dir(value: str | None) -> str | None:
    # expanded on each node by the job (os.path.expandvars: variables only, never a command)
    if value is None:
        return None
    if not value.startswith(("/", "$", "~")):
        raise ValueError(f"{value!r} is not an absolute path: give one as each node sees it (/local/$USER, $SLURM_TMPDIR)")
    return value


def _template_name(value: str) -> str:
    # the renderer looks a name up in the site's template_dirs and the built-ins, never a path of its own
    name = value.removeprefix("default:")
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"{value!r} is not a template name: a relative path inside template_dirs "
            "(no '..', not absolute), or 'default:sbatch/base.sh.j2'"
        )
    return value


EnvValue = Annotated[str, Before(_scalar_to_str)]
SbatchValue = str | int | bool | None
# names are checked one by one, so an error names the variable's own line
Env = dict[Annotated[str, After(_env_name)], EnvValue]
SlurmTime = Annotated[str | int | None, After(_check_time), Before(_time_input)]
SafeName = Annotated[str, After(_safe_name)]
MemSize = Annotated[str | None, After(_mem_size)]
# checked key by key, so an error names the key's own line
SiteSbatch = dict[Annotated[str, After(_site_sbatch_key)], SbatchValue]
Count = Annotated[int, Ge(0), Before(_integer)]
Positive = Annotated[int, Ge(1), Before(_integer)]

# --- fabric (issue 5): profiles are checked per profile, so an error names the profile's line
# a profile is checked as a whole: its error names the profile's line, where its variables start
NcclProfile = Annotated[dict[str, EnvValue], After(_check_env_names)]


@dataclass(frozen=True, kw_only=True)
class Preflight(Model):
    """What `preflight` expects of the fabric: all-reduce bus bandwidth in GB/s (nccl-tests' busbw)."""

    busbw_gbs: Annotated[float, Gt(0)] | None = setting(None, "least bus bandwidth at the largest message size")
    pair_busbw_gbs: Annotated[float, Gt(0)] | None = setting(None, "least bus bandwidth any node pair may show")
    max_size: Annotated[str, Pattern(r"^[0-9]+[KMG]?$")] = setting(
        "1G", "largest all-reduce message (sizes go 1M, 4M, ... up to it)"
    )


@dataclass(frozen=True, kw_only=True)
class Partition(Model):
    """One Slurm partition as the site's users see it."""

    description: str = ""
    gpus_per_node: Count = setting(0, "GPUs on each node; 0 for a CPU partition")
    gpu_type: Annotated[str | None, After(_safe_name)] = setting(None, "gres type, e.g. a100 gives --gres=gpu:a100:N")
    gpu_model: str | None = setting(None, "for people: 'A100 80GB SXM'")
    cpus_per_node: Positive | None = None
    mem_per_node: MemSize = setting(None, "memory per node, as sbatch --mem takes it: 500G")
    max_nodes: Positive | None = None
    max_time: SlurmTime = setting(None, "the partition's time limit (Slurm time format)")
    default_time: SlurmTime = None
    interconnect: str | None = setting(None, "nvlink+ib-hdr, pcie, ... (for people and doctor)")
    nccl_profile: str | None = setting(None, "the NCCL profile jobs on this partition get by default")
    preflight: Preflight | None = setting(None, "the partition's own preflight figures (default: the site's)")
    constraint: str | None = None
    cpu_bind: Literal["cores", "threads", "sockets", "ldoms", "none"] | None = setting(
        None, "srun --cpu-bind for every task (default: the cluster's own binding)"
    )
    gpu_bind: Literal["closest"] | None = setting(
        None,
        "closest: each process runs on the GPU and the CPUs nearest each other (srun --gpu-bind=closest for "
        "one task per GPU; a launcher that forks its workers binds them itself)",
    )
    sbatch: SiteSbatch = setting(doc="extra #SBATCH options", factory=dict)
    env: Env = setting(factory=dict)


@dataclass(frozen=True, kw_only=True)
class Container(Model):
    """Run every task inside a container image: always (enabled), or when a job asks (--container)."""

    runtime: Literal["none", "apptainer", "singularity", "pyxis"] = "none"
    enabled: bool = setting(False, "every job runs in the image unless it says --no-container")
    image: str | None = None
    mounts: list[str] = setting(doc="host:container bind mounts", factory=list)
    options: list[str] = setting(doc="extra flags for the container runtime", factory=list)


@dataclass(frozen=True, kw_only=True)
class Requeue(Model):
    """How the site treats preemption and time limits."""

    enabled: bool = setting(False, "jobs save and requeue themselves before the limit or on preemption")
    signal: Literal["USR1", "USR2", "TERM", "INT", "HUP"] = setting("USR2", "the warning signal (USR1 can be taken by NCCL)")
    grace_seconds: Annotated[int, Ge(10), Before(_integer)] = setting(120, "how long before the time limit the warning comes")
    max_restarts: Count = setting(3, "requeues a job may have before it stops for good")
    on_failure: Literal["fail", "requeue"] = setting(
        "fail", "a run that crashes: fail the job, or requeue it (within the budget)"
    )
    release_held: bool = setting(
        False, "submit --wait and wait() release a requeued job at once instead of after Slurm's ~2 min hold"
    )


@dataclass(frozen=True, kw_only=True)
class Health(Model):
    """What the job watches for that the scheduler does not announce (docs/failures.md)."""

    hang_timeout: Annotated[float | None, Before(optional_duration)] = setting(
        None, "no step for this long is a hang (300, 5m, off); default: learned from the run's step time"
    )
    straggler_threshold: Annotated[float, Ge(0), Le(10)] = setting(
        0.2, "a rank this much slower than the median (0.2 = 20 %) is named; 0 turns it off"
    )
    exclude_suspect_nodes: bool = setting(True, "a requeue after a hang or crash avoids the node it was on")
    node_check: bool = setting(
        False, "check every node (GPUs, fabric, the job folder) before a run trains on it; a failing node is avoided"
    )


@dataclass(frozen=True, kw_only=True)
class Tools(Model):
    """Programs on the compute nodes that job options run; ``doctor`` checks that they are there."""

    nsys: str | None = setting(
        "nsys", "Nsight Systems for --profile nsys: a path or a command on PATH; null: the site has none (refused at submit)"
    )


@dataclass(frozen=True, kw_only=True)
class CodeSnapshot(Model):
    """Whether a script job runs a copy of its project taken at submit (hpc_train.snapshot), and how big one may be."""

    enabled: bool = setting(
        True, "a script job runs its project as it was at submit, whatever is edited meanwhile (false: the files in place)"
    )
    max_size: Annotated[str, After(_mem_size)] = setting(
        "1G", "a larger snapshot is refused before anything is queued, naming the largest files (K, M, G, T)"
    )
    gc_above: Annotated[int, Ge(0), Before(_integer)] = setting(
        100, "past this many snapshots in the job root, a submit removes those no queued job needs (0: only `gc` does)"
    )

    @property
    def max_bytes(self) -> int:
        return int(mem_megabytes(self.max_size) * 1024 * 1024)


@dataclass(frozen=True, kw_only=True)
class SiteConfig(Model):
    """A cluster (or this machine) as hpc_train targets it."""

    name: SafeName
    description: str = ""
    extends: str | None = setting(None, "site this one inherits from (name or relative path)")
    scheduler: Literal["slurm", "local"] = "slurm"
    default_partition: Annotated[str | None, After(_safe_name)] = None
    partitions: dict[Annotated[str, After(_partition_name)], Partition] = setting(factory=dict)
    modules: list[str] = setting(doc="environment modules to load", factory=list)
    module_purge: bool = False
    setup: list[str] = setting(doc="shell lines the site runs before launch", factory=list)
    env: Env = setting(factory=dict)
    nccl_profiles: Annotated[dict[str, NcclProfile], After(_profile_names)] = setting(
        doc="named sets of NCCL/fabric variables; 'extends: other' inherits one", factory=dict
    )
    preflight: Preflight | None = setting(None, "what `preflight` expects of the fabric (default: no figure)")
    container: Container = setting(factory=Container)
    requeue: Requeue = setting(factory=Requeue)
    health: Health = setting(factory=Health)
    tools: Tools = setting(factory=Tools)
    snapshot: CodeSnapshot = setting(factory=CodeSnapshot)
    storage: dict[Annotated[str, After(_storage_key)], str] = setting(
        doc=f"named shared paths, exported as {contract.storage_dir_env('<NAME>')}", factory=dict
    )
    job_root: str = setting("~/hpc_train/jobs", "where job folders (logs, scripts, results) go; must be shared")
    checkpoint_local_dir: Annotated[str | None, After(_local_dir)] = setting(
        None,
        "node-local storage for the checkpoints' fast tier, as each node sees it ($SLURM_TMPDIR, /local/$USER): "
        "saves go there first, to a partner node, then to shared storage in the background; null: none",
    )
    python: str | None = setting(None, "python on the compute nodes; default: the submitting interpreter")
    slurm_conf: str | None = setting(None, "SLURM_CONF for the login side, when not the system default")
    sbatch: SiteSbatch = setting(doc="extra #SBATCH options for every job", factory=dict)
    template: Annotated[str, After(_template_name)] = "sbatch/base.sh.j2"
    template_dirs: list[str] = setting(doc="folders searched before the built-in templates", factory=list)
    master_port: Annotated[int, Ge(1024), Le(65535), Before(_integer)] = 29500
    backends: dict[str, dict[str, Any]] = setting(doc="per-backend default options", factory=dict)

    def partition(self, name: str | None) -> tuple[str | None, Partition | None]:
        """The named partition, else the site's default; (None, None) for a site without partitions."""
        name = name or self.default_partition
        if name is None:
            return None, None
        return name, self.partitions.get(name)
