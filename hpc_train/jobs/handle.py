"""A submitted job, from the submitting process or from a later one (``status``, ``logs``, ``cancel``).

submitit owns the lifecycle (ids, sacct state, log paths, results, cancel); the handle adds what
hpc_train knows on top: which rank's log is which, the job's exit status, and a record on disk so a
later process can find the job by id alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_train import contract, scontrol
from hpc_train.errors import SchedulerError, UsageError
from hpc_train.jobs.poll import JobPoller, runs_started
from hpc_train.jobs.retry_decision import Story, story
from hpc_train.jobs.states import (
    ACTIVE_STATES,
    FINAL_OK,
    PENDING_STATES,
    RELEASE_MARGIN_S,
    held_after_requeue,
)
from hpc_train.submission import slurm_cmd

__all__ = ["ACTIVE_STATES", "FINAL_OK", "PENDING_STATES", "RELEASE_MARGIN_S", "JobHandle", "JobRecord", "held_after_requeue"]


def state_dir() -> Path:
    base = os.environ.get(contract.ENV_STATE_DIR)
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "hpc_train"


@dataclass
class JobRecord:
    """What a later process needs to find and read a job; saved as JSON in two places."""

    job_id: str
    folder: str
    scheduler: str
    kind: str
    site: str
    backend: str
    nodes: int
    procs_per_node: int
    tasks_per_node: int
    job_name: str
    slurm_conf: str | None = None
    submitted_at: float = 0.0
    release_held: bool = False
    requeue: bool = False
    code: dict[str, Any] | None = None  # the snapshot the script runs and where it came from (hpc_train.snapshot.code)

    @property
    def num_tasks(self) -> int:
        return self.nodes * self.tasks_per_node

    def save(self) -> None:
        save_record(
            json.dumps(asdict(self), indent=2, sort_keys=True),
            Path(self.folder) / "hpc_train.json",
            state_dir() / "jobs" / f"{self.job_id}.json",
        )

    @classmethod
    def load(cls, job_id: str) -> JobRecord:
        path = state_dir() / "jobs" / f"{job_id}.json"
        if not job_id.replace("_", "").isdigit() or not path.is_file():
            raise UsageError(
                f"no job {job_id!r} submitted through hpc_train on this machine",
                hint=f"job records live in {path.parent}; use squeue/sacct for jobs submitted otherwise",
            )
        data = json.loads(path.read_text())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def save_record(text: str, in_folder: Path, in_index: Path) -> None:
    """A record beside the job's files and in this machine's index, so later processes find it by id."""
    for path in (in_folder, in_index):
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, text)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class JobHandle:
    """State, logs, waiting, cancelling and (for function jobs) the result of one job."""

    def __init__(self, record: JobRecord, job: Any = None) -> None:
        self.record = record
        self._job = job  # a submitit Job when we submitted it in this process
        self._held_since: float | None = None  # when release_if_held first saw the requeue hold

    # -- identity ----------------------------------------------------------------------
    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def folder(self) -> Path:
        return Path(self.record.folder)

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r}, site={self.record.site!r}, backend={self.record.backend!r})"

    @classmethod
    def from_id(cls, job_id: str) -> JobHandle:
        return cls(JobRecord.load(str(job_id)))

    @property
    def submitit_job(self) -> Any:
        if self._job is None:
            if self.record.scheduler == "local":
                from submitit.local.local import LocalJob

                self._job = LocalJob(self.record.folder, self.job_id, tasks=list(range(self.record.num_tasks)))
            else:
                from submitit.slurm.slurm import SlurmJob

                self._job = SlurmJob(self.record.folder, self.job_id, tasks=list(range(self.record.num_tasks)))
        return self._job

    def _slurm(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return slurm_cmd.run(list(cmd), self.record.slurm_conf, timeout=timeout)

    # -- state -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """Slurm's state name (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)."""
        if self.record.scheduler == "local":
            return self._local_state()
        # The controller knows the state now; accounting (sacct, submitit's watcher) can lag by
        # seconds, and is the only source once the controller has forgotten a finished job.
        state = self._controller_info().get("JobState")
        if state is None:
            try:
                state = self.accounting().get("State") or "UNKNOWN"
            except SchedulerError:
                state = "UNKNOWN"
        return state

    def scheduler_info(self) -> dict[str, str]:
        """The controller's fields for the job (JobState, Reason, NodeList, RunTime, ...); {} when unknown."""
        return {} if self.record.scheduler == "local" else self._controller_info()

    def _controller_info(self) -> dict[str, str]:
        """``scontrol show job``'s fields, or {} once the controller no longer knows the job."""
        out = self._slurm("scontrol", "show", "job", "-o", self.job_id, timeout=20)
        return scontrol.first(out.stdout) if out.returncode == 0 else {}

    def _local_state(self) -> str:
        job = self.submitit_job
        process = getattr(job, "_process", None)
        running = process.poll() is None if process is not None else _pid_alive(int(self.job_id))
        result = Path(self.record.folder) / f"{self.job_id}_0_result.pkl"
        if (Path(self.record.folder) / f"{self.job_id}_cancelled").exists() and not running:
            return "CANCELLED"
        if result.exists():
            from submitit.core.utils import pickle_load

            try:
                outcome, _ = pickle_load(result)
            except Exception:
                return "FAILED"
            return "COMPLETED" if outcome == "success" else "FAILED"
        if running:
            return "RUNNING"
        if process is not None and process.returncode is not None and process.returncode < 0:
            return "CANCELLED"
        return "FAILED"

    def done(self) -> bool:
        return self.state not in ACTIVE_STATES

    @property
    def runs(self) -> int:
        """How many times the job has started (1 + its requeues), counted by the job itself."""
        return runs_started(self.folder)

    def story(self, state: str | None = None) -> Story:
        """How often the job was retried and from which steps, and why its last run was not retried
        (hpc_train.jobs.retry_decision); ``state``: the state just read, to spare the controller a query."""
        return story(self.folder, state or self.state, self.record.requeue)

    @property
    def why(self) -> str | None:
        """One line: the job's retries (how many, from which step) and why it was not retried again; None
        when there is nothing to say (one run, still running or completed, or no record of why)."""
        return self.story().why

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.record.folder) / contract.CHECKPOINTS

    def release_if_held(self, info: dict[str, str] | None = None) -> bool:
        """A requeued job waits ~2 minutes (BeginTime); start it sooner where the site allows it.

        Not at once: Slurm holds requeued jobs because each node revokes the old run's credential, and a
        credential issued in the same second is refused ("Job credential revoked") and the job FAILS.
        Releasing once the hold has lasted a few seconds avoids that; call this from a polling loop
        (``info``: the controller's fields the caller just read, to spare a second query).
        """
        if not self.record.release_held or self.record.scheduler != "slurm":
            return False
        if not held_after_requeue(self._controller_info() if info is None else info):
            self._held_since = None
            return False
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since < RELEASE_MARGIN_S:
            return False
        self._held_since = None
        out = self._slurm("scontrol", "update", f"JobId={self.job_id}", "StartTime=now")
        return out.returncode == 0

    def wait(self, poll_s: float = 1.0, timeout_s: float | None = None) -> str:
        """Block until the job ends (through its requeues); return its final state."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        poller = JobPoller(self, poll_s)
        while True:
            look = poller.look()
            if look.final:
                return look.state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id} still {look.state} after {timeout_s} s")
            poller.pause()

    def accounting(self) -> dict[str, str]:
        """sacct's view of the job allocation (State, ExitCode, Elapsed, NodeList, Start, End)."""
        if self.record.scheduler == "local":
            return {"State": self.state}
        cmd = ["sacct", "-j", self.job_id, "-X", "-n", "-P", "-o", "JobID,State,ExitCode,Elapsed,NodeList,Start,End"]
        out = self._slurm(*cmd)
        if out.returncode != 0:
            hint = {127: "install the Slurm client tools", 124: "is slurmdbd reachable?"}.get(out.returncode)
            raise SchedulerError(cmd, out.stderr, hint)
        names = ["JobID", "State", "ExitCode", "Elapsed", "NodeList", "Start", "End"]
        for line in out.stdout.splitlines():
            fields = dict(zip(names, line.split("|")))
            if fields.get("JobID") == self.job_id:
                fields["State"] = (fields.get("State") or "UNKNOWN").split()[0]  # "CANCELLED by 0"
                return fields
        return {}

    def exit_code(self) -> int:
        """0 when the job completed, else the job's exit code (1 when the scheduler gives none)."""
        state = self.state
        if state in FINAL_OK:
            return 0
        if self.record.scheduler == "slurm":
            code = self._controller_info().get("ExitCode") or self.accounting().get("ExitCode", "")
            rc = code.split(":")[0]
            if rc.isdigit() and int(rc) != 0:
                return int(rc)
        return 1

    # -- logs --------------------------------------------------------------------------
    def task_of_rank(self, rank: int) -> int:
        world = self.record.nodes * self.record.procs_per_node
        if not 0 <= rank < world:
            raise UsageError(f"rank {rank} is out of range: job {self.job_id} has ranks 0..{world - 1}")
        per_task = max(1, self.record.procs_per_node // max(1, self.record.tasks_per_node))
        return rank // per_task

    def log_path(self, rank: int = 0, stream: str = "stdout") -> Path:
        suffix = "out" if stream == "stdout" else "err"
        task = self.task_of_rank(rank)
        return Path(self.record.folder) / f"{self.job_id}_{task}_log.{suffix}"

    def stdout(self, rank: int = 0) -> str | None:
        path = self.log_path(rank, "stdout")
        return path.read_text(errors="replace") if path.exists() else None

    def stderr(self, rank: int = 0) -> str | None:
        path = self.log_path(rank, "stderr")
        return path.read_text(errors="replace") if path.exists() else None

    # -- control -----------------------------------------------------------------------
    def cancel(self) -> None:
        if self.record.scheduler == "local":
            job = self.submitit_job
            (Path(self.record.folder) / f"{self.job_id}_cancelled").touch()
            if getattr(job, "_process", None) is not None:
                job.cancel()
            elif _pid_alive(int(self.job_id)):
                _interrupt(int(self.job_id))
            return
        cmd = ["scancel", self.job_id]
        out = self._slurm(*cmd)
        if out.returncode != 0:
            raise SchedulerError(cmd, out.stderr)

    def result(self) -> Any:
        """Rank 0's return value (function jobs); waits for the job and raises if it failed."""
        return self.results()[0]

    def results(self) -> list[Any]:
        """Every task's return value, in task order (function jobs)."""
        if self.record.kind != "function":
            raise UsageError(f"job {self.job_id} runs a script; it has logs and an exit status, not a result")
        # submitit's wait and result reads run sacct with the process's environment: this job's cluster's
        with slurm_cmd.slurm_conf_for_submitit(self.record.slurm_conf):
            return list(self.submitit_job.results())


def _interrupt(pid: int, grace_s: float = 2.0) -> None:
    """SIGINT, as submitit's own cancel sends; then SIGTERM, which submitit's local controller forwards
    too: a job started from a shell without job control (``nohup ... &``, CI) inherits SIGINT ignored."""
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours still answers kill(0); look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
