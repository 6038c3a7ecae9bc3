"""Site configuration models. Unknown keys are rejected: a typo in a site file must never be ignored."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)

from hpc_train.config.slurm_time import parse_slurm_time
from hpc_train.nccl import check_name, profile_errors

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


EnvValue = Annotated[str, BeforeValidator(_scalar_to_str)]
SbatchValue = Annotated[str | int | bool | None, Field()]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)


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


# --- fabric (issue 5): profiles are checked per profile, so an error names the profile's line
NcclProfile = Annotated[dict[str, EnvValue], AfterValidator(_check_env_names)]


class Preflight(Model):
    """What `preflight` expects of the fabric: all-reduce bus bandwidth in GB/s (nccl-tests' busbw)."""

    busbw_gbs: float | None = Field(None, gt=0, description="least bus bandwidth at the largest message size")
    pair_busbw_gbs: float | None = Field(None, gt=0, description="least bus bandwidth any node pair may show")
    max_size: str = Field("1G", pattern=r"^[0-9]+[KMG]?$", description="largest all-reduce message (sizes go 1M, 4M, ... up to it)")


class Partition(Model):
    """One Slurm partition as the site's users see it."""

    description: str = ""
    gpus_per_node: int = Field(0, ge=0, description="GPUs on each node; 0 for a CPU partition")
    gpu_type: str | None = Field(None, description="gres type, e.g. a100 gives --gres=gpu:a100:N")
    gpu_model: str | None = Field(None, description="for people: 'A100 80GB SXM'")
    cpus_per_node: int | None = Field(None, ge=1)
    mem_per_node: str | None = Field(None, description="memory per node, as sbatch --mem takes it: 500G")
    max_nodes: int | None = Field(None, ge=1)
    max_time: str | int | None = Field(None, description="the partition's time limit (Slurm time format)")
    default_time: str | int | None = None
    interconnect: str | None = Field(None, description="nvlink+ib-hdr, pcie, ... (for people and doctor)")
    nccl_profile: str | None = Field(None, description="the NCCL profile jobs on this partition get by default")
    preflight: Preflight | None = Field(None, description="the partition's own preflight figures (default: the site's)")
    constraint: str | None = None
    sbatch: dict[str, SbatchValue] = Field(default_factory=dict, description="extra #SBATCH options")
    env: dict[str, EnvValue] = Field(default_factory=dict)

    _env_names = field_validator("env")(_check_env_names)
    _times = field_validator("max_time", "default_time")(_check_time)


class Container(Model):
    """Run every task inside a container image: always (enabled), or when a job asks (--container)."""

    runtime: Literal["none", "apptainer", "singularity", "pyxis"] = "none"
    enabled: bool = Field(False, description="every job runs in the image unless it says --no-container")
    image: str | None = None
    mounts: list[str] = Field(default_factory=list, description="host:container bind mounts")
    options: list[str] = Field(default_factory=list, description="extra flags for the container runtime")


class Requeue(Model):
    """How the site treats preemption and time limits."""

    enabled: bool = Field(False, description="jobs save and requeue themselves before the limit or on preemption")
    signal: Literal["USR1", "USR2", "TERM", "INT", "HUP"] = Field("USR2", description="the warning signal (USR1 can be taken by NCCL)")
    grace_seconds: int = Field(120, ge=10, description="how long before the time limit the warning comes")
    max_restarts: int = Field(3, ge=0, description="requeues a job may have before it stops for good")
    on_failure: Literal["fail", "requeue"] = Field("fail", description="a run that crashes: fail the job, or requeue it (within the budget)")
    release_held: bool = Field(False, description="submit --wait and wait() release a requeued job at once instead of after Slurm's ~2 min hold")


class SiteConfig(Model):
    """A cluster (or this machine) as hpc_train targets it."""

    name: str
    description: str = ""
    extends: str | None = Field(None, description="site this one inherits from (name or relative path)")
    scheduler: Literal["slurm", "local"] = "slurm"
    default_partition: str | None = None
    partitions: dict[str, Partition] = Field(default_factory=dict)
    modules: list[str] = Field(default_factory=list, description="environment modules to load")
    module_purge: bool = False
    setup: list[str] = Field(default_factory=list, description="shell lines the site runs before launch")
    env: dict[str, EnvValue] = Field(default_factory=dict)
    nccl_profiles: dict[str, NcclProfile] = Field(
        default_factory=dict, description="named sets of NCCL/fabric variables; 'extends: other' inherits one")
    preflight: Preflight = Field(default_factory=Preflight, description="what `preflight` expects of the fabric")
    container: Container = Field(default_factory=Container)
    requeue: Requeue = Field(default_factory=Requeue)
    storage: dict[str, str] = Field(default_factory=dict, description="named shared paths, exported as HPC_TRAIN_<NAME>_DIR")
    job_root: str = Field("~/hpc_train/jobs", description="where job folders (logs, scripts, results) go; must be shared")
    python: str | None = Field(None, description="python on the compute nodes; default: the submitting interpreter")
    slurm_conf: str | None = Field(None, description="SLURM_CONF for the login side, when not the system default")
    sbatch: dict[str, SbatchValue] = Field(default_factory=dict, description="extra #SBATCH options for every job")
    template: str = "sbatch/base.sh.j2"
    template_dirs: list[str] = Field(default_factory=list, description="folders searched before the built-in templates")
    master_port: int = Field(29500, ge=1024, le=65535)
    backends: dict[str, dict[str, Any]] = Field(default_factory=dict, description="per-backend default options")

    _env_names = field_validator("env")(_check_env_names)

    @field_validator("name", "default_partition")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not SAFE_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid name (letters, digits, '.', '_', '+', '-')")
        return value

    @field_validator("partitions")
    @classmethod
    def _safe_partitions(cls, value: dict[str, Partition]) -> dict[str, Partition]:
        for name in value:
            if not SAFE_NAME.match(name):
                raise ValueError(f"partition name {name!r} is not valid (letters, digits, '.', '_', '+', '-')")
        return value

    @field_validator("nccl_profiles")
    @classmethod
    def _profile_names(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for name, error in profile_errors(value).items():  # names were checked per profile (NcclProfile)
            raise ValueError(f"{name}: {error}")
        return value

    def partition(self, name: str | None) -> tuple[str | None, Partition | None]:
        """The named partition, else the site's default; (None, None) for a site without partitions."""
        name = name or self.default_partition
        if name is None:
            return None, None
        return name, self.partitions.get(name)
