"""What the planning steps share: the job and its site, what was decided first (the resources, the
requeue, the layout, the backend) and the problems every step adds to. Each check and builder takes
one ``Facts`` instead of the five to eleven arguments they took one by one; the rules several steps
ask (is a watchdog on, which hang timeout) live here once."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpc_train.config.fields import flag_of
from hpc_train.config.job import JobSpec
from hpc_train.config.models import Partition, SiteConfig
from hpc_train.config.resolved import ResolvedSite
from hpc_train.errors import Problem
from hpc_train.plugin.backend import Backend

if TYPE_CHECKING:
    from hpc_train.plugin.manager import Plugins

JOB = "<job>"  # the source name for problems in what the user passed
USER_VAR = re.compile(r"\$(?:USER(?![A-Za-z0-9_])|\{USER\})")  # $USER or ${USER}, not $USERNAME


def login_user() -> str | None:
    """Who $USER means: the variable, else this account's name (cron, `su`, some containers leave USER unset)."""
    if os.environ.get("USER"):
        return os.environ["USER"]
    import getpass

    try:
        return getpass.getuser() or None
    except (KeyError, OSError):  # no passwd entry for this uid (KeyError before Python 3.13)
        return None


def expand(path: str, workdir: str) -> str:
    """A path as the job will use it, expanded here: $USER is the submitting user even where USER is unset."""
    if not os.environ.get("USER") and USER_VAR.search(path):
        user = login_user()  # never None here: _check_user refused the job
        path = USER_VAR.sub(lambda _: user or "$USER", path)
    expanded = os.path.expanduser(os.path.expandvars(path))
    return os.path.normpath(os.path.join(workdir, expanded))


class Problems(list[Problem]):
    """Everything wrong with the job, gathered by every step and reported at once."""

    def __init__(self, site_file: str) -> None:
        super().__init__()
        self.site_file = site_file

    def add(self, key: str, message: str, hint: str | None = None, source: str = JOB) -> None:
        """``key``: the JobSpec field (or the CLI flag) the problem is about; shown as the flag."""
        self.append(Problem(source, flag_of(JobSpec, key) if source == JOB else key, message, None, hint))


@dataclass(frozen=True)
class Resources:
    """Where the job runs and with how much: the partition, its processes and GPUs, its time."""

    part_name: str | None
    part: Partition
    gpus: int
    procs: int
    time_seconds: int | None


@dataclass(frozen=True)
class Requeue:
    enabled: bool
    grace: int
    policy: Any  # the site's RequeuePolicy


@dataclass(frozen=True)
class Names:
    """The job's paths and name on the compute nodes."""

    workdir: str
    python: str
    job_root: str
    script: str  # in the snapshot, when the job runs one
    job_name: str
    code_tree: str | None = None  # the snapshot's folder (hpc_train.snapshot.code.Code.tree)


@dataclass(frozen=True)
class Facts:
    """The job and what the plan decided before its checks run."""

    job: JobSpec
    resolved: ResolvedSite
    plugins: Plugins
    kind: str  # "script" or "function"
    backend: Backend
    res: Resources
    tasks: int  # Slurm tasks per node (torchrun: one per node; the others: one per process)
    requeue: Requeue
    layout: Any  # the tensor / pipeline layout (submission.layout), None without --parallel
    problems: Problems

    @property
    def site(self) -> SiteConfig:
        return self.resolved.config


def watchdog(f: Facts) -> bool:
    """Hangs are watched where a run can be restarted (Slurm, requeue on) unless turned off (0, off).

    Not in a container: the watchdog runs on the batch node, outside the image that has the job's python.
    """
    job, site, requeue = f.job, f.site, f.requeue
    in_container = job.container if job.container is not None else (site.container.enabled or bool(job.container_image))
    return requeue.enabled and hang_timeout(job, site) != 0 and not (in_container and site.container.runtime != "none")


def hang_timeout(job: JobSpec, site: SiteConfig) -> float | None:
    return job.hang_timeout if job.hang_timeout is not None else site.health.hang_timeout


def straggler_threshold(job: JobSpec, site: SiteConfig) -> float:
    return job.straggler_threshold if job.straggler_threshold is not None else site.health.straggler_threshold
