"""What the parts the Context builds read of it, as protocols. The checkpointer, its node-local tier, the
reshaper and the parallel layouts name ``ContextView`` (and the reshaper ``CheckpointerView``) instead of
importing the Context that imports them: no circle of files, type annotations included
(tests/unit/test_structure.py). The Context is a ``ContextView``; mypy checks it where it hands itself over.

May import, when imported: nothing of hpc_train's (the types its protocols name, for type checkers only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from hpc_train.runtime.data import DistributedLoader
    from hpc_train.runtime.engine.backend import BackendRuntime
    from hpc_train.runtime.engine.parallel_state import ParallelState
    from hpc_train.runtime.launch.environment import DistEnv
    from hpc_train.runtime.options import RuntimeOptions


class ContextView(Protocol):
    """The Context as the checkpointer, the tier, the reshaper and the layouts use it."""

    backend: str
    runtime: BackendRuntime
    options: RuntimeOptions
    env: DistEnv
    loaders: list[DistributedLoader]  # ctx.loader's, in order: a checkpoint records their global batch
    restored_shape: dict[str, Any] | None  # the shape of the checkpoint restore() loaded

    @property
    def rank(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def local_world_size(self) -> int: ...
    @property
    def node_rank(self) -> int: ...
    @property
    def is_main(self) -> bool: ...
    @property
    def device(self) -> Any: ...
    @property
    def parallel(self) -> ParallelState | None: ...
    @property
    def mesh(self) -> Any: ...

    def step(self) -> bool: ...

    def end_run(self, code: int) -> NoReturn: ...


class CheckpointerView(Protocol):
    """The checkpointer as the reshaper uses it when a run resumes at another shape."""

    ctx: ContextView
    folder: Path
    run: int
    no_retry_file: str | None

    def complete(self) -> list[tuple[int, Path]]: ...

    def loads(self, path: Path, marker: str = ...) -> str | None: ...
