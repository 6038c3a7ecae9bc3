"""Under ``--profile nsys``: the chosen ranks' python runs under ``nsys profile``, one report per rank.

Each backend starts its ranks its own way: torchrun forks workers with its own python, srun and mpirun run
the launch shim (hpc_train.runtime.launch.worker) which becomes the script's python, DeepSpeed's local run nests
the shim under torchrun, a plugin's backend may run ``python script`` itself. Under all of them the rank's
python runs the job's sitecustomize (this folder, first on PYTHONPATH) before the script, so that is where
the wrapping happens, the launch lines untouched: the python that runs the job's script
(``HPC_TRAIN_PROFILE_SCRIPT``) on a chosen rank replaces itself by ``nsys profile ... <its own command
line>``. nsys starts it again as its child, marked (``HPC_TRAIN_NSYS_WRAPPED``): it, and every process it
starts, then run as they are. The capture range is CUDA's profiler API, which hpc_train.runtime.observe.profiling
opens and closes on the spec's steps, so the report holds those steps only.

A module of its own, loaded by the sitecustomize as ``hpc_train_nsys``: importing ``hpc_train.runtime``
this early would take the launch's added arguments off ``sys.argv`` (hpc_train.runtime.launch.argv) in
processes whose script never imports it. It reads the rank from the launcher's variables itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import MutableMapping, Sequence

from hpc_train import contract
from hpc_train.config.profile_spec import parse, run_folder

# the rank as the script's python sees it: torchrun's workers and hpc_train's launch shim set RANK; a
# backend that runs the script itself has only its launcher's
RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)
# stop when CUDA's profiler API says so, and let the process run on: nsys's default ends the process there
OPTIONS = ("--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--force-overwrite=true")


def rank_and_world(environ: MutableMapping[str, str]) -> tuple[int, int] | None:
    for rank, size in RANK_VARIABLES:
        if environ.get(rank, "").isdigit() and environ.get(size, "").isdigit():
            return int(environ[rank]), int(environ[size])
    return None


def runs_the_script(environ: MutableMapping[str, str], argv0: str) -> bool:
    """Whether this python runs the job's script (not a launcher, the shim, or a tool beside it)."""
    script = environ.get(contract.ENV_PROFILE_SCRIPT)
    return bool(script) and not argv0.startswith("-") and os.path.realpath(argv0) == os.path.realpath(script or "")


def command(environ: MutableMapping[str, str], rank: int, argv: Sequence[str], executable: str) -> list[str]:
    """``nsys profile ... -o <job>/profile/run-R/rank-N python <this process's arguments>``."""
    nsys = environ.get(contract.ENV_NSYS) or "nsys"
    output = run_folder(environ) / f"rank-{rank}"
    return [nsys, "profile", *OPTIONS, f"--output={output}", executable, *argv[1:]]


def adopt_launch_record(environ: MutableMapping[str, str], wrapped_pid: int, pid: int) -> None:
    """The launch shim's record of the arguments it added names the process it became (hpc_train.runtime.launch.argv:
    ``{"pid": N, "args": [...]}``); under nsys the script runs in nsys's child, which takes the record over."""
    raw = environ.get(contract.ENV_LAUNCH_ADDED_ARGS)
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return
    if isinstance(record, dict) and record.get("pid") == wrapped_pid != pid:
        environ[contract.ENV_LAUNCH_ADDED_ARGS] = json.dumps({**record, "pid": pid})


def main(environ: MutableMapping[str, str] | None = None) -> None:
    """From sitecustomize, when the job profiles with nsys: become nsys here if this is a chosen rank's script."""
    env = os.environ if environ is None else environ
    wrapped = env.get(contract.ENV_NSYS_WRAPPED)
    if wrapped:  # nsys's child, or a process it started: run as it is
        if wrapped.isdigit():
            adopt_launch_record(env, int(wrapped), os.getpid())
        return
    place = rank_and_world(env)
    if not runs_the_script(env, sys.argv[0] if sys.argv else "") or place is None:
        return
    rank, world = place
    if rank not in parse(env.get(contract.ENV_PROFILE, "")).chosen(world):
        return
    argv = command(env, rank, sys.orig_argv, sys.executable)
    run_folder(env).mkdir(parents=True, exist_ok=True)
    env[contract.ENV_NSYS_WRAPPED] = str(os.getpid())
    stop = env.get(contract.ENV_STOP_SIGNAL, "").upper().removeprefix("SIG")
    if stop and stop not in ("TERM", "INT", "KILL") and hasattr(signal, f"SIG{stop}"):
        # as for a launcher (hpc_train.runtime.launch.signal_guard): nsys must outlive the stop signal; the
        # runtime in its child installs its own handler for it
        signal.signal(getattr(signal, f"SIG{stop}"), signal.SIG_IGN)
    print(f"hpc_train profile: rank {rank} runs under {argv[0]}: {' '.join(argv[1:7])} ...", file=sys.stderr, flush=True)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:  # training goes on without the report rather than not at all
        del env[contract.ENV_NSYS_WRAPPED]
        print(f"hpc_train profile: rank {rank}: cannot run {argv[0]!r} ({exc}); this rank runs without nsys", file=sys.stderr)
