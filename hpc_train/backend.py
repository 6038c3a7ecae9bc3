"""The login-side half of a distributed backend: what it asks of Slurm and how it launches.

A backend plugin returns subclasses of :class:`Backend` from ``hpc_train_backends``. Nothing here
imports a framework; a backend's runtime half (``hpc_train.runtime``) imports its framework lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict


class Raw(str):
    """A shell word written verbatim: only for text a backend builds itself (``"${MASTER_ADDR}"``).

    Everything else that reaches a script is shell-quoted. User input must never be wrapped in Raw.
    """


Word = str | Raw


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class LaunchInfo:
    """What a backend needs to build its launch line; computed by the planner."""

    scheduler: Literal["slurm", "local"]
    nodes: int
    procs_per_node: int
    gpus_per_node: int
    python: str
    script: str
    script_args: tuple[str, ...]
    master_port: int
    job_folder: str
    env: dict[str, str] = field(default_factory=dict)


class Backend:
    """Subclass, set ``name``/``summary``, declare ``Options`` and override what differs."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    #: typed options (``--option key=value``, ``backend_options=``, site ``backends.<name>``); unknown keys rejected
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel) -> None:
        self.options = options

    def tasks_per_node(self, procs_per_node: int) -> int:
        """Slurm tasks per node. Launchers that fork their own workers (torchrun) want 1."""
        return procs_per_node

    def env(self, info: LaunchInfo) -> dict[str, str]:
        """Environment the backend needs, beneath the user's and the hooks' values."""
        return {}

    def launch(self, info: LaunchInfo) -> list[Word]:
        """argv that runs the script on every task (after ``srun ...`` on Slurm, alone locally)."""
        return [info.python, "-u", info.script, *info.script_args]
