"""One API for every backend: the training script talks to a Context, never to the framework."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

from hpc_train import contract
from hpc_train.runtime.checkpoint import reshape
from hpc_train.runtime.checkpoint.manager import Checkpointer
from hpc_train.runtime.data import DistributedLoader, batches
from hpc_train.runtime.engine.backend import BackendRuntime, apply_activation_checkpointing
from hpc_train.runtime.engine.parallel import ParallelState, with_layout
from hpc_train.runtime.launch.environment import DistEnv, detect
from hpc_train.runtime.lifecycle.heartbeat import Heartbeat
from hpc_train.runtime.observe.metrics import recorder_for
from hpc_train.runtime.observe.profiling import profiler_for
from hpc_train.runtime.options import RuntimeOptions
from hpc_train.runtime.step.memory import MicroBatcher, rank_peaks
from hpc_train.runtime.step.numerics import NumericsGuard


class Context:
    """Where this process stands (rank, world, device) and how it trains (prepare, backward, step)."""

    def __init__(self, env: DistEnv, backend: str, runtime: BackendRuntime, *, metrics: bool = True) -> None:
        self.env = env
        self.backend = backend
        self.runtime = runtime
        self.options = runtime.options
        # per-step metrics (hpc_train.runtime.observe.metrics); None when off (HPC_TRAIN_METRICS=0)
        self.metrics = runtime.metrics = recorder_for(backend, runtime, default=metrics)
        self._checkpointers: list[Checkpointer] = []  # closed by shutdown(): their threads end with the job
        # ctx.loader's loaders, in order: checkpoints record their global batch, a resume keeps it (runtime.resume)
        self.loaders: list[DistributedLoader] = []
        self.restored_shape: dict[str, Any] | None = None  # the shape of the checkpoint restore() loaded
        # non-finite losses and gradients skip the step on every rank (hpc_train.runtime.step.numerics)
        self.numerics = runtime.numerics = NumericsGuard.for_runtime(runtime)
        # progress for the job's watchdog (hang detection); None unless the batch script runs one
        self.heartbeat = Heartbeat.from_env(env.rank)
        # --micro-batch: loader batches split and accumulated, halved after an OOM (hpc_train.runtime.step.memory)
        self.memory = MicroBatcher.for_runtime(runtime, self.metrics)
        # --profile on this rank: torch.profiler or nsys over chosen steps (hpc_train.runtime.observe.profiling); else None
        self.profiler = profiler_for(runtime)
        self._shut_down = False

    # -- identity ----------------------------------------------------------------------------
    rank = property(lambda self: self.env.rank)
    local_rank = property(lambda self: self.env.local_rank)
    world_size = property(lambda self: self.env.world_size)
    local_world_size = property(lambda self: self.env.local_world_size)
    node_rank = property(lambda self: self.env.node_rank)
    num_nodes = property(lambda self: self.env.num_nodes)
    launcher = property(lambda self: self.env.launcher)

    @property
    def device(self) -> Any:
        return self.runtime.device

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def __repr__(self) -> str:
        return (
            f"Context(backend={self.backend!r}, rank={self.rank}, local_rank={self.local_rank}, "
            f"world_size={self.world_size}, node_rank={self.node_rank}, device={self.device})"
        )

    # -- training ----------------------------------------------------------------------------
    def prepare(
        self, model: Any, optimizer: Any = None, *, activation_checkpointing: bool | tuple[type, ...] | None = None
    ) -> tuple[Any, Any]:
        """Move and wrap the model (DDP, DeepSpeed engine, Horovod, MPI averaging) and its optimizer."""
        checkpointing = self.options.activation_checkpointing if activation_checkpointing is None else activation_checkpointing
        if checkpointing:
            apply_activation_checkpointing(model, checkpointing if isinstance(checkpointing, tuple) else None)
        model, optimizer = self.runtime.prepare(model, optimizer)
        if self.memory is not None:
            self.memory.watch(model)
        if self.metrics is not None:
            self.metrics.watch(model)
        if self.profiler is not None:
            self.profiler.watch(model, self.runtime)
        if self.heartbeat is not None:
            # an evaluation pass makes no optimizer step but is not a hang (on the unwrapped model too)
            heartbeat = self.heartbeat
            for module in {id(m): m for m in (model, self.runtime.unwrap(model))}.values():
                if hasattr(module, "register_forward_pre_hook"):
                    module.register_forward_pre_hook(lambda *_: heartbeat.alive())
        return model, optimizer

    def loader(
        self, dataset: Any, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False, **loader_kwargs: Any
    ) -> DistributedLoader:
        """This rank's shard of ``dataset``; each pass is a new, consistently shuffled epoch."""
        # with a --parallel layout the ranks of one tp group / pipeline read the same batches: shard by dp
        rank, size = (self.parallel.dp_rank, self.parallel.dp_size) if self.parallel else (self.env.rank, self.env.world_size)
        loader = DistributedLoader(
            dataset, batch_size, rank, size, shuffle=shuffle, seed=seed, drop_last=drop_last, **loader_kwargs
        )
        if self.memory is not None:
            loader.split = self.memory.split  # each batch in micro-batches; batch_size stays the step's
        reshape.follow_loader(self, loader)  # made after a restore of another shape: its global batch is kept
        return loader

    def batches(self, loader: DistributedLoader, start: int = 0, total: int | None = None) -> Iterator[Any]:
        """Batches epoch after epoch from overall batch ``start`` (what restore() returned), ending once
        batch ``total`` is reached (none left when restore() returned ``total``); without end if no total."""
        if self.metrics is not None:
            self.metrics.start_at(start)
        self.numerics.start_at(start)
        found = batches(loader, start, total)  # counted in the script's batches, whatever the micro-batch
        return self.memory.split(found) if self.memory is not None else found

    def checkpointer(
        self,
        folder: str | None = None,
        *,
        every: int | None = None,
        keep: int | None = None,
        async_save: bool | None = None,
        restart_from_scratch: bool | None = None,
    ) -> Checkpointer:
        """This job's checkpoints: ``restore()`` once, then ``step(n)`` after every step.

        Defaults come from the job (--checkpoint-every, --keep-checkpoints, --async-checkpoint,
        --restart-from-scratch); the folder is the job's own, so two jobs never load each other's state.
        """
        checkpointer = Checkpointer(
            self, folder, every=every, keep=keep, async_save=async_save, restart_from_scratch=restart_from_scratch
        )
        if self.metrics is not None:  # a restored run's steps are numbered from its checkpoint
            checkpointer.subscribe(self.metrics)
        if self.memory is not None:  # a halved micro-batch stays halved after a restore
            checkpointer.track("hpc_train.memory", self.memory)
        if self.profiler is not None:  # a range around each save
            checkpointer.subscribe(self.profiler)
        self._checkpointers.append(checkpointer)
        return checkpointer

    def backward(self, loss: Any) -> None:
        """Backward with loss scaling (fp16) and accumulation; the loss is recorded in the job's metrics."""
        if self.memory is not None and self.memory.active:  # weighted by the micro-batch's share of the batch;
            self.memory.backward(self.numerics.on_backward(loss))  # the metrics get the batch's loss at the step
            return
        if self.metrics is not None:
            self.metrics.on_backward(loss)
        self.runtime.backward(self.numerics.on_backward(loss))  # a non-finite loss makes its gradients NaN

    def step(self) -> bool:
        """After each backward: at accumulation boundaries unscale, clip, step, zero. True if it stepped."""
        stepped = self.memory.step() if self.memory is not None and self.memory.active else self.runtime.step()
        if stepped and self.metrics is not None:
            self.metrics.on_step()
        if stepped and self.heartbeat is not None:
            self.heartbeat.beat()
        if stepped and self.profiler is not None:
            self.profiler.step()
        if stepped:  # too many non-finite steps in a row: stop (DivergenceError) or roll back, on every rank
            self.numerics.after_step(self._checkpointers)
        return stepped

    def log(self, **scalars: Any) -> None:
        """Record more numbers with this step's metrics: ``ctx.log(lr=0.1, accuracy=acc)`` (rank 0's are written)."""
        if self.metrics is not None:
            self.metrics.log(scalars)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The job's precision for code outside the prepared model's forward (e.g. the loss)."""
        return self.runtime.autocast()

    def unwrap(self, model: Any) -> Any:
        return self.runtime.unwrap(model)

    # -- tensor / pipeline parallel (--parallel dp=2,tp=2,pp=1; hpc_train.runtime.engine.parallel) ---------
    @property
    def parallel(self) -> ParallelState | None:
        """Mesh coordinates and groups: ``dp_rank``, ``dp_group``, ``tp_group``, ``stage``, ...; None without a layout."""
        return self.runtime.parallel

    @property
    def mesh(self) -> Any:
        """The named DeviceMesh (``ctx.mesh["tp"]``), dims ("pp", "dp", "tp"); None without a layout."""
        return self.parallel.mesh if self.parallel else None

    def tensor_parallel(self, module: Any, plan: dict[str, Any]) -> Any:
        """Shard submodules over the tp group: ``{"fc1": "colwise", "fc2": "rowwise"}`` (or ParallelStyles)."""
        from hpc_train.runtime.engine.parallel import tensor_parallel

        return tensor_parallel(self, module, plan)

    def pipeline(self, layers: Any, loss_fn: Any, *, microbatches: int, schedule: str = "gpipe") -> Any:
        """This rank's stage of ``layers`` with a "gpipe" or "1f1b" schedule; ``pipe.step(x, y)`` then ``ctx.step()``."""
        from hpc_train.runtime.engine.parallel import pipeline

        return pipeline(self, layers, loss_fn, microbatches=microbatches, schedule=schedule)

    # -- collectives -----------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: str = "sum") -> Any:
        return self.runtime.all_reduce(tensor, op)

    def barrier(self) -> None:
        self.runtime.barrier()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print on rank 0 only, flushed (logs are read while the job runs)."""
        if self.is_main:
            print(*args, **kwargs, flush=True)

    def end_run(self, code: int) -> NoReturn:
        """The run ends here with exit status ``code`` (a checkpointer stopping at a scheduler's warning
        asks for it, having saved and requeued): shut down in order on every rank, then exit."""
        self.shutdown()
        raise SystemExit(code)

    def shutdown(self) -> None:
        """End the job's side of training in order; every rank calls it, a second call does nothing.

        Finishes pending checkpoint writes and the metrics, waits until every rank got here (so no rank
        closes connections a peer is still using in a collective), then stops the backend. ``rt.init()``
        also runs it at exit for a script that does not call it.
        """
        self._teardown(orderly=True)

    def _teardown(self, orderly: bool, error: BaseException | None = None) -> None:
        """``orderly=False``: this process only, with no collective (the other ranks may be gone)."""
        if self._shut_down:
            return
        self._shut_down = True
        atexit.unregister(self._at_exit)
        if self.heartbeat is not None:  # the rank whose own error came first names the node to avoid
            self.heartbeat.finishing(None if orderly else error or _uncaught() or RuntimeError("ended by an error"))
        try:
            if self.profiler is not None:  # a run that ends inside its window keeps what was recorded
                self.profiler.close()
            if orderly and self.metrics is not None:  # every rank's peak memory, in one all-reduce
                self.metrics.at_end.update(device=self.device.type, peak_bytes=rank_peaks(self.runtime))
            if self.metrics is not None:
                self.metrics.close()
            if orderly:
                for checkpointer in self._checkpointers:
                    checkpointer.close()  # joins the async writer and the stop watcher (a collective)
                if self.is_main and not self._checkpointers:
                    _unused_checkpoint_options(os.environ)
                self.runtime.barrier()
        finally:
            if self.heartbeat is not None:
                self.heartbeat.close()
            if not orderly:  # after the heartbeat has the error: the rank that failed first names its node
                self.runtime.abandon()
            self.runtime.shutdown()

    def _at_exit(self) -> None:
        # The script ended without shutdown(). After an uncaught exception (Python has set sys.last_value)
        # the other ranks may be mid-collective or gone: a collective here could hang, so skip them.
        self._teardown(orderly=_uncaught() is None)

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type: Any, exc: Any, *_: Any) -> None:
        self._teardown(orderly=exc_type is None, error=exc)


def _uncaught() -> BaseException | None:
    """The exception that ended the script, once Python's excepthook has recorded it."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def runtime_class(backend: str) -> type[BackendRuntime]:
    """The runtime half of ``backend``, as its plugin declares it (``Backend.runtime``), imported lazily.

    The core names no runtime class: even a script started without hpc_train (a plain ``torchrun
    train.py``, so no HPC_TRAIN_BACKEND) gets the one the plugin of the default backend declares.
    """
    from hpc_train.plugin.manager import default_plugins

    path = default_plugins().backend(backend).runtime
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, BackendRuntime)):
        raise TypeError(
            f"backend {backend!r} names the runtime {path!r}, which is not a hpc_train.runtime.engine.backend.BackendRuntime subclass"
        )
    return cls


def init(backend: str | None = None, **defaults: Any) -> Context:
    """Find this process's place (any launcher), start the backend, return the Context.

    ``defaults`` (precision=, grad_clip=, grad_accum=, comm_hook=, activation_checkpointing=) apply
    unless the job sets them (``--precision``, ...).
    """
    env = detect()
    name = backend or os.environ.get(contract.ENV_BACKEND) or "torchrun"
    metrics = defaults.pop("metrics", True)  # rt.init(metrics=False); the job's HPC_TRAIN_METRICS wins
    options = RuntimeOptions.from_env(**defaults)
    runtime = with_layout(runtime_class(name))(env, options)  # + device mesh when the job has --parallel
    runtime.init()
    ctx = Context(env, name, runtime, metrics=metrics)
    # the same orderly end for a script that never calls ctx.shutdown(): atexit runs while the interpreter
    # is still intact, unlike the finalization that would otherwise tear the backend down
    atexit.register(ctx._at_exit)
    return ctx


# the job's checkpoint options, which only a checkpointer reads (hpc_train.runtime.checkpoint.manager)
CHECKPOINT_OPTIONS = {
    contract.ENV_CHECKPOINT_EVERY: "--checkpoint-every",
    contract.ENV_KEEP_CHECKPOINTS: "--keep-checkpoints",
    contract.ENV_ASYNC_CHECKPOINT: "--async-checkpoint",
}


def _unused_checkpoint_options(environ: Any) -> None:
    """Say so when the job was given checkpoint options and the script never made a checkpointer: the
    options were accepted at submission (the script's code is not read there) and would do nothing unsaid."""
    given = [flag for name, flag in CHECKPOINT_OPTIONS.items() if environ.get(name)]
    if given:
        print(
            f"hpc_train: {', '.join(given)} given, but this script made no checkpointer (ctx.checkpointer()): "
            "nothing was saved, and a requeued run starts from step 0 (docs/checkpointing.md)",
            file=sys.stderr,
            flush=True,
        )
