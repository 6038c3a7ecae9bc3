"""torch imported with Python's cyclic garbage collector paused, in every Python of a job (loaded by the
sitecustomize beside this file; it imports nothing of hpc_train's).

Importing ``torch``, then ``torch._dynamo`` (the first optimizer and DDP import it), makes ~300,000 objects that
live as long as the process. The collector, which runs as objects are made, walked them again and again while
they were being made: 0.8-0.9 s of the ~3 s of CPU a rank takes to import both (torch 2.13, Python 3.11, this
project's 2-core machine; ``bench/rank_start.py``). Paused, each import ends with one collection (the import's
own garbage is freed, not kept) and a freeze (``gc.freeze``): what the import made leaves the collector's
generations, so the collections of the training loop do not walk it either, and a forked data-loader worker
does not copy its pages by touching it. Any other module imports as it always did.

``HPC_TRAIN_FREEZE_TORCH=0`` in the job's environment leaves the collector as Python runs it.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

PAUSED_FOR = frozenset({"torch", "torch._dynamo"})


class _PausedImport:
    """A finder first on ``sys.meta_path`` that finds nothing itself: for the modules of ``PAUSED_FOR`` it asks
    the finders after it and has the loader they return run the module with the collector paused."""

    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> ModuleSpec | None:
        if name not in PAUSED_FOR:
            return None
        spec = next((s for s in (_ask(f, name, path, target) for f in sys.meta_path if f is not self) if s), None)
        loader = spec.loader if spec is not None else None
        if loader is not None and not isinstance(loader, type) and hasattr(loader, "exec_module"):
            # an attribute of this one loader object (FileFinder makes one per module), never of a class (a
            # builtin or frozen module's loader is its class: patching it would pause every such import)
            loader.exec_module = _paused(loader.exec_module, self)  # type: ignore[method-assign,assignment]
        return spec


def _ask(finder: Any, name: str, path: Any, target: ModuleType | None) -> ModuleSpec | None:
    find = getattr(finder, "find_spec", None)
    return find(name, path, target) if find is not None else None


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector paused for the block, then one collection and a freeze of what is left (what the block made
    that lives on). Inside another pause, or where the script paused the collector itself, it stays paused: the
    outer one ends it (or the script does)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.collect()
            gc.freeze()
            gc.enable()


def _paused(exec_module: Callable[[ModuleType], None], finder: _PausedImport) -> Callable[[ModuleType], None]:
    def run(module: ModuleType) -> None:
        try:
            with paused():
                exec_module(module)
        finally:
            if sys.modules.keys() >= PAUSED_FOR and finder in sys.meta_path:
                sys.meta_path.remove(finder)  # nothing left to pause for: later imports do not ask it

    return run


def install() -> None:
    """From sitecustomize: the next imports of torch and torch._dynamo run with the collector paused."""
    if not sys.modules.keys() >= PAUSED_FOR:
        sys.meta_path.insert(0, _PausedImport())
