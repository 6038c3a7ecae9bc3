"""Run by Python at start-up in every process of an hpc_train job (the batch script puts this folder
first on PYTHONPATH), including scripts that never import hpc_train.

torch 2.13's gloo worker threads free a finished collective's work a moment after the caller has its
result; freeing takes the GIL; once the interpreter is finalizing, a thread taking the GIL is ended
inside a C++ destructor: std::terminate, SIGABRT, a finished run reported FAILED. ``ctx.shutdown()``
drains them for scripts that use hpc_train.runtime (runtime/engine/backend.py); this does the same for plain
torchrun/mpirun scripts: at exit, if torch.distributed was used, it lets go of the GIL for a moment
while the interpreter is still intact. Registered first, so it runs after the script's own atexit
handlers. Then the next sitecustomize on the path, if any, runs as it would have without us.

Ranks run ``python -u`` (their lines reach the log as they are printed), and ``-u`` writes a print's
text and its newline in two writes: the ranks of a node share one log file, and their lines came out
joined ("rank 1 ...rank 0 ...", then two empty lines). Here a rank's stdout and stderr keep ``-u``'s
promptness but write each line whole: line buffering, not write-through.

First, under ``--profile nsys``, the python of a chosen rank's script replaces itself by nsys running
it (hpc_train_nsys.py beside this file): the one place every backend's ranks pass through. Then torch, when
it is imported, imports with the garbage collector paused and is frozen after (hpc_train_gc.py): a third of
a rank's start-up was the collector walking torch's objects while they were being made.
"""

import atexit
import importlib
import io
import os
import sys
import time
import types

DRAIN_S = 0.2  # as hpc_train.runtime.engine.backend.WORKER_DRAIN_S (measured there: 0/30 aborts, was 3-7/20)


def _drain() -> None:
    if "torch.distributed" in sys.modules:
        time.sleep(DRAIN_S)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":  # the next one exists and failed: say so, as site.py would
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)
    except Exception as exc:
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules and ours is not None:
            sys.modules["sitecustomize"] = ours


def _contract() -> types.ModuleType | None:
    """hpc_train.contract's names without importing hpc_train (20 ms in every Python of every job): the
    contract, which imports nothing, loaded from its file; None if it is not there."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "contract.py")
    spec = importlib.util.spec_from_file_location("_hpc_train_contract", path)
    if spec is None or spec.loader is None:
        return None
    contract = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(contract)
    except OSError:
        return None
    return contract


def _whole_lines() -> None:
    for stream in (sys.stdout, sys.stderr):
        # write-through is what -u (or PYTHONUNBUFFERED) sets; a buffered stream writes whole lines already
        if isinstance(stream, io.TextIOWrapper) and stream.write_through:
            stream.reconfigure(line_buffering=True, write_through=False)


def _profile_with_nsys(contract: types.ModuleType) -> None:
    """Under ``--profile nsys`` a chosen rank's python becomes ``nsys profile ... python ...`` here (hpc_train_nsys)."""
    if not os.environ.get(contract.ENV_PROFILE, "").startswith("nsys"):
        return
    try:
        import hpc_train_nsys  # beside this file
    except ImportError:  # a python of the job's without hpc_train (a tool's): not a rank's
        return
    hpc_train_nsys.main()


def _pause_gc_for_torch(contract: types.ModuleType) -> None:
    """torch's import with the collector paused, then frozen (hpc_train_gc.py beside this file)."""
    if os.environ.get(contract.ENV_FREEZE_TORCH) == "0":
        return
    try:
        import hpc_train_gc  # beside this file
    except ImportError:  # a python of the job's without hpc_train (a tool's)
        return
    hpc_train_gc.install()


def _watch_plain_scripts(contract: types.ModuleType) -> None:
    """A plain script's optimizer steps become its rank's heartbeat, where the watchdog runs (hpc_train_watch)."""
    if not os.environ.get(contract.ENV_HEARTBEATS) or not os.environ.get("RANK", "").isdigit():
        return  # not a rank of a watched job: nothing more is imported
    try:
        import hpc_train_watch  # beside this file
    except ImportError:  # a python of the job's without hpc_train (a tool's): not a rank's
        return
    hpc_train_watch.install()


# torch.distributed's flight recorder under both the names torch has used (submission/plan_env.py sets both,
# not knowing the job's torch); a torch that knows the new one warns about the old in every rank's log
OLD_RECORDER, NEW_RECORDER = "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"
WARNS_OF_OLD = (2, 13)  # the oldest torch seen to read the new name and warn of the old (it may be older)


def _torch_version() -> tuple[int, int] | None:
    """The installed torch's (major, minor), read from its version.py: importing torch here costs a second."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            found = re.search(r"__version__\s*=\s*['\"](\d+)\.(\d+)", f.read())
    except (OSError, ValueError, ImportError):
        return None
    return (int(found.group(1)), int(found.group(2))) if found else None


def _one_recorder_name() -> None:
    old = os.environ.get(OLD_RECORDER)
    if old and old == os.environ.get(NEW_RECORDER) and (_torch_version() or (0, 0)) >= WARNS_OF_OLD:
        del os.environ[OLD_RECORDER]


_whole_lines()
_one_recorder_name()
_CONTRACT = _contract()
if _CONTRACT is not None:
    _profile_with_nsys(_CONTRACT)
    _watch_plain_scripts(_CONTRACT)
    # last, so first on sys.meta_path: it pauses the collector around the watch's own hook on torch too; and
    # before the next sitecustomize, which may import torch
    _pause_gc_for_torch(_CONTRACT)
atexit.register(_drain)
_chain()
