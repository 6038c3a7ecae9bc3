"""ACME's hooks. hpc_train calls the per-job ones only for jobs on the sites named in
``hpc_train_site_names``; other sites (``sandbox``, ``bluecloud``, ...) never see them."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import hookimpl
from hpc_train.config.slurm_time import format_slurm_time, parse_slurm_time

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.config.models import SiteConfig
    from hpc_train.submission.job_plan import JobPlan

HERE = Path(__file__).resolve().parent
SUPPORT = "hpc@acme.example"

# ACME's rules, in one place (the `acme-limits` command prints them)
RESERVATION_ABOVE_NODES = 2
MAX_TIME = {"gpu": "48:00:00", "debug": "00:30:00"}
DEFAULT_ACCOUNT = {"gpu": "acme-gpu", "debug": "acme-debug"}
DEFAULT_QOS = {"gpu": "normal", "debug": "debug"}


@hookimpl
def hpc_train_site_names() -> list[str]:
    # The site file below, plus any site a user derives from it as acme-<something>.
    return ["acme", "acme-*"]


@hookimpl
def hpc_train_site_dirs() -> list[Path]:
    return [HERE / "sites"]


@hookimpl
def hpc_train_template_dirs() -> list[Path]:
    return [HERE / "templates"]


@hookimpl
def hpc_train_detect_site(hostname: str, environ: Mapping[str, str]) -> str | None:
    return "acme" if fnmatch.fnmatch(hostname, "login*.acme.example") else None


def _partition(job: JobSpec, site: SiteConfig) -> str | None:
    return job.partition or site.default_partition


@hookimpl
def hpc_train_validate_job(job: JobSpec, site: SiteConfig) -> list[str]:
    problems = []
    if job.nodes > RESERVATION_ABOVE_NODES and not job.reservation:
        problems.append(
            f"ACME: jobs on more than {RESERVATION_ABOVE_NODES} nodes need a reservation; "
            f"ask {SUPPORT} for one and add --reservation NAME"
        )
    partition = _partition(job, site)
    part = site.partitions.get(partition or "")
    time = job.time if job.time is not None else (part.default_time if part else None)
    if partition in MAX_TIME and time is not None and parse_slurm_time(time) > parse_slurm_time(MAX_TIME[partition]):
        problems.append(
            f"ACME: the {partition} partition allows {MAX_TIME[partition]} at most, "
            f"{format_slurm_time(parse_slurm_time(time))} asked; checkpoint and resubmit, "
            "or split the run"
        )
    return problems


@hookimpl
def hpc_train_sbatch_directives(job: JobSpec, site: SiteConfig, backend: str) -> dict[str, Any]:
    # Amend rather than reject: a default account and QoS per partition, unless the user chose one.
    partition = _partition(job, site) or ""
    directives: dict[str, Any] = {}
    if job.account is None and partition in DEFAULT_ACCOUNT:
        directives["account"] = DEFAULT_ACCOUNT[partition]
    if job.qos is None and partition in DEFAULT_QOS:
        directives["qos"] = DEFAULT_QOS[partition]
    return directives


@hookimpl
def hpc_train_job_env(job: JobSpec, site: SiteConfig, backend: str) -> dict[str, str]:
    env = {"UCX_NET_DEVICES": "mlx5_0:1", "ACME_PARTITION": _partition(job, site) or ""}
    if backend == "mpi":
        env["OMPI_MCA_btl"] = "^openib"  # ACME's MPI goes through UCX
    return env


@hookimpl
def hpc_train_template_context(plan: JobPlan) -> dict[str, Any]:
    return {"acme_support": SUPPORT}


@hookimpl
def hpc_train_cli_commands() -> list[object]:
    from acme_hpc import cli_limits

    return [cli_limits]
