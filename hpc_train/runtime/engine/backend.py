"""The job-side half of a backend: what every runtime builds on, and the default for a backend naming none.

A backend's login-side class names its runtime class by import path (``Backend.runtime``) so the
login node never imports this module's frameworks. Methods are called by :class:`Context`.

:class:`BackendRuntime` is the contract: the process group from the environment, the device,
precision, clipping, accumulation and the collectives, for every backend. How gradients are averaged
is each backend's (DDP in the torchrun plugin, Horovod's optimizer, an MPI all-reduce, DeepSpeed's
engine); :class:`AllReduceRuntime` is the plain torch.distributed way, for a backend that names no runtime.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import operator
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_train.runtime.launch.environment import DistEnv
from hpc_train.runtime.options import RuntimeOptions
from hpc_train.runtime.step.memory import describe, is_oom, optimizer_out_of_memory

if TYPE_CHECKING:
    from hpc_train.runtime.engine.parallel_state import ParallelState

# Up to this many gradients on the CPU, their norm is summed in Python (see gradient_norm).
FEW_TENSORS = 16
# Up to this many gradient elements on the CPU, the numerics probe is one fused pass (see gradients_probe);
# where it costs as much as a few sums, measured on x86-64.
FUSED_PROBE_ELEMENTS = 1 << 16
# a parameter's gradient, read in C by map(): the per-step walk over the parameters costs less than p.grad in a loop
_GRAD = operator.attrgetter("grad")
# How long shutdown() lets go of the GIL for torch's communication threads to finish (see shutdown()).
WORKER_DRAIN_S = 0.2


def _flag_view(flag: Any) -> Any:
    """What ``[0]`` reads a one-element CPU tensor through each step: a memoryview of its memory (no
    dispatcher call, as ``.item()`` makes), or the tensor itself where torch was built without numpy."""
    try:
        return memoryview(flag.numpy())
    except (ImportError, RuntimeError):  # "Numpy is not available"
        return flag


def _probe_kind(parameters: list[Any]) -> str:
    """How :meth:`BackendRuntime.gradients_probe` reads these parameters' gradients (the same device and
    dtype as theirs): "fused", "sums" or "norm"."""
    if not parameters or len(parameters) > FEW_TENSORS:
        return "norm"
    if not all(p.is_cpu and p.is_floating_point() and p.element_size() >= 4 for p in parameters):
        return "norm"  # a device's gradients: no read before the check's; half precision: sums could overflow
    return "fused" if sum(p.numel() for p in parameters) <= FUSED_PROBE_ELEMENTS else "sums"


class BackendRuntime:
    """torch.distributed from the environment; precision, clipping and accumulation for every backend.

    A subclass says how gradients become identical across ranks: a model wrapper in ``wrap`` (DDP), an
    averaging step in ``synchronize_gradients`` (MPI), or its optimizer (Horovod). The base averages
    nothing, so a multi-process run of a runtime that says none of these stops in ``wrap``.
    """

    #: what the runtime is, for messages
    name: ClassVar[str] = "torch.distributed"
    #: True when the framework runs its own parallel engine under ``--parallel`` (DeepSpeed's pipeline):
    #: hpc_train then only builds the device mesh, and ``ctx.pipeline(...)`` calls :meth:`pipeline`.
    #: False: hpc_train averages over the dp group, saves sharded state and runs its own pipeline schedules.
    owns_parallelism: ClassVar[bool] = False
    #: True when the framework's engine writes its own checkpoint files (``write_engine_state``, all ranks)
    #: instead of the replicated state hpc_train splits across ranks (``checkpoint_state``)
    engine_checkpoint: ClassVar[bool] = False
    #: why this runtime's engine checkpoints load only at the world size that saved them; None: they load at
    #: any world size (replicated state, or an engine that reshards its own files when it loads them).
    #: Recorded in each checkpoint's shape.json through :meth:`reshard_refusal` (hpc_train.runtime.checkpoint.reshape)
    resharding: ClassVar[str | None] = None
    #: this rank's place in the ``--parallel`` mesh, set by ``init()`` under a layout; None without one
    parallel: ParallelState | None = None

    def __init__(self, env: DistEnv, options: RuntimeOptions) -> None:
        self.env = env
        self.options = options
        self.model: Any = None
        self.optimizer: Any = None
        self.scaler: Any = None
        self.micro_step = 0
        self.metrics: Any = None  # the Context's MetricsRecorder (times the communication); None when off
        self.numerics: Any = None  # the Context's NumericsGuard (hpc_train.runtime.step.numerics)
        self._parameters_of: Any = None  # the model whose parameters _parameters lists
        self._probe: tuple[Any, Any, Any, Any] | None = None  # gradients_probe's check, flag, scale and view of the flag
        self._parameters: list[Any] = []
        self._probe_kind = "norm"  # how gradients_probe reads this model's gradients, decided once per model

    # -- setup ---------------------------------------------------------------------------
    @functools.cached_property
    def device(self) -> Any:
        import torch

        if torch.cuda.is_available():
            index = self.env.local_rank % torch.cuda.device_count()
            torch.cuda.set_device(index)
            return torch.device("cuda", index)
        return torch.device("cpu")

    @property
    def dist_backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def init(self) -> None:
        """Start the process group (a no-op for a single process)."""
        import torch.distributed as dist

        for key, value in self.env.as_torch_env().items():
            os.environ.setdefault(key, value)
        if self.env.world_size > 1 and not dist.is_initialized():
            kwargs: dict[str, Any] = {}
            if self.device.type == "cuda":
                kwargs["device_id"] = self.device
            dist.init_process_group(
                self.dist_backend,
                init_method="env://",
                rank=self.env.rank,
                world_size=self.env.world_size,
                timeout=datetime.timedelta(minutes=30),
                **kwargs,
            )

    def abandon(self) -> None:
        """This rank ends by an error while the others may be waiting for it in a collective: make sure
        they do not wait forever. Nothing here: gloo and NCCL fail a collective whose peer is gone."""

    def shutdown(self) -> None:
        """Stop the backend in this process; the Context has already let every rank get here (barrier)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        dist.destroy_process_group()  # every group, the newest first
        # That does not stop gloo's worker threads (a DDP model still holds the group), and a worker drops a
        # finished collective a moment after the caller got its result. Dropping a tensor Python made takes
        # the GIL, and a thread taking the GIL once the interpreter is finalizing is ended inside a C++
        # destructor: std::terminate, "terminate called without an active exception", SIGABRT at exit.
        # So let go of the GIL now, while the interpreter is intact, for the workers to finish.
        time.sleep(WORKER_DRAIN_S)

    # -- model -----------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self.options.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.options.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        import torch

        model = model.to(self.device)
        if self.options.precision == "fp16":
            self.scaler = torch.amp.GradScaler(self.device.type)
        if self.options.precision != "fp32":
            _autocast_forward(model, self.autocast)
        model = self.wrap(model)
        self.model, self.optimizer = model, optimizer
        self.set_gradient_sync(self.options.grad_accum == 1)
        return model, optimizer

    def wrap(self, model: Any) -> Any:
        """The model as training uses it: a data-parallel wrapper (DDP), or the model itself where
        gradients are averaged elsewhere (``synchronize_gradients``, the optimizer). Every runtime of more
        than one process overrides it: averaging nothing would train each rank's replica apart, silently."""
        if self.env.world_size == 1:
            return model
        raise NotImplementedError(
            f"{type(self).__qualname__} does not say how gradients are averaged across {self.env.world_size} processes: "
            "override wrap() (return the model itself when synchronize_gradients() or the optimizer averages), "
            "or subclass hpc_train.runtime.engine.backend.AllReduceRuntime"
        )

    def set_gradient_sync(self, sync: bool) -> None:
        """Whether the next backward should reduce gradients (False on accumulation micro-steps), for a
        wrapper that reduces in backward (DDP); nothing to switch here."""

    # -- step ------------------------------------------------------------------------------
    def backward(self, loss: Any) -> None:
        loss = loss / self.options.grad_accum if self.options.grad_accum > 1 else loss
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def step(self) -> bool:
        """Called after every backward; steps the optimizer at accumulation boundaries."""
        self.micro_step += 1
        accum = self.options.grad_accum
        if self.micro_step % accum != 0:
            self.set_gradient_sync((self.micro_step + 1) % accum == 0)
            return False
        self.synchronize_gradients()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = self.clip_gradients()
        # a non-finite loss or gradient on any rank: every rank skips (the scaler's own skips stay its own)
        if self.numerics is None or self.numerics.check(self, norm, loss_scaling=self.scaler is not None):
            try:
                self.optimizer_step()
            except Exception as exc:  # what it allocates is the parameters' size: no smaller micro-batch helps
                if not is_oom(exc):
                    raise
                raise optimizer_out_of_memory(self, describe(exc)) from exc
        if self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad()  # set_to_none by default; Horovod's wrapper takes no arguments
        self.set_gradient_sync(accum == 1)
        return True

    def clip_gradients(self) -> Any:
        """Clip to --grad-clip; the gradient norm before clipping (a tensor), which clipping computes anyway,
        else one fused norm for the numerics check; None when neither wants it."""
        if self.options.grad_clip is not None:
            import torch

            return torch.nn.utils.clip_grad_norm_(self.parameters(), self.options.grad_clip)
        if self.numerics is None:
            return None
        return self.gradient_norm() if self.metrics is not None else self.gradients_probe()

    def gradient_norm(self) -> Any:
        """The 2-norm of this rank's (averaged) gradients: one norm per tensor in one fused call, then one of
        those (a tensor; a float for a few CPU tensors)."""
        import torch

        grads = self._gradients()
        if not grads:
            return None
        norms = torch._foreach_norm(grads)
        if len(norms) <= FEW_TENSORS and grads[0].is_cpu:  # reading a few CPU numbers costs less than two more ops
            return math.hypot(*map(float, norms))  # inf if any is, else NaN if any is: non-finite either way
        return torch.linalg.vector_norm(torch.stack(norms))  # on a GPU: no read here, the check's is the one sync

    def gradients_probe(self) -> Any:
        """A number finite exactly when every gradient is, for the numerics check when no metrics want the
        norm; on the CPU, for a few fp32/fp64 gradients, without a norm's cold kernels (bench/numerics.py):

        - up to FUSED_PROBE_ELEMENTS in all, one fused pass: GradScaler's own non-finite check with a scale
          of 1 (x * 1 keeps every bit), one read, one op fewer than zeroing its flag on every step;
        - more, the sum of their sums (inf and NaN carry through a sum), where the fused pass's write of
          every gradient would cost more than the reads of a few sums.
        """
        grads = self._gradients()
        if not grads:
            return None
        kind = self._probe_kind
        if kind == "norm":
            return self.gradient_norm()
        if kind == "sums":
            return sum([float(g.sum()) for g in grads])  # summed as Python floats (doubles): fp32 sums cannot overflow
        if self._probe is None:  # its flag and scale (float32, as GradScaler's), made once
            import torch

            found = torch.zeros(1)
            self._probe = (torch._amp_foreach_non_finite_check_and_unscale_, found, torch.ones(1), _flag_view(found))
        check, found, one, flag = self._probe
        check(grads, found, one)
        if not flag[0]:
            return 0.0
        found.zero_()
        return math.inf

    def _gradients(self) -> list[Any]:
        grads = [g for g in map(_GRAD, self._parameter_list()) if g is not None]
        if self.parallel is not None:
            # a tensor-parallel shard's own part (as hpc_train.runtime.engine.parallel._local): ranks then disagree, see gradients_agree
            grads = [getattr(g, "_local_tensor", g) for g in grads]
        return grads

    def gradients_agree(self) -> bool:
        """Whether every rank holds the same averaged gradients at the step, so a non-finite norm is seen
        on every rank and the numerics check needs no collective. Not so when ranks hold different
        parameters (tensor or pipeline parallel)."""
        parallel = self.parallel
        return parallel is None or (parallel.tp_size == 1 and parallel.pp_size == 1)

    def synchronize_gradients(self) -> None:
        """Make gradients identical across ranks before clipping, at each optimizer step; nothing here
        (a wrapper such as DDP already did in backward). Blocking averaging here is timed as communication."""

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
        else:
            self.optimizer.step()

    def parameters(self) -> Iterator[Any]:
        return (p for p in self._parameter_list() if p.grad is not None)

    def _parameter_list(self) -> list[Any]:
        """The prepared model's parameters, listed once per model: walking the module tree costs more per
        step than the gradient norm of a small model (the parameters are fixed once prepared, as DDP requires)."""
        model = self.model
        if self._parameters_of is not model:
            self._parameters_of, self._parameters = model, list(model.parameters())
            self._probe_kind = _probe_kind(self._parameters)
        return self._parameters

    # -- collectives -------------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: str = "sum") -> Any:
        import torch.distributed as dist

        if self.env.world_size == 1:
            return tensor
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        if op == "mean":
            tensor /= self.env.world_size
        return tensor

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.env.world_size > 1 and dist.is_initialized():
            dist.barrier()

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if it is true on any rank (one small all-reduce)."""
        return self.any_ranks((flag,))[0]

    def any_ranks(self, flags: Sequence[bool]) -> tuple[bool, ...]:
        """``any_rank`` for several flags at once, in one small all-reduce (what a training step can afford)."""
        if self.env.world_size == 1:
            return tuple(bool(f) for f in flags)
        import torch

        # on the device: an NCCL process group reduces nothing else
        counts = self.all_reduce(torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=self.device))
        return tuple(c > 0 for c in counts.tolist())

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (on every rank)."""
        if self.env.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(out, obj)
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    @property
    def at_accumulation_boundary(self) -> bool:
        return self.micro_step % self.options.grad_accum == 0

    def checkpoint_state(self) -> dict[str, Any] | None:
        """The model, optimizer and scaler state, the same on every rank (replicas are identical), so the
        Checkpointer splits its writing across ranks. A runtime whose state differs by rank returns None
        and writes it in ``write_engine_state``."""
        return {
            "model": self.unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def write_engine_state(self, folder: str) -> None:
        """For backends whose state lives on every rank (DeepSpeed): all ranks write here."""

    def start_engine_state(self, folder: str) -> Callable[[], None] | None:
        """``write_engine_state`` for a background save: a runtime that can write in the background
        starts it and returns what waits until this rank's part is written (the checkpoint writer
        thread calls it); by default the state is written now and None returned."""
        self.write_engine_state(folder)
        return None

    def reshard_refusal(self) -> str | None:
        """Why this run's checkpoints will not load at another world size (None: they will). Judged
        before a resume, on the login side and in the job; by default ``resharding``, a runtime whose
        answer depends on the run (a pipeline layout) says so here."""
        return self.resharding

    def load_checkpoint_state(self, state: dict[str, Any] | None, folder: str) -> None:
        if state is None:
            return
        self.unwrap(self.model).load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)

    # -- parallelism the framework owns ------------------------------------------------------------
    def pipeline(self, layers: Sequence[Any], loss_fn: Any, *, microbatches: int) -> Any:
        """``ctx.pipeline(...)`` for a runtime that sets ``owns_parallelism``: the framework's own pipeline
        engine, an object with ``module`` (to prepare) and ``step(inputs, targets)`` returning the loss."""
        raise NotImplementedError(f"{type(self).__qualname__} sets owns_parallelism but has no pipeline()")


class AllReduceRuntime(BackendRuntime):
    """The runtime of a backend that names none: rank 0's weights to every rank, then gradients
    averaged in one flat all-reduce per optimizer step (torch.distributed, no wrapper).

    Every rank's backward must reach the same parameters (as DDP requires by default). Nothing overlaps
    the averaging with backward, as DDP does: a backend that wants that names a runtime that wraps the
    model in DDP (the torchrun backend's does), or its own.
    """

    name = "all-reduce"

    def wrap(self, model: Any) -> Any:
        if self.env.world_size > 1:
            import torch
            import torch.distributed as dist

            with torch.no_grad():  # every replica starts from rank 0's weights
                for tensor in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(tensor, src=0)
        return model

    def synchronize_gradients(self) -> None:
        if self.env.world_size > 1:
            average_in_place([p.grad for p in self.model.parameters() if p.grad is not None], self.env.world_size)


def average_in_place(tensors: Sequence[Any], size: int, group: Any = None) -> None:
    """Average ``tensors`` over ``group`` (None: every rank) of ``size`` ranks, in one flat all-reduce:
    one collective per step instead of one per tensor. Every rank must pass the same shapes in the same order."""
    if not tensors:
        return
    import torch
    import torch.distributed as dist

    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def _autocast_forward(model: Any, autocast: Any) -> None:
    """Run ``model.forward`` under autocast, keeping the module and its state dict unchanged."""
    forward = model.forward

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with autocast():
            return forward(*args, **kwargs)

    model.forward = wrapped


def apply_activation_checkpointing(model: Any, module_types: tuple[type, ...] | None = None) -> int:
    """Recompute activations of the chosen submodules in backward; returns how many were wrapped.

    Default: every direct child that has parameters. Forward is replaced on the instance, so
    parameter names and checkpoints are unchanged.
    """
    from torch.utils.checkpoint import checkpoint

    targets: list[Any]
    if module_types:
        targets = [m for m in model.modules() if isinstance(m, module_types) and m is not model]
    else:
        targets = [m for m in model.children() if any(True for _ in m.parameters())]
    for module in targets:
        forward: Any = module.forward

        def wrapped(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        module.forward = wrapped
    return len(targets)
