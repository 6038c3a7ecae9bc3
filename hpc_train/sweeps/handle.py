"""A submitted sweep: its tasks' states from ONE scheduler call per poll cycle, whatever its size.

Per-job polling (a ``scontrol``/``sacct`` call per task) is what floods a controller when a sweep has
hundreds of tasks. Here a cycle asks ``squeue`` once about every array that still has unfinished
tasks (``-r`` lists each task on its own line); only tasks the controller has already forgotten
(finished longer ago than MinJobAge) are asked of ``sacct``, once, for all of them. Finished tasks
are remembered and never asked about again, and the wait between cycles grows while nothing changes.

The record (``<state dir>/sweeps/<id>.json`` and ``<sweep folder>/sweep.json``) lets any later
process find the sweep by its id: the job id of its first array.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.errors import UsageError
from hpc_train.jobs.handle import save_record, state_dir
from hpc_train.jobs.poll import LAST_RUN_FILE, RUNS_FILE, EndRule
from hpc_train.jobs.states import ACTIVE_STATES, FINAL_OK, RELEASE_MARGIN_S
from hpc_train.submission import slurm_cmd

TASK_ID = re.compile(r"^(?P<array>\d+)_(?:(?P<index>\d+)|\[(?P<ranges>[^\]]*)\])$")


@dataclass
class SweepRecord:
    """What a later process needs to poll, show and resubmit a sweep."""

    sweep_id: str
    folder: str
    site: str
    backend: str
    job_name: str
    nodes: int
    procs_per_node: int
    tasks_per_node: int
    overrides: list[dict[str, str]]
    arrays: list[dict[str, Any]]  # [{"job_id": "123", "tasks": [sweep task of index 0, of index 1, ...]}, ...]
    job: dict[str, Any] = field(default_factory=dict)  # the JobSpec, for resubmitting
    slurm_conf: str | None = None
    submitted_at: float = 0.0
    requeue: bool = False
    release_held: bool = False
    max_concurrent: int | None = None
    code: dict[str, Any] | None = None  # the snapshot every task runs, a resubmitted one too (hpc_train.snapshot.code)

    @staticmethod
    def path_for(sweep_id: str) -> Path:
        return state_dir() / "sweeps" / f"{sweep_id}.json"

    def save(self) -> None:
        text = json.dumps(asdict(self), indent=1)  # key order kept: it is the order of the task's arguments
        save_record(text, Path(self.folder) / "sweep.json", self.path_for(self.sweep_id))

    @classmethod
    def exists(cls, sweep_id: str) -> bool:
        return str(sweep_id).isdigit() and cls.path_for(str(sweep_id)).is_file()

    @classmethod
    def load(cls, sweep_id: str) -> SweepRecord:
        path = cls.path_for(str(sweep_id))
        if not cls.exists(sweep_id):
            raise UsageError(
                f"no sweep {sweep_id!r} submitted through hpc_train on this machine",
                hint=f"sweep records live in {path.parent}; a sweep's id is its first array's job id",
            )
        data = json.loads(path.read_text())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def dependency_ids(self) -> list[str]:
        """What a job waiting for this sweep waits for: its arrays, but only the latest attempt of a
        resubmitted task (its failed first attempt would make ``afterok`` unmeetable)."""
        current = set(self.latest().values())
        ids: list[str] = []
        for array in self.arrays:
            job_id = str(array["job_id"])
            mine = [(job_id, i) for i in range(len(array["tasks"]))]
            live = [f"{a}_{i}" for a, i in mine if (a, i) in current]
            ids += [job_id] if len(live) == len(mine) else live
        return ids

    def latest(self) -> dict[int, tuple[str, int]]:
        """Each task's latest attempt: (array job id, array index); a resubmission supersedes."""
        where: dict[int, tuple[str, int]] = {}
        for array in self.arrays:
            for index, task in enumerate(array["tasks"]):
                where[int(task)] = (str(array["job_id"]), index)
        return where


def expand_after(after: Any) -> list[str]:
    """Job ids for ``after=``: handles become their ids, a sweep (handle or id) all its arrays."""
    if after is None:
        return []
    items = [after] if isinstance(after, (str, int)) or hasattr(after, "job_id") or hasattr(after, "record") else list(after)
    ids: list[str] = []
    for item in items:
        if isinstance(item, SweepHandle):
            ids += item.record.dependency_ids()
        elif hasattr(item, "job_id"):
            ids.append(str(item.job_id))
        else:
            for word in str(item).replace(":", ",").split(","):
                word = word.strip()
                if word and SweepRecord.exists(word):
                    ids += SweepRecord.load(word).dependency_ids()
                elif word:
                    ids.append(word)
    return list(dict.fromkeys(ids))


def _expand_ranges(ranges: str) -> list[int]:
    out: list[int] = []
    for part in ranges.split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            out += list(range(int(low), int(high or low) + 1))
    return out


def parse_states(text: str) -> dict[tuple[str, int], tuple[str, str]]:
    """``JOBID|STATE|REASON`` lines (squeue -r, or sacct -P) → {(array id, index): (state, reason)}."""
    states: dict[tuple[str, int], tuple[str, str]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 2:
            continue
        match = TASK_ID.match(fields[0])
        if not match:
            continue  # a plain job, or a step (123_4.batch)
        state = fields[1].split()[0] if fields[1].strip() else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED
        reason = fields[2] if len(fields) > 2 else ""
        indices = [int(match["index"])] if match["index"] is not None else _expand_ranges(match["ranges"])
        for index in indices:
            states[(match["array"], index)] = (state, reason)
    return states


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


class SweepHandle:
    """States, counts, failed tasks, waiting and resubmission for a whole sweep."""

    def __init__(self, record: SweepRecord, runner: Runner | None = None) -> None:
        self.record = record
        self._run: Runner = runner or (lambda cmd: slurm_cmd.run(cmd, record.slurm_conf))
        self._seen: dict[int, tuple[str, str]] = {}  # task -> (state, reason) from the last cycle
        self._final: dict[int, str] = {}  # tasks that have ended for good
        self._end_rules: dict[int, EndRule] = {}  # per task: is an ended-looking state final (hpc_train.jobs.poll)
        self._held_since: dict[int, float] = {}
        self.calls = 0  # squeue/sacct calls made by this handle
        self.cycles = 0

    @classmethod
    def from_id(cls, sweep_id: str) -> SweepHandle:
        return cls(SweepRecord.load(str(sweep_id)))

    def __repr__(self) -> str:
        return f"SweepHandle({self.sweep_id!r}, tasks={len(self)}, arrays={self.array_ids})"

    def __len__(self) -> int:
        return len(self.record.overrides)

    @property
    def sweep_id(self) -> str:
        return self.record.sweep_id

    @property
    def job_id(self) -> str:
        return self.record.sweep_id

    @property
    def array_ids(self) -> list[str]:
        return [str(a["job_id"]) for a in self.record.arrays]

    @property
    def folder(self) -> Path:
        return Path(self.record.folder)

    def task_folder(self, task: int) -> Path:
        return self.folder / str(task)

    def log_path(self, task: int, srun_task: int = 0, stream: str = "stdout") -> Path:
        return self.task_folder(task) / f"{srun_task}_log.{'out' if stream == 'stdout' else 'err'}"

    def overrides(self, task: int) -> dict[str, str]:
        return dict(self.record.overrides[task])

    # -- polling ---------------------------------------------------------------------------
    def poll(self) -> dict[int, str]:
        """One cycle: one squeue call for all unfinished tasks (plus one sacct call only for tasks
        the controller no longer knows). Returns every task's state."""
        latest = self.record.latest()
        open_tasks = {t: where for t, where in latest.items() if t not in self._final}
        if open_tasks:
            self.cycles += 1
            arrays = sorted({a for a, _ in open_tasks.values()}, key=int)
            out = self._call(["squeue", "-h", "-r", "--states=all", "-j", ",".join(arrays), "-o", "%i|%T|%r"])
            seen = parse_states(out.stdout) if out.returncode == 0 else {}
            missing = [where for where in open_tasks.values() if where not in seen]
            if missing:
                ids = sorted({a for a, _ in missing}, key=int)
                acct = self._call(["sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o", "JobID,State,Reason"])
                if acct.returncode == 0:
                    seen.update({k: v for k, v in parse_states(acct.stdout).items() if k in missing})
            now = time.monotonic()
            for task, where in open_tasks.items():
                state, reason = seen.get(where, ("UNKNOWN", ""))
                self._seen[task] = (state, reason)
                self._settle(task, state, now)
            self._release_held(now)
        return self.states()

    def _call(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls += 1
        return self._run(cmd)

    def _settle(self, task: int, state: str, now: float) -> None:
        rule = self._end_rules.setdefault(task, EndRule(self.record.requeue))
        if rule.final(state, self.task_folder(task), now):
            self._final[task] = state

    def _confirm_in(self) -> float | None:
        """Seconds until the soonest ended-looking task could be believed; None when none waits."""
        now = time.monotonic()
        waits = [
            w for t, rule in self._end_rules.items() if t not in self._final for w in (rule.confirm_in(now),) if w is not None
        ]
        return min(waits) if waits else None

    def _release_held(self, now: float) -> None:
        """Requeued tasks wait ~2 minutes (BeginTime); start them sooner where the site allows it,
        once the hold has lasted a few seconds (see JobHandle.release_if_held)."""
        if not self.record.release_held:
            return
        latest = self.record.latest()
        for task, (state, reason) in self._seen.items():
            if task in self._final or state != "PENDING" or reason != "BeginTime":
                self._held_since.pop(task, None)
                continue
            since = self._held_since.setdefault(task, now)
            if now - since >= RELEASE_MARGIN_S:
                array, index = latest[task]
                self._run(["scontrol", "update", f"JobId={array}_{index}", "StartTime=now"])
                self._held_since.pop(task, None)

    def states(self) -> dict[int, str]:
        return {task: self._final.get(task) or self._seen.get(task, ("UNKNOWN", ""))[0] for task in range(len(self))}

    def counts(self, poll: bool = True) -> dict[str, int]:
        """How many tasks are in each state (PENDING, RUNNING, COMPLETED, FAILED, ...)."""
        states = self.poll() if poll else self.states()
        return dict(sorted(Counter(states.values()).items()))

    def done(self) -> bool:
        self.poll()
        return len(self._final) == len(self)

    def failed(self, poll: bool = True, confirm: bool = True) -> list[int]:
        """Tasks that ended other than COMPLETED (FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...).

        ``confirm``: only ends seen twice (a self-requeueing task looks ended for a moment), which
        may cost one more poll a couple of seconds later; without it, what the last poll saw."""
        if poll:
            self.poll()
            wait = self._confirm_in() if confirm else None
            if wait is not None:
                time.sleep(wait)
                self.poll()
        if confirm:
            return sorted(t for t, state in self._final.items() if state not in FINAL_OK)
        return sorted(
            t for t, state in self.states().items() if state not in ACTIVE_STATES and state not in FINAL_OK and state != "UNKNOWN"
        )

    def wait(self, poll_s: float = 1.0, max_poll_s: float = 30.0, timeout_s: float | None = None) -> dict[str, int]:
        """Block until every task has ended; return the counts per state. The wait between polls
        grows by half while nothing changes, up to ``max_poll_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = poll_s
        before: dict[int, str] = {}
        while True:
            states = self.poll()
            if len(self._final) == len(self):
                return dict(sorted(Counter(states.values()).items()))
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.sweep_id} unfinished after {timeout_s} s: {self.counts(poll=False)}")
            delay = poll_s if states != before else min(max_poll_s, delay * 1.5)
            before = states
            # a task that looked ended is confirmed soon; don't back off past that
            confirm = self._confirm_in()
            time.sleep(delay if confirm is None else max(min(delay, confirm), 0.5))

    # -- control -----------------------------------------------------------------------------
    def cancel(self) -> None:
        cmd = ["scancel", *self.array_ids]
        out = self._run(cmd)
        if out.returncode != 0:
            from hpc_train.errors import SchedulerError

            raise SchedulerError(cmd, out.stderr)

    def stored_code(self) -> Any:
        """The snapshot the sweep was submitted with, which its resubmitted tasks run too; None without one.
        Raises UsageError when it is gone (collected once no task of the sweep was queued any more)."""
        from hpc_train.snapshot.code import Code

        code = Code.from_record(self.record.code)
        if code is not None and not os.path.isdir(code.tree):
            raise UsageError(
                f"sweep {self.sweep_id} ran the snapshot {code.digest} of {code.project}, which is gone from {code.tree}",
                hint="submit the sweep again (a new snapshot of the project as it is now), or restore that snapshot",
            )
        return code

    def resubmit(self, tasks: Iterable[int] | None = None, plugins: Any = None) -> list[str]:
        """Submit again the failed tasks (or ``tasks``), in the same task folders, so they resume from
        their checkpoints; returns the new arrays' job ids."""
        from hpc_train.config.job import JobSpec
        from hpc_train.config.validate import validate
        from hpc_train.plugin.manager import default_plugins
        from hpc_train.submission.prepare import render_plan
        from hpc_train.sweeps.arrays import submit_arrays, sweep_plan

        chosen = sorted(set(tasks)) if tasks is not None else self.failed()
        if not chosen:
            raise UsageError(
                f"sweep {self.sweep_id} has no failed tasks to resubmit", hint=f"its tasks: {self.counts(poll=False)}"
            )
        bad = [t for t in chosen if not 0 <= t < len(self)]
        if bad:
            raise UsageError(f"sweep {self.sweep_id} has tasks 0..{len(self) - 1}; no task {bad[0]}")
        plugins = plugins or default_plugins()
        job = validate(JobSpec, self.record.job)
        plan = sweep_plan(job, plugins, code=self.stored_code())
        for task in chosen:  # a new attempt gets a fresh restart budget, and no word from the old one's runs
            for name in (RUNS_FILE, LAST_RUN_FILE, contract.RETRIES):
                (self.task_folder(task) / name).unlink(missing_ok=True)
        arrays = submit_arrays(
            plan, lambda p: render_plan(p, plugins), self.folder, self.record.overrides, chosen, self.record.max_concurrent
        )
        self.record.arrays += arrays
        self.record.save()
        for task in chosen:
            self._final.pop(task, None)
            self._end_rules.pop(task, None)
            self._seen.pop(task, None)
        return [a["job_id"] for a in arrays]
