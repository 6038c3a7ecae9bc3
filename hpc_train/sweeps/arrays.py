"""Sweeps: one job over a grid (or a list) of overrides, submitted as Slurm job arrays.

Every task of a sweep runs the same script; the array index picks the task's overrides, which reach
the script twice: as arguments (``--lr 0.001``) and in the environment (``HPC_TRAIN_SWEEP_LR``, plus
all of them as JSON in ``HPC_TRAIN_SWEEP_OVERRIDES``). Each task has its own folder
``<sweep folder>/<task>/`` for its logs, checkpoints and requeue bookkeeping, so requeue works per task.

A sweep larger than the cluster's MaxArraySize becomes several arrays (read once per process from
``scontrol show config``); a ``%`` concurrency limit stays a limit on the whole sweep by starting
each further array after the one before it. The handle (hpc_train.sweeps.handle) treats them as one.
"""

from __future__ import annotations

import functools
import itertools
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train.errors import SchedulerError, UsageError
from hpc_train.plugin.backend import Raw
from hpc_train.submission import slurm_cmd
from hpc_train.sweeps.scripts import ArrayPart, ArrayScripts, Overrides, array_directives, env_name

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.plugin.manager import Plugins
    from hpc_train.submission.job_plan import JobPlan

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default when the configuration does not say
ARGS_WORD = Raw('"${hpc_train_sweep_args[@]}"')  # the task's overrides, after the user's script arguments
RESERVED_ENV = {contract.ENV_SWEEP_TASK, contract.ENV_SWEEP_FOLDER, contract.ENV_SWEEP_OVERRIDES}


# -- what to run -----------------------------------------------------------------------------
def _text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    raise UsageError(f"{where}: {value!r} is a {type(value).__name__}; sweep values are strings or numbers")


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not KEY.match(key):
        raise UsageError(
            f"{where}: {key!r} is not a usable override name",
            hint="names start with a letter or _ and hold letters, digits, _ . - (it becomes --NAME and an env var)",
        )
    return key


def expand(over: Mapping[str, Iterable[Any]] | Sequence[Mapping[str, Any]]) -> list[Overrides]:
    """The tasks of a sweep: a grid (``{"lr": [...], "seed": [...]}``, the last key varying fastest)
    or an explicit list of overrides (``[{"lr": 1e-3}, {"lr": 1e-4, "warmup": 100}]``)."""
    if isinstance(over, Mapping):
        keys = [_check_key(k, "over") for k in over]
        axes = []
        for key in keys:
            values = over[key]
            if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
                raise UsageError(
                    f"over[{key!r}]: expected a list of values, got {values!r}",
                    hint=f"over={{{key!r}: [{values!r}]}} for a single value",
                )
            values = [_text(v, f"over[{key!r}]") for v in values]
            if not values:
                raise UsageError(f"over[{key!r}] is empty: a grid with an empty axis has no tasks")
            axes.append(values)
        tasks = [dict(zip(keys, combo)) for combo in itertools.product(*axes)]
    else:
        tasks = []
        for i, item in enumerate(over):
            if not isinstance(item, Mapping):
                raise UsageError(f"over[{i}]: expected a mapping of overrides, got {item!r}")
            tasks.append({_check_key(k, f"over[{i}]"): _text(v, f"over[{i}][{k!r}]") for k, v in item.items()})
    if not tasks:
        raise UsageError("the sweep has no tasks", hint="over={'lr': [1e-4, 3e-4]} or over=[{'lr': 1e-4}, ...]")
    names: dict[str, str] = {}
    for key in {k for task in tasks for k in task}:
        if env_name(key) in RESERVED_ENV:
            raise UsageError(f"override {key!r} would set {env_name(key)}, which hpc_train sets itself; rename it")
        other = names.setdefault(env_name(key), key)
        if other != key:
            raise UsageError(f"overrides {other!r} and {key!r} would share the variable {env_name(key)}; rename one")
    return tasks


def parse_cli(items: Sequence[str]) -> dict[str, list[str]]:
    """``--sweep lr=1e-4,3e-4 --sweep seed=0,1,2`` → a grid (values stay as typed)."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--sweep {item!r}: expected NAME=V1,V2,...", hint="e.g. --sweep lr=1e-4,3e-4")
        if key in grid:
            raise UsageError(f"--sweep {key} is given twice; put all its values in one: --sweep {key}=V1,V2")
        grid[_check_key(key, f"--sweep {item}")] = [v for v in values.split(",")]
        if not values or any(v == "" for v in grid[key]):
            raise UsageError(f"--sweep {item!r}: an empty value", hint="values are separated by commas")
    return grid


# -- the cluster's limit ---------------------------------------------------------------------
@functools.cache
def _max_array_size(slurm_conf: str | None) -> int:
    cmd = ["scontrol", "show", "config"]
    out = slurm_cmd.run(cmd, slurm_conf, timeout=30)
    if out.returncode != 0:
        hint = {127: "run this on a login node of the cluster", 124: "is slurmctld up? `scontrol ping` tells"}.get(out.returncode)
        raise SchedulerError(cmd, out.stderr, hint)
    return parse_max_array_size(out.stdout)


def parse_max_array_size(config: str) -> int:
    """MaxArraySize from ``scontrol show config`` (Slurm's default when it is not there)."""
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.MULTILINE)
    return int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE


def max_array_size(slurm_conf: str | None = None) -> int:
    """The cluster's MaxArraySize: an array holds at most this many tasks (indices 0..N-1).
    Asked once per process and SLURM_CONF: sweeps must not cost the controller a call each."""
    size = _max_array_size(slurm_conf)
    if size < 1:
        raise UsageError("this cluster has job arrays switched off (MaxArraySize = 0); sweeps need them")
    return size


def split(tasks: Sequence[int], size: int) -> list[list[int]]:
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


# -- submission ------------------------------------------------------------------------------
def new_folder(job_root: str) -> Path:
    """A sweep's folder, made before anything is submitted (scripts and #SBATCH paths name it).
    Its name needs no look at what is already in job_root, so submitting stays as fast with
    thousands of old job folders there as with none."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(job_root) / f"sweep-{stamp}-{secrets.token_hex(3)}"


def sweep_plan(job: JobSpec, plugins: Plugins, code: Any = None) -> JobPlan:
    """The plan every array of the sweep shares, checked as ``render`` and ``submit`` check a job
    (prepare.checked_plan, in render's order), so a sweep fails as the single job would. One snapshot
    serves every task: ``code`` (a resubmission's), else one taken now."""
    from hpc_train.submission.plan import Additions
    from hpc_train.submission.prepare import check_script, checked_plan, code_for, site_for, warn_about

    resolved = site_for(job, plugins, training=True)
    check_script(job)
    take = (lambda _plan: code) if code is not None else code_for(submitting=True)
    if "array" in job.sbatch:
        raise UsageError(
            "--sbatch array=... conflicts with the sweep, which sets the array itself",
            hint="use --max-concurrent N for a concurrency limit",
        )
    plan = checked_plan(job, resolved, plugins, take, adds=Additions(script_args=(ARGS_WORD,)))
    warn_about(plan)
    if plan.scheduler != "slurm":
        raise UsageError(
            f"site {plan.site.name!r} runs jobs on this machine; sweeps are Slurm job arrays",
            hint="submit the sweep to a Slurm site (--site NAME)",
        )
    return plan


class _Script:
    """The text submitit writes as the submission file: one executor serves every array."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, _command: str) -> str:
        return self.text  # the array's script is rendered already; submitit's command is in it


def submit_arrays(
    plan: JobPlan,
    render: Callable[[JobPlan], str],
    folder: Path,
    overrides: list[Overrides],
    tasks: Sequence[int],
    limit: int | None,
) -> list[dict[str, Any]]:
    """Submit ``tasks`` of the sweep as as few arrays as MaxArraySize allows; returns
    ``[{"job_id": ..., "tasks": [...]}, ...]`` in submission order."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from hpc_train.submission.executor import (
        TemplateSlurmExecutor,
        login_slurm_conf,
        submit_script,
    )

    # Slurm makes no folders: #SBATCH --output needs this one; each task makes its own (ArrayPart.lines)
    (folder / "slurm").mkdir(parents=True, exist_ok=True)
    arrays: list[dict[str, Any]] = []
    previous: str | None = None
    slurm_conf = login_slurm_conf(plan)
    chunks = split(list(tasks), max_array_size(slurm_conf))
    scripts = ArrayScripts(plan, render, len(chunks))
    script = _Script()
    executor = TemplateSlurmExecutor(str(folder / "slurm"), script, python=plan.python)
    for chunk in chunks:
        part = ArrayPart(str(folder), chunk, overrides)
        # each array's dependency names only the array before it
        script.text = scripts.script(part, array_directives(plan, part, limit, previous if limit else None))
        try:
            job = submit_script(executor, slurm_conf)
        except FailedJobError as exc:
            raise SchedulerError(["sbatch", "<array script>"], str(exc), "is slurmctld up? `scontrol ping` tells") from None
        except (FailedSubmissionError, FileNotFoundError) as exc:
            raise SchedulerError(["sbatch", "<array script>"], str(exc)) from None
        previous = str(job.job_id)
        arrays.append({"job_id": previous, "tasks": chunk})
    return arrays
