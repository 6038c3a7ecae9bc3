"""Site configuration models. Unknown keys are rejected: a typo in a site file must never be ignored.

Plain frozen dataclasses (hpc_train.config.fields): pydantic validates them (hpc_train.config.validate).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from hpc_train.config.fields import After, Before, Ge, Gt, Le, Model, Pattern, setting
from hpc_train.config.slurm_time import parse_slurm_time
from hpc_train.fabric.nccl import check_name, profile_errors

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that end up in #SBATCH values, file names and hook lookups: no spaces, quotes or control chars.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def _scalar_to_str(value: Any) -> Any:
    # YAML reads NCCL_IB_GID_INDEX: 3 as an int and NCCL_P2P_DISABLE: true as a bool; the environment is text.
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _check_env_names(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name (letters, digits, _)")
        typo = check_name(name)  # a misspelt NCCL_ name is silently ignored by NCCL: stop it here
        if typo is not None and typo.error:
            raise ValueError(f"{typo.message} ({typo.hint})")
    return env


def _check_time(value: str | int | None) -> str | int | None:
    if value is not None:
        parse_slurm_time(value)
    return value


def _safe_name(value: str | None) -> str | None:
    if value is not None and not SAFE_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid name (letters, digits, '.', '_', '+', '-')")
    return value


def _safe_partition_names(value: dict[str, Any]) -> dict[str, Any]:
    for name in value:
        if not SAFE_NAME.match(name):
            raise ValueError(f"partition name {name!r} is not valid (letters, digits, '.', '_', '+', '-')")
    return value


def _profile_names(value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    for name, error in profile_errors(value).items():  # names were checked per profile (NcclProfile)
        raise ValueError(f"{name}: {error}")
    return value


EnvValue = Annotated[str, Before(_scalar_to_str)]
SbatchValue = str | int | bool | None
Env = Annotated[dict[str, EnvValue], After(_check_env_names)]
SlurmTime = Annotated[str | int | None, After(_check_time)]
SafeName = Annotated[str, After(_safe_name)]

# --- fabric (issue 5): profiles are checked per profile, so an error names the profile's line
NcclProfile = Annotated[dict[str, EnvValue], After(_check_env_names)]


@dataclass(frozen=True, kw_only=True)
class Preflight(Model):
    """What `preflight` expects of the fabric: all-reduce bus bandwidth in GB/s (nccl-tests' busbw)."""

    busbw_gbs: Annotated[float, Gt(0)] | None = setting(None, "least bus bandwidth at the largest message size")
    pair_busbw_gbs: Annotated[float, Gt(0)] | None = setting(None, "least bus bandwidth any node pair may show")
    max_size: Annotated[str, Pattern(r"^[0-9]+[KMG]?$")] = setting(
        "1G", "largest all-reduce message (sizes go 1M, 4M, ... up to it)")


@dataclass(frozen=True, kw_only=True)
class Partition(Model):
    """One Slurm partition as the site's users see it."""

    description: str = ""
    gpus_per_node: Annotated[int, Ge(0)] = setting(0, "GPUs on each node; 0 for a CPU partition")
    gpu_type: str | None = setting(None, "gres type, e.g. a100 gives --gres=gpu:a100:N")
    gpu_model: str | None = setting(None, "for people: 'A100 80GB SXM'")
    cpus_per_node: Annotated[int, Ge(1)] | None = None
    mem_per_node: str | None = setting(None, "memory per node, as sbatch --mem takes it: 500G")
    max_nodes: Annotated[int, Ge(1)] | None = None
    max_time: SlurmTime = setting(None, "the partition's time limit (Slurm time format)")
    default_time: SlurmTime = None
    interconnect: str | None = setting(None, "nvlink+ib-hdr, pcie, ... (for people and doctor)")
    nccl_profile: str | None = setting(None, "the NCCL profile jobs on this partition get by default")
    preflight: Preflight | None = setting(None, "the partition's own preflight figures (default: the site's)")
    constraint: str | None = None
    sbatch: dict[str, SbatchValue] = setting(doc="extra #SBATCH options", factory=dict)
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
    grace_seconds: Annotated[int, Ge(10)] = setting(120, "how long before the time limit the warning comes")
    max_restarts: Annotated[int, Ge(0)] = setting(3, "requeues a job may have before it stops for good")
    on_failure: Literal["fail", "requeue"] = setting("fail", "a run that crashes: fail the job, or requeue it (within the budget)")
    release_held: bool = setting(False, "submit --wait and wait() release a requeued job at once instead of after Slurm's ~2 min hold")


@dataclass(frozen=True, kw_only=True)
class SiteConfig(Model):
    """A cluster (or this machine) as hpc_train targets it."""

    name: SafeName
    description: str = ""
    extends: str | None = setting(None, "site this one inherits from (name or relative path)")
    scheduler: Literal["slurm", "local"] = "slurm"
    default_partition: Annotated[str | None, After(_safe_name)] = None
    partitions: Annotated[dict[str, Partition], After(_safe_partition_names)] = setting(factory=dict)
    modules: list[str] = setting(doc="environment modules to load", factory=list)
    module_purge: bool = False
    setup: list[str] = setting(doc="shell lines the site runs before launch", factory=list)
    env: Env = setting(factory=dict)
    nccl_profiles: Annotated[dict[str, NcclProfile], After(_profile_names)] = setting(
        doc="named sets of NCCL/fabric variables; 'extends: other' inherits one", factory=dict)
    preflight: Preflight | None = setting(None, "what `preflight` expects of the fabric (default: no figure)")
    container: Container = setting(factory=Container)
    requeue: Requeue = setting(factory=Requeue)
    storage: dict[str, str] = setting(doc="named shared paths, exported as HPC_TRAIN_<NAME>_DIR", factory=dict)
    job_root: str = setting("~/hpc_train/jobs", "where job folders (logs, scripts, results) go; must be shared")
    python: str | None = setting(None, "python on the compute nodes; default: the submitting interpreter")
    slurm_conf: str | None = setting(None, "SLURM_CONF for the login side, when not the system default")
    sbatch: dict[str, SbatchValue] = setting(doc="extra #SBATCH options for every job", factory=dict)
    template: str = "sbatch/base.sh.j2"
    template_dirs: list[str] = setting(doc="folders searched before the built-in templates", factory=list)
    master_port: Annotated[int, Ge(1024), Le(65535)] = 29500
    backends: dict[str, dict[str, Any]] = setting(doc="per-backend default options", factory=dict)

    def partition(self, name: str | None) -> tuple[str | None, Partition | None]:
        """The named partition, else the site's default; (None, None) for a site without partitions."""
        name = name or self.default_partition
        if name is None:
            return None, None
        return name, self.partitions.get(name)
