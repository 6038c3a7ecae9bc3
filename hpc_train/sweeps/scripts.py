"""One array's script of a sweep: its task lines, its #SBATCH options, and every array's script from
one render (ArrayScripts).

The array index picks a task (``case "${SLURM_ARRAY_TASK_ID}"``); the task's overrides reach the script
as arguments and as ``HPC_TRAIN_SWEEP_<NAME>`` variables, and its folder is ``<sweep folder>/<task>/``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train.submission.shell import join, quote, sbatch_line

if TYPE_CHECKING:
    from hpc_train.submission.job_plan import JobPlan

ENV_PREFIX = contract.ENV_SWEEP_PREFIX
Overrides = dict[str, str]


def env_name(key: str) -> str:
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", key).upper()


@dataclass
class ArrayPart:
    """One array of a sweep, as its script sees it: array index i runs sweep task ``tasks[i]``."""

    folder: str  # the sweep's folder; task t works in <folder>/<t>
    tasks: list[int]
    overrides: list[Overrides]  # the whole sweep's, by task
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lines = self._lines()

    def _lines(self) -> list[str]:
        task_var, folder_var, job_var = contract.ENV_SWEEP_TASK, contract.ENV_SWEEP_FOLDER, contract.ENV_JOB_FOLDER
        lines = [
            f"# sweep task {self.tasks[0]}..{self.tasks[-1]} of {len(self.overrides)}: the array index picks one; its overrides",
            f"# reach the script as arguments and as {ENV_PREFIX}* (all of them as JSON in {contract.ENV_SWEEP_OVERRIDES})",
            'case "${SLURM_ARRAY_TASK_ID}" in',
        ]
        for index, task in enumerate(self.tasks):
            values = self.overrides[task]
            args = [word for key, value in values.items() for word in (f"--{key}", value)]
            env = [f"{env_name(k)}={quote(v)}" for k, v in values.items()]
            env.append(f"{contract.ENV_SWEEP_OVERRIDES}={quote(json.dumps(values, sort_keys=False))}")
            lines.append(f"    {index}) {task_var}={task}; hpc_train_sweep_args=({join(args)}); export {' '.join(env)} ;;")
        lines += [
            '    *) echo "hpc_train: array index ${SLURM_ARRAY_TASK_ID} is not part of this sweep" >&2; exit 1 ;;',
            "esac",
            f"export {task_var} {folder_var}={quote(self.folder)}",
            f'export {job_var}="${{{folder_var}}}/${{{task_var}}}"',
            f'mkdir -p "${{{job_var}}}"',
            "# srun names its logs by array id and index only: a link leads them into the task's folder",
            f'ln -sfn "../${{{task_var}}}" "${{{folder_var}}}/slurm/${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"',
        ]
        return lines


def array_directives(plan: JobPlan, part: ArrayPart, limit: int | None, after_array: str | None) -> list[tuple[str, Any]]:
    """The plan's #SBATCH options for one array: its index range and limit, logs in the sweep folder,
    and (for a concurrency-limited sweep split in several arrays) a start after the previous array."""
    directives = dict(plan.directives)
    n = len(part.tasks)
    directives["array"] = f"0-{n - 1}" + (f"%{limit}" if limit and limit < n else "")
    # the batch shell's own messages; each task's processes write to their task folder (srun --output)
    directives["output"] = os.path.join(part.folder, "slurm", "%A_%a.out")
    directives["error"] = os.path.join(part.folder, "slurm", "%A_%a.err")
    if after_array:
        own = directives.get("dependency")
        directives["dependency"] = f"{own},afterany:{after_array}" if own else f"afterany:{after_array}"
        directives.setdefault("kill-on-invalid-dep", "yes")
    return sorted(directives.items())


_VARYING = ("array", "dependency")  # the directives that differ between a sweep's arrays


class ArrayScripts:
    """Every array's script of one sweep, rendered once per sweep rather than once per array.

    Arrays differ only in their task lines (ArrayPart.lines) and their ``--array``/``--dependency``
    values. A skeleton rendered with markers in those places, and filled per array, made a 10,000-task
    sweep's 1,250 arrays cost one render instead of 1,250 (6.5 ms each, most of a sweep's own time).
    A site template may use the sweep's values some other way: the first array of each set of
    directives is also rendered in full and compared, and a template whose skeleton does not give that
    same script is rendered per array, as before."""

    def __init__(self, plan: JobPlan, render: Callable[[JobPlan], str], arrays: int) -> None:
        self._plan, self._render = plan, render
        self._skeletons: dict[tuple[str, ...], str | None] = {}
        self._reuse = arrays > 1  # a lone array needs no skeleton: one render either way
        token = secrets.token_hex(6)
        self._line_mark = f"# hpc_train sweep lines {token}"
        self._value_mark = {key: f"hpc-train-{key}-{token}" for key in _VARYING}

    def script(self, part: ArrayPart, directives: list[tuple[str, Any]]) -> str:
        keys = tuple(key for key, _ in directives)
        if keys not in self._skeletons:
            text = self._full(part, directives)
            self._skeletons[keys] = self._skeleton(part, directives, text) if self._reuse else None
            return text
        skeleton = self._skeletons[keys]
        return self._full(part, directives) if skeleton is None else self._fill(skeleton, part, directives)

    def _full(self, part: ArrayPart, directives: list[tuple[str, Any]]) -> str:
        return self._render(dataclasses.replace(self._plan, sweep=part, directives=directives))

    def _skeleton(self, part: ArrayPart, directives: list[tuple[str, Any]], text: str) -> str | None:
        """The script with markers, or None where filling it does not give ``text`` (the full render)."""
        probe = copy.copy(part)
        probe.tasks, probe.lines = [-1], [self._line_mark]  # a template that reads the tasks shows -1: no match
        marked = [(key, self._value_mark.get(key, value)) for key, value in directives]
        skeleton = self._full(probe, marked)
        marks = [self._line_mark, *(sbatch_line(key, self._value_mark[key]) for key, _ in directives if key in _VARYING)]
        if any(skeleton.count(mark) != 1 for mark in marks):
            return None
        return skeleton if self._fill(skeleton, part, directives) == text else None

    def _fill(self, skeleton: str, part: ArrayPart, directives: list[tuple[str, Any]]) -> str:
        text = skeleton.replace(self._line_mark, "\n".join(part.lines))
        for key, value in directives:
            if key in _VARYING:
                text = text.replace(sbatch_line(key, self._value_mark[key]), sbatch_line(key, value))
        return text
