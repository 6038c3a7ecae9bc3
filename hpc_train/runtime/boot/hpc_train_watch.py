"""Hang detection for scripts that never import hpc_train.runtime: their optimizer's steps are the heartbeat.

The watchdog (hpc_train.runtime.supervise.watchdog) judges progress by each rank's heartbeat file, which
``ctx.step()`` keeps. A plain torchrun or mpirun script has no ``ctx.step()``, but its optimizer steps: once
``import torch`` has finished, this starts the rank's heartbeat (0 steps: the watchdog's start-up allowance
for plain scripts) and registers a global step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``) that counts every step. Before its first
step a plain script is judged by its collectives (the watchdog looks twice at the flight recorder), so a
script that never steps an optimizer is ended only if its collectives stop. One that uses
hpc_train.runtime keeps its own heartbeat, which takes over from this one, and the hook stands down.

Loaded by the sitecustomize as ``hpc_train_watch`` (like hpc_train_nsys). The heartbeat is loaded without
hpc_train.runtime's ``__init__`` (see _heartbeat_class): that is the script's to run.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

from hpc_train import contract

TARGET = "torch.optim.optimizer"  # defines register_optimizer_step_post_hook
TORCH = "torch"  # the heartbeat starts once its import has finished


def install(environ: Mapping[str, str] = os.environ) -> bool:
    """In a rank's python (RANK set, by torchrun or the launch shim) of a job whose watchdog runs."""
    if not environ.get(contract.ENV_HEARTBEATS) or not environ.get("RANK", "").isdigit():
        return False
    watched = environ.get(contract.ENV_WATCHED_PID)
    if watched and watched != str(os.getpid()):
        return False  # a python the rank started, with the rank's environment: not the rank
    os.environ[contract.ENV_WATCHED_PID] = str(os.getpid())
    if TORCH in sys.modules:
        _register(int(environ["RANK"]))
    else:
        sys.meta_path.insert(0, _Finder(int(environ["RANK"])))
    return True


class _Finder(importlib.abc.MetaPathFinder):
    """Waits for torch's import to finish, then hooks it; asks nothing of any other import."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name != TORCH:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, rank = spec.loader, self.rank
        exec_module = loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            _register(rank)  # after torch's own import, which the heartbeat's imports must not re-enter

        loader.exec_module = run  # type: ignore[method-assign]  # this module's own loader instance
        return spec


def _register(rank: int) -> None:
    with contextlib.suppress(Exception):  # a torch without the hook: no watching, never a failed import
        steps = _Steps(rank)
        steps.handle = importlib.import_module(TARGET).register_optimizer_step_post_hook(steps)
        steps.start()


RUNTIME = "hpc_train.runtime"


def _heartbeat_class() -> Any:
    """hpc_train.runtime.lifecycle.heartbeat's Heartbeat, loaded without running hpc_train.runtime's ``__init__``.

    That ``__init__`` takes the launch's words (``--local_rank=N``) off ``sys.argv`` and drops their record,
    for the script that imports it. Run here, right after ``import torch``, it ran before the script's own
    import, which then found the package loaded and did nothing: a DeepSpeed job's script that imports
    hpc_train.runtime still got ``--local_rank=0`` as ``sys.argv[1]`` wherever a watchdog runs. So the
    heartbeat module (which imports only hpc_train.contract) is loaded under a bare stand-in for its
    package, which is then taken away: the script's import runs the real ``__init__``, which finds the
    heartbeat module already loaded (one Heartbeat class, shared with the script's Context).
    """
    if RUNTIME in sys.modules:  # the script's import of hpc_train.runtime is under way (it imported torch)
        return importlib.import_module(f"{RUNTIME}.lifecycle.heartbeat").Heartbeat
    spec = importlib.util.find_spec(RUNTIME)
    stand_in = types.ModuleType(RUNTIME)
    stand_in.__path__ = list(spec.submodule_search_locations or []) if spec else []
    sys.modules[RUNTIME] = stand_in
    try:
        return importlib.import_module(f"{RUNTIME}.lifecycle.heartbeat").Heartbeat
    finally:
        if sys.modules.get(RUNTIME) is stand_in:
            del sys.modules[RUNTIME]


class _Steps:
    """The global optimizer step post-hook, counting into the rank's plain heartbeat."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.beat: Any = None
        self.handle: Any = None
        self.heartbeat: Any = None  # the Heartbeat class: its ``current`` says whether a Context took over

    def start(self) -> None:
        Heartbeat = _heartbeat_class()
        self.heartbeat = Heartbeat
        self.beat = None if Heartbeat.current is not None else Heartbeat.from_env(self.rank, plain=True)
        if self.beat is None:  # hpc_train.runtime's own heartbeat counts the steps, or none can be written
            self.handle.remove()
            return
        atexit.register(self._finished)  # the watchdog stands down once every rank has ended

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.beat is None or self.heartbeat.current is not self.beat:  # the script's Context took over
            self.handle.remove()
            return
        self.beat.beat()

    def _finished(self) -> None:
        if self.heartbeat.current is self.beat:
            self.beat.finishing()
            self.beat.close()
