"""``--profile`` inside the job: the chosen ranks record the spec's steps, with no code in the script.

``torch``: torch.profiler (CPU activity, and CUDA's on a GPU) over the spec's window of optimizer steps,
written by ``tensorboard_trace_handler`` to ``<job folder>/profile/run-R/rank-N.<time>.pt.trace.json``:
TensorBoard's profiler plugin (``tensorboard --logdir <job folder>/profile``) and Perfetto open it.
``nsys``: the rank's python already runs under ``nsys profile --capture-range=cudaProfilerApi``
(hpc_train.runtime.nsys_exec); here the window's first step starts the capture and its last ends it.

Steps are counted by ``ctx.step()`` from the run's first forward, so the trace's ``ProfilerStep#N`` is
the run's step N (0-based). The wait steps cost one comparison each: the torch profiler is created at
the first forward but stepped only from the warm-up on (the skipped steps are stepped through at once
then, which gives every later step its own number), and stopped once the window is written.

On a GPU, while profiling, NVTX ranges mark the forward, backward, optimizer step (with the gradient
communication a backend does in it) and checkpoint saves for Nsight. Ranks that do not profile, CPU
jobs and jobs without ``--profile`` get no wrapper, hook or range at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train.config.profile_spec import ProfileSpec, SpecError, parse, run_folder
from hpc_train.runtime.checkpoint.events import CheckpointObserver
from hpc_train.runtime.log import topic_log

log = topic_log("profile")

if TYPE_CHECKING:
    from hpc_train.runtime.engine.backend import BackendRuntime


def _steps(spec: ProfileSpec) -> str:
    first, last = spec.steps[0], spec.steps[-1]
    return f"step {first}" if first == last else f"steps {first}-{last}"


class Ranges:
    """Named ranges (NVTX on a GPU) around the parts of a step: each wrapped call pushes and pops one."""

    def __init__(self, push: Callable[[str], Any], pop: Callable[[], Any]) -> None:
        self.push, self.pop = push, pop

    def wrap(self, obj: Any, name: str, label: str) -> None:
        """Replace ``obj.name`` on the instance by the same call inside a range ``label``."""
        method = getattr(obj, name, None)
        if method is None:
            return
        push, pop = self.push, self.pop

        @functools.wraps(method)
        def ranged(*args: Any, **kwargs: Any) -> Any:
            push(label)
            try:
                return method(*args, **kwargs)
            finally:
                pop()

        setattr(obj, name, ranged)

    def around(self, model: Any, runtime: BackendRuntime) -> None:
        """Forward, backward, the optimizer step with the gradient averaging a backend does in it."""
        self.wrap(model, "forward", "forward")
        self.wrap(runtime, "backward", "backward")
        self.wrap(runtime, "step", "optimizer step")  # accumulation micro-steps: an empty one
        self.wrap(runtime, "synchronize_gradients", "gradient communication")


def nvtx_ranges() -> Ranges:
    import torch

    return Ranges(torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop)


class Profiler(CheckpointObserver):
    """One profiling rank: counts the run's optimizer steps and records the spec's window of them."""

    def __init__(self, spec: ProfileSpec, rank: int, folder: Path, *, cuda: bool = False, ranges: Ranges | None = None) -> None:
        self.spec, self.rank, self.folder, self.cuda = spec, rank, folder, cuda
        self.ranges = ranges
        self.count = 0  # this run's optimizer steps so far
        self.started = False
        self.done = False
        self._torch: Any = None  # the torch.profiler.profile while the window is open
        self._hook: Any = None

    # -- wiring (ctx.prepare, ctx.checkpointer) ----------------------------------------------------
    def watch(self, model: Any, runtime: BackendRuntime) -> None:
        """Start at the model's first forward (the run's first step); ranges around the step's parts."""
        if self.ranges is not None:
            self.ranges.around(model, runtime)
        register = getattr(model, "register_forward_pre_hook", None)
        if register is not None and not self.started and self._hook is None:
            self._hook = register(lambda *_: self.start())

    def before_save(self, step: int) -> None:
        if self.ranges is not None:  # a checkpointer's events: one range around each save
            self.ranges.push("checkpoint")

    def after_save(self, step: int) -> None:
        if self.ranges is not None:
            self.ranges.pop()

    # -- the window ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.started:
            return
        self.started = True
        log(f"rank {self.rank} records {_steps(self.spec)} of this run with {self.spec.kind} into {self.folder}")
        if self.spec.kind == "torch":
            self._torch = self._torch_profiler()
            self._torch.start()  # step 0 begins; nothing is recorded before the warm-up
        elif self.spec.first == 0:
            self._capture(True)

    def step(self) -> None:
        """At every optimizer step (``ctx.step()`` returned True)."""
        if self.done:
            return
        if not self.started:
            self.start()
        self.count += 1
        if self.spec.kind == "nsys":
            if self.count == self.spec.first:
                self._capture(True)
            elif self.count == self.spec.first + self.spec.active:
                self._capture(False)
                self.done = True
            return
        if self.count < self.spec.wait:
            return  # the profiler's own step() would cost more than this comparison
        for _ in range(self.spec.wait if self.count == self.spec.wait else 1):
            self._torch.step()  # at the warm-up's start: the skipped steps at once
        if self.count == self.spec.first + self.spec.active:  # the trace was written by step()
            self._finish()

    def close(self) -> None:
        """At shutdown: a run that ends inside its window writes what it recorded."""
        if self._torch is not None:
            self._finish()
        elif self.spec.kind == "nsys" and self.started and not self.done and self.count >= self.spec.first:
            self._capture(False)
        self.done = True

    # -- torch.profiler --------------------------------------------------------------------------
    def _torch_profiler(self) -> Any:
        import torch.profiler as tp

        activities = [tp.ProfilerActivity.CPU, *([tp.ProfilerActivity.CUDA] if self.cuda else [])]
        self.folder.mkdir(parents=True, exist_ok=True)
        return tp.profile(
            activities=activities,
            schedule=tp.schedule(wait=self.spec.wait, warmup=self.spec.warmup, active=self.spec.active, repeat=1),
            on_trace_ready=tp.tensorboard_trace_handler(str(self.folder), worker_name=f"rank-{self.rank}"),
            record_shapes=self.spec.shapes,
            with_stack=self.spec.stack,
            profile_memory=self.spec.memory,
        )

    def _finish(self) -> None:
        profiler, self._torch = self._torch, None
        try:
            profiler.stop()  # inside the window: stops and writes the steps so far
        except Exception as exc:  # a profiler that cannot write must not end the training run
            log(f"rank {self.rank}: the trace could not be written: {type(exc).__name__}: {exc}")
        self.done = True
        written = sorted(self.folder.glob(f"rank-{self.rank}.*.pt.trace.json*"))
        last = min(self.spec.steps[-1], self.count)  # ended early: the step under way is the last one in it
        if written and last >= self.spec.first:
            steps = f"step {last}" if last == self.spec.first else f"steps {self.spec.first}-{last}"
            early = "" if last == self.spec.steps[-1] else " (the run ended inside its window)"
            log(f"rank {self.rank}: trace of {steps}{early} in {written[-1]}")

    # -- nsys --------------------------------------------------------------------------------------
    def _capture(self, on: bool) -> None:
        """nsys's capture range (``--capture-range=cudaProfilerApi``): cudaProfilerStart / Stop."""
        if not self.cuda:
            if on:
                log(f"rank {self.rank} runs on the CPU: nsys's capture range is CUDA's profiler API, so nothing is captured")
            return
        import torch

        (torch.cuda.profiler.start if on else torch.cuda.profiler.stop)()
        if not on:
            log(f"rank {self.rank}: nsys captured {_steps(self.spec)}; the report is written when the process ends")


def profiler_for(runtime: BackendRuntime) -> Profiler | None:
    """This rank's Profiler under ``--profile`` (or ``rt.init(profile=...)``); None when off or not chosen."""
    text = runtime.options.profile
    if not text:
        return None
    try:
        spec = parse(text)
    except SpecError as exc:
        raise ValueError(f"profile={text!r}: {exc}") from None
    env = runtime.env  # Horovod and MPI correct the launcher's view in init()
    beyond = spec.beyond(env.world_size)
    if beyond and env.rank == 0:
        log(f"{text!r} names rank(s) {beyond}, which this job of {env.world_size} does not have")
    if env.rank not in spec.chosen(env.world_size):
        return None
    cuda = getattr(runtime.device, "type", "cpu") == "cuda"
    return Profiler(spec, env.rank, run_folder(), cuda=cuda, ranges=nvtx_ranges() if cuda else None)
