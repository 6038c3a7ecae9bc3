"""The job folder's file names: one home for what the batch script, the runtime and the login side
write and read there. A typo in one of them used to fail silently (a poll reading a file nobody
writes); the template gets them from here (``files.RUNS``), Python imports them.

Imported by both sides: it imports nothing.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

RUNS = "runs"  # the run counter: the batch script adds one at the start of every run
LAST_RUN = "last_run"  # "RUN STATUS requeued|ended", written by the batch script as each run ends
CHECKPOINTS = "checkpoints"  # HPC_TRAIN_CHECKPOINT_DIR: step-N/ folders with a COMMIT marker
COMMIT = "COMMIT"  # in a step-N/ folder: written last, so the checkpoint is complete
LOCAL_NEWEST = "local_newest.json"  # in CHECKPOINTS: the newest step committed on node-local storage
LOCAL_TIER_ID = "local_tier_id.json"  # in CHECKPOINTS: names the job's node-local folders (job ids recycle)
STOP_REQUESTED = "stop_requested"  # HPC_TRAIN_STOP_FILE: the batch shell got the scheduler's warning
REQUEUE_REQUESTED = "requeue_requested"  # HPC_TRAIN_REQUEUED_FILE: rank 0 requeued; Slurm ends the run
NO_RETRY = "no_retry"  # HPC_TRAIN_NO_RETRY_FILE: why --on-failure requeue must not retry this run
METRICS = "metrics"  # the metrics folder (steps.jsonl, TensorBoard events, the Prometheus textfile)
STEPS = "steps.jsonl"  # one JSON line per optimizer step, in METRICS
RECORD = "hpc_train.json"  # the job's record (hpc_train.jobs.handle.JobRecord)
HEARTBEATS = "heartbeats"  # rank-N.json: each rank's last step and when (hpc_train.runtime.lifecycle.heartbeat)
DUMPS = "dumps"  # run-R/rank-N.txt: every thread's stack, written when the watchdog asks
HANGS = "hangs.jsonl"  # one line per hang the watchdog declared: who was behind, where, how long
HANG_RUN = "hang_run"  # the run the watchdog ended (its number): the batch script retries it
SUSPECT_NODES = "suspect_nodes.jsonl"  # nodes a hang or crash points at, and why; requeues avoid them
EXCLUDE_NODES = "exclude_nodes"  # the ExcNodeList the failure path sets after it requeues (comma-separated)
RUN_START_STEP = "run_start_step"  # "RUN STEP": the newest committed checkpoint when the run began
RETRIES = "retries.jsonl"  # one line per run end that decided a retry: retried or not, why (hpc_train.runtime.supervise.retries)
STRAGGLERS = "stragglers.jsonl"  # one line per rank named slower than the others (hpc_train.runtime.observe.straggler)
NODE_CHECKS = "node_checks.jsonl"  # one line per node and run: its check at start-up (hpc_train.runtime.supervise.node_check)
PROFILE = "profile"  # run-R/rank-N.*.pt.trace.json (torch.profiler) or run-R/rank-N.nsys-rep: --profile

# RETRIES' "reason" keys, which the batch script and rank 0 write and hpc_train.jobs.retry_decision explains:
# a retried run's ("failed", "stopped": the time limit), then the reasons a run was not retried
RETRY_REASONS = ("failed", "stopped", "no_progress", "no_retry", "restart_budget", "on_failure", "requeue_failed")

# The variables between the two sides: the plan (hpc_train.submission.plan) exports some, the batch
# script (templates/sbatch/base.sh.j2) sets others as the job runs; the runtime reads them.

# the job's identity and folders
ENV_JOB_FOLDER = "HPC_TRAIN_JOB_FOLDER"  # the job's folder (job_root/JOBID, a sweep's task folder): the script sets it
ENV_RUN = "HPC_TRAIN_RUN"  # this run's number, 1 + the restarts before it: the script counts it in RUNS
ENV_BACKEND = "HPC_TRAIN_BACKEND"  # the backend's name: the plan exports it, rt.init() picks its runtime by it
ENV_NODES = "HPC_TRAIN_NODES"  # nodes a run uses (spares not counted): plan; the watchdog and health read it
ENV_PROCS_PER_NODE = "HPC_TRAIN_PROCS_PER_NODE"  # processes per node: plan; the watchdog's world size
ENV_STEP_NODES = "HPC_TRAIN_STEP_NODES"  # with spare nodes: the run's nodes (health nodes), srun's --nodelist
ENV_PARALLEL = "HPC_TRAIN_PARALLEL"  # the --parallel layout (dp=2,tp=2): plan; hpc_train.runtime.engine.parallel
ENV_LAUNCHER = "HPC_TRAIN_LAUNCHER"  # who started the ranks (torchrun, srun, ...): set beside RANK & co. (runtime.environment)
ENV_LAUNCH_ADDED_ARGS = "HPC_TRAIN_LAUNCH_ADDED_ARGS"  # JSON: the arguments the launch put first (runtime.argv)

# stopping and requeueing
ENV_STOP_FILE = "HPC_TRAIN_STOP_FILE"  # STOP_REQUESTED's path: the script touches it on the warning signal
ENV_REQUEUED_FILE = "HPC_TRAIN_REQUEUED_FILE"  # REQUEUE_REQUESTED's path: rank 0 or the script, once requeued
ENV_NO_RETRY_FILE = "HPC_TRAIN_NO_RETRY_FILE"  # NO_RETRY's path: rank 0 and health write why not to retry
ENV_MAX_RESTARTS = "HPC_TRAIN_MAX_RESTARTS"  # the restart budget: the script exports it; checkpoints read it
ENV_DEADLINE = "HPC_TRAIN_DEADLINE"  # epoch seconds to stop by (limit - grace): the script; the stop watcher
ENV_STOP_SIGNAL = "HPC_TRAIN_STOP_SIGNAL"  # the site's warning signal (USR2): plan; the ranks trap it too

# checkpoints
ENV_CHECKPOINT_DIR = "HPC_TRAIN_CHECKPOINT_DIR"  # the job folder's CHECKPOINTS: the script sets it
ENV_CHECKPOINT_EVERY = "HPC_TRAIN_CHECKPOINT_EVERY"  # save every N steps ("0": only when asked to stop): plan
ENV_KEEP_CHECKPOINTS = "HPC_TRAIN_KEEP_CHECKPOINTS"  # committed checkpoints kept: plan
ENV_ASYNC_CHECKPOINT = "HPC_TRAIN_ASYNC_CHECKPOINT"  # "1": write checkpoints in the background: plan
ENV_RESTART_FROM_SCRATCH = "HPC_TRAIN_RESTART_FROM_SCRATCH"  # "1": set old checkpoints aside, start at step 0: plan
ENV_LOCAL_CHECKPOINT_DIR = "HPC_TRAIN_LOCAL_CHECKPOINT_DIR"  # the site's node-local folder, unexpanded: plan
ENV_RESUME_FROM = "HPC_TRAIN_RESUME_FROM"  # --resume-from: the absolute checkpoint folder of the job resumed: plan

# metrics
ENV_METRICS = "HPC_TRAIN_METRICS"  # "0" turns per-step metrics off (submit --no-metrics): plan
ENV_METRICS_DIR = "HPC_TRAIN_METRICS_DIR"  # where metrics go instead of the job folder's METRICS: the user
ENV_METRICS_FLUSH_S = "HPC_TRAIN_METRICS_FLUSH_S"  # seconds between metric file flushes: the user or site env
ENV_PROMETHEUS_DIR = "HPC_TRAIN_PROMETHEUS_DIR"  # a node-exporter textfile folder: the site's env
ENV_STRAGGLER_THRESHOLD = "HPC_TRAIN_STRAGGLER_THRESHOLD"  # fraction slower than the median: 0.2 = 20 %: plan
ENV_STRAGGLER_WINDOW = "HPC_TRAIN_STRAGGLER_WINDOW"  # steps per comparison window

# the watchdog
ENV_HANG_TIMEOUT = "HPC_TRAIN_HANG_TIMEOUT"  # seconds without a step before a hang; "0" turns detection off: plan
ENV_HEARTBEATS = "HPC_TRAIN_HEARTBEATS"  # set when a watchdog runs: the folder the ranks beat into (the script)
# set by a plain rank's boot to its own pid: a python it starts (a compile worker, a spawned data loader)
# inherits RANK too, and must not beat as that rank (runtime/boot/hpc_train_watch)
ENV_WATCHED_PID = "HPC_TRAIN_WATCHED_PID"
ENV_EXCLUDE_SUSPECTS = "HPC_TRAIN_EXCLUDE_SUSPECTS"  # "1": a requeue after a hang or crash avoids its node: plan

# every Python of the job (runtime/boot): "0" leaves Python's collector running while torch imports, and
# freezes nothing (runtime/boot/hpc_train_gc): the user or site env
ENV_FREEZE_TORCH = "HPC_TRAIN_FREEZE_TORCH"

# sweeps: each task's overrides, set by the array's case lines (hpc_train.sweeps.scripts)
ENV_SWEEP_PREFIX = "HPC_TRAIN_SWEEP_"  # + an override's name in upper case: HPC_TRAIN_SWEEP_LR
ENV_SWEEP_OVERRIDES = "HPC_TRAIN_SWEEP_OVERRIDES"  # JSON: all of the task's overrides
ENV_SWEEP_TASK = "HPC_TRAIN_SWEEP_TASK"  # the task's number in the sweep (its folder's name)
ENV_SWEEP_FOLDER = "HPC_TRAIN_SWEEP_FOLDER"  # the sweep's folder, the tasks' folders inside

# the user's shell, login side only
ENV_STATE_DIR = "HPC_TRAIN_STATE_DIR"  # where job records are indexed (default: the XDG state folder)
ENV_SITE_PATH = "HPC_TRAIN_SITE_PATH"  # folders searched first for site files (os.pathsep-separated)
ENV_NO_REMOTE = "HPC_TRAIN_NO_REMOTE"  # "1": run here, whatever remote.host says (a login node running --remote's calls)
ENV_SSH_CONFIG = "HPC_TRAIN_SSH_CONFIG"  # an ssh config file for --remote (ssh -F), instead of ~/.ssh/config
ENV_SUBMIT_KEY = "HPC_TRAIN_SUBMIT_KEY"  # a remote submit's idempotency key (hpc_train.remote.serve)
ENV_NO_CACHE = "HPC_TRAIN_NO_CACHE"  # "1": build site configs and resources again, cache nothing
ENV_DISABLE_PLUGINS = "HPC_TRAIN_DISABLE_PLUGINS"  # plugin entry points to switch off, comma-separated
ENV_UPDATE_GOLDEN = "HPC_TRAIN_UPDATE_GOLDEN"  # "1": hpc_train.testing rewrites golden files instead of comparing

# job options: the plan exports each from its JobSpec field (``setting(env=...)``); hpc_train.runtime.options
# reads them back in the job, where they win over the script's rt.init(...) defaults
ENV_PRECISION = "HPC_TRAIN_PRECISION"  # --precision: fp32, bf16 or fp16
ENV_GRAD_CLIP = "HPC_TRAIN_GRAD_CLIP"  # --grad-clip: the gradient norm to clip to (a float)
ENV_GRAD_ACCUM = "HPC_TRAIN_GRAD_ACCUM"  # --grad-accum: micro-batches per optimizer step
ENV_MICRO_BATCH = "HPC_TRAIN_MICRO_BATCH"  # --micro-batch: "auto" or samples per micro-batch (runtime.memory)
ENV_COMM_HOOK = "HPC_TRAIN_COMM_HOOK"  # --comm-hook: DDP gradient compression (none, fp16, bf16, powersgd)
ENV_ACTIVATION_CHECKPOINTING = "HPC_TRAIN_ACTIVATION_CHECKPOINTING"  # "1": recompute activations in backward
ENV_EXACT_RESUME = "HPC_TRAIN_EXACT_RESUME"  # "0"/"1": fixed DDP gradient buckets (bit-identical resumes)
ENV_PROFILE = "HPC_TRAIN_PROFILE"  # --profile: torch or nsys, its steps and ranks (hpc_train.config.profile_spec)
ENV_NSYS = "HPC_TRAIN_NSYS"  # with --profile nsys: nsys on the compute nodes (the site's tools.nsys): plan
ENV_PROFILE_SCRIPT = "HPC_TRAIN_PROFILE_SCRIPT"  # with --profile nsys: the script whose python nsys runs: plan
ENV_NSYS_WRAPPED = "HPC_TRAIN_NSYS_WRAPPED"  # set by hpc_train.runtime.nsys_exec: this process tree is under nsys
ENV_MAX_BAD_STEPS = "HPC_TRAIN_MAX_BAD_STEPS"  # --max-bad-steps: non-finite steps in a row before stop/rollback
ENV_ON_DIVERGENCE = "HPC_TRAIN_ON_DIVERGENCE"  # --on-divergence: stop or rollback after them
ENV_BACKEND_OPTIONS = "HPC_TRAIN_BACKEND_OPTIONS"  # JSON: the backend's options, site defaults under the job's
ENV_SITE = "HPC_TRAIN_SITE"  # the site's name, as the plan resolved it
ENV_CODE = "HPC_TRAIN_CODE"  # the snapshot the script runs from (hpc_train.snapshot): the project as submitted; plan
ENV_JOB_ROOT = "HPC_TRAIN_JOB_ROOT"  # the folder the job folders are made in (--job-root, the site's job_root)


def storage_dir_env(key: str) -> str:
    """The variable of a site ``storage`` folder, which the plan exports: scratch → HPC_TRAIN_SCRATCH_DIR."""
    return f"HPC_TRAIN_{key.upper()}_DIR"


#: the names as the template sees them: ``{{ files.RUNS }}``
FILES = SimpleNamespace(
    **{
        name: value
        for name, value in globals().items()
        if name.isupper() and isinstance(value, str) and not name.startswith("ENV_")
    }
)


def committed(folder: Path) -> list[tuple[int, Path]]:
    """The committed ``step-N`` checkpoints in ``folder``, newest first: the one rule the runtime's restore, the
    batch script's health check, ``--resume-from`` and ``report`` follow (no torch: the login side asks too)."""
    found = []
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.startswith("step-") and "." not in path.name and (path / COMMIT).is_file():
                try:
                    found.append((int(path.name[5:]), path))
                except ValueError:
                    continue
    return sorted(found, reverse=True)


def newest_step(folder: Path) -> int:
    """The newest step committed anywhere: in ``folder``, or on node-local storage (its record there); -1: none."""
    import json  # only here: the module imports nothing

    found = committed(folder)
    shared = found[0][0] if found else -1
    try:
        local = int(json.loads((folder / LOCAL_NEWEST).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        local = -1
    return max(shared, local)
