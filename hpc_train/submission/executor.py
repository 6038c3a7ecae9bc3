"""Hand a plan to submitit: our rendered script becomes the submission file, submitit does the rest.

Two kinds of jobs share this path. Function jobs (``submit(fn, *args)``) are pickled by submitit and
run by its ``_submit`` entry point under srun. Script jobs (the CLI) run the backend's launch line.
The ``local`` site uses submitit's local executor: the same plan, on this machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError, FailedSubmissionError

from hpc_train import contract
from hpc_train.errors import SchedulerError, UsageError
from hpc_train.jobs.handle import JobHandle, JobRecord
from hpc_train.submission import slurm_cmd
from hpc_train.submission.job_plan import JobPlan

DEFAULT_LOCAL_TIMEOUT_MIN = 7 * 24 * 60


class TemplateSlurmExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor whose submission file is hpc_train's rendered template, queued held.

    The job's logs go into its own folder (``<job root>/%j/``), which submitit makes only once sbatch has
    said the job's id. On an idle cluster the job can start within milliseconds of sbatch, before that
    folder exists: Slurm cannot open the log, and the job fails at once without a line written (seen on
    the sandbox, 2 ms between submission and start). So sbatch queues it held; ``release`` lets it go once
    the folder is there. (A sweep's array makes its folders before sbatch: it is not held.)"""

    def __init__(self, folder: str, render: Callable[[str], str], python: str, hold: bool = False) -> None:
        super().__init__(folder, python=python)
        self._render, self._hold = render, hold

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._render(command)

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["sbatch", *(["--hold"] if self._hold else []), str(submission_file_path)]


def release(job: Any, slurm_conf: str | None) -> None:
    """Let a job queued held go, now that its folder exists (TemplateSlurmExecutor)."""
    Path(job.paths.folder).mkdir(parents=True, exist_ok=True)
    done = slurm_cmd.run(["scontrol", "release", str(job.job_id)], slurm_conf, timeout=30)
    if done.returncode != 0:
        raise SchedulerError(
            ["scontrol", "release", str(job.job_id)],
            f"job {job.job_id} is queued held and could not be released: {(done.stderr or done.stdout).strip()}",
            f"release it yourself: scontrol release {job.job_id} (or cancel it: scancel {job.job_id})",
        )


class LocalScript:
    """Runs a rendered script with bash inside a submitit local job (picklable)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self) -> int:
        env = submitit.JobEnvironment()
        folder = Path(env.paths.folder)
        script = folder / f"{env.job_id}_submission.sh"
        script.write_text(self.text)
        sys.stdout.flush()
        environ = {**os.environ, contract.ENV_JOB_FOLDER: str(folder)}
        # The script gets its own process group so a cancel or timeout reaches torchrun and its
        # workers too; submitit's local controller only signals this Python process.
        process = subprocess.Popen(["bash", str(script)], env=environ, start_new_session=True)

        def forward(signum: int, frame: Any) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM if signum == signal.SIGINT else signum)

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, forward)
        code = process.wait()
        if code != 0:
            raise RuntimeError(f"training script exited with status {code}")
        return code


class FunctionTask:
    """Sets the plan's environment, then calls the user's function (local function jobs)."""

    def __init__(self, fn: Callable[..., Any], env: dict[str, str]) -> None:
        self.fn = fn
        self.env = env

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.update(self.env)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getppid() % 2000))
        return self.fn(*args, **kwargs)


def login_slurm_conf(plan: JobPlan) -> str | None:
    """The SLURM_CONF the login side talks to for this plan: the site's, else this process's."""
    return os.path.expanduser(plan.site.slurm_conf) if plan.site.slurm_conf else os.environ.get("SLURM_CONF")


def submit_script(executor: Any, slurm_conf: str | None) -> Any:
    """Submit the executor's rendered script as it is. submitit has no public call for a job whose
    command is already in its script (ours: the backend's launch line in the template), so this is
    the one place its private ``_submit_command`` is used."""
    with slurm_cmd.slurm_conf_for_submitit(slurm_conf):
        return executor._submit_command("")


def submit_plan(
    plan: JobPlan,
    render: Callable[[JobPlan], str],
    fn: Callable[..., Any] | None = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
) -> JobHandle:
    kwargs = kwargs or {}
    if plan.scheduler == "local":
        job = _submit_local(plan, render, fn, args, kwargs)
    else:
        job = _submit_slurm(plan, render, fn, args, kwargs)
    record = JobRecord(
        job_id=str(job.job_id),
        folder=str(job.paths.folder),
        scheduler=plan.scheduler,
        kind=plan.kind,
        site=plan.site.name,
        backend=plan.backend_name,
        nodes=plan.nodes,
        procs_per_node=plan.procs_per_node,
        tasks_per_node=plan.tasks_per_node,
        job_name=plan.job_name,
        slurm_conf=login_slurm_conf(plan) if plan.scheduler == "slurm" else None,
        submitted_at=time.time(),
        release_held=plan.release_held and plan.requeue,
        requeue=plan.requeue,
        code=plan.code.as_record() if plan.code is not None else None,
    )
    record.save()
    return JobHandle(record, job)


def submit_with_code(plan: JobPlan, render: Callable[[JobPlan], str]) -> JobHandle:
    """submit_plan for a script job; a snapshot the plan took for it is undone when the scheduler refuses it."""
    from hpc_train.snapshot.take import discard, tidy

    try:
        handle = submit_plan(plan, render)
    except BaseException:
        discard(plan.code)
        raise
    tidy(plan.code, plan.site.snapshot.gc_above)
    return handle


def _make_job_root(plan: JobPlan) -> None:
    try:
        Path(plan.job_root).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the job folder root {plan.job_root}: {exc.strerror or exc}",
            hint="set job_root in the site file or --job-root to a writable, shared folder",
        ) from None


def _submit_slurm(plan: JobPlan, render: Callable[[JobPlan], str], fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for tool in ("sbatch", "srun", "sacct"):
        if shutil.which(tool) is None:
            raise SchedulerError(
                tool, f"{tool} not found on PATH", "run this on a login node of the cluster, or load its Slurm module"
            )

    def render_with(command: str) -> str:
        return render(dataclasses.replace(plan, function_command=command if plan.kind == "function" else None))

    _make_job_root(plan)
    held = "hold" not in plan.job.sbatch  # --sbatch hold: the user releases it
    executor = TemplateSlurmExecutor(plan.folder, render_with, python=plan.python, hold=held)
    params: dict[str, Any] = {"nodes": plan.nodes, "ntasks_per_node": plan.tasks_per_node}
    if plan.time_seconds:
        params["time"] = max(1, plan.time_seconds // 60)
    executor.update_parameters(**params)
    try:
        with _no_leftovers(Path(plan.job_root)), contextlib.redirect_stderr(io.StringIO()):
            # submitit prints sbatch's stderr before raising it: we say it once, in the error
            if plan.kind == "function":
                with slurm_cmd.slurm_conf_for_submitit(login_slurm_conf(plan)):
                    job = executor.submit(fn, *args, **kwargs)
            else:
                job = submit_script(executor, login_slurm_conf(plan))
    except FailedJobError as exc:
        raise SchedulerError(["sbatch", "<script>"], str(exc), _hint_for(str(exc))) from None
    except FailedSubmissionError as exc:
        raise SchedulerError(["sbatch", "<script>"], str(exc)) from None
    except FileNotFoundError as exc:
        raise SchedulerError("sbatch", str(exc)) from None
    if held:
        release(job, login_slurm_conf(plan))
    return job


# sbatch's words when it never reached the controller (as opposed to the controller refusing the job)
_UNREACHABLE = re.compile(r"unable to contact|socket timed out|connection refused|communication|slurm_persist_conn", re.I)


def _hint_for(message: str) -> str | None:
    return "is slurmctld up? `scontrol ping` tells" if _UNREACHABLE.search(message) else None


@contextlib.contextmanager
def _no_leftovers(job_root: Path) -> Iterator[None]:
    """A submission sbatch refused leaves nothing behind: submitit writes the script (and a function job's
    pickle) into the job root before it calls sbatch, and keeps them only once there is a job id."""
    before = set(os.listdir(job_root)) if job_root.is_dir() else set()
    try:
        yield
    except BaseException:
        for name in set(os.listdir(job_root)) - before if job_root.is_dir() else ():
            if _SUBMITIT_TEMPORARY.fullmatch(name):
                with contextlib.suppress(OSError):
                    (job_root / name).unlink()
        raise


_SUBMITIT_TEMPORARY = re.compile(r"\.submission_file_[0-9a-f]{32}\.sh|[0-9a-f]{32}\.pkl")


@contextlib.contextmanager
def _detached_stdio() -> Iterator[None]:
    """submitit's local controller inherits our stdout/stderr; a caller reading our output through a
    pipe (``$(hpc_train submit --parsable ...)``, subprocess) would then wait for the whole job.
    The job's output goes to its log files, so the controller gets /dev/null instead."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        yield
    finally:
        for fd, copy in zip((0, 1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(null)


def _submit_local(plan: JobPlan, render: Callable[[JobPlan], str], fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _make_job_root(plan)
    executor = submitit.LocalExecutor(plan.folder, python=plan.python)
    timeout_min = plan.time_seconds // 60 if plan.time_seconds else DEFAULT_LOCAL_TIMEOUT_MIN
    if plan.kind == "function":
        executor.update_parameters(timeout_min=timeout_min, tasks_per_node=plan.procs_per_node)
        env = {var.name: str(var.value) for var in plan.env}
        with _detached_stdio():
            return executor.submit(FunctionTask(fn, env), *args, **kwargs)
    executor.update_parameters(timeout_min=timeout_min, tasks_per_node=1)
    text = render(plan)
    with _detached_stdio():
        return executor.submit(LocalScript(text))
