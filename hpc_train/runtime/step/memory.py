"""Fit in memory without editing the script: ``--micro-batch N`` or ``--micro-batch auto``.

The batch a script gives ``ctx.loader(dataset, batch_size)`` is the batch it means: one optimizer step
per loader batch, as written. Under ``--micro-batch`` the loader's iterator (and ``ctx.batches``) yields
that batch in micro-batches of at most N samples, ``ctx.backward`` weights each micro-batch's loss by
its share of the batch, and ``ctx.step()`` steps once, after the last one: the optimisation is the
batch's, the memory a micro-batch's. The script's loop is unchanged; it sees more, smaller batches and
``ctx.step()`` returning True once per batch it gave.

``auto`` chooses N at the first training forward, with that call's own inputs: probe steps (forward,
backward, optimizer step) at 1, 2, 4, ... samples up to the batch, stopping at the first that runs out
of memory (on a GPU, also at one that leaves less than ``MARGIN`` of the device free); the model,
optimizer, gradients and RNG are then put back exactly as they were.

An out-of-memory error in a micro-batch's forward or backward does not end the run: the forward
returns a stand-in (the same output computed without gradients, in smaller pieces), the rest of the
batch is passed over, and at the batch's end every rank learns, in one small all-reduce, whether any
ran out. If one did, every rank drops the batch's gradients, halves the micro-batch and yields the
same batch again (at most ``MAX_RETRIES`` times per step). The new size is kept for the rest of the
run and in the checkpoint (``ctx.checkpointer`` tracks it), so a restored run starts with it.

An out-of-memory error in the optimizer step is another matter: what it allocates (the optimizer's state,
Adam's two moments made at its first step, and the update's temporaries) is the size of the parameters,
not of the batch, and the step may have updated some parameters already. Halving the micro-batch cannot
help and redoing the step would apply part of it twice, so the run stops with
:class:`OptimizerOutOfMemory`, which says so and what can help, and is not retried by ``--on-failure requeue``.

No collective may be under way when a rank runs out, or the others would wait in it forever, so the
gradients are not averaged during backward (a DDP runtime's ``set_gradient_sync(False)`` on every
micro-batch) but at the step, after the agreement (the runtime's ``synchronize_gradients``).
"""

from __future__ import annotations

import copy
import gc
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from hpc_train import contract
from hpc_train.runtime.lifecycle.no_retry import refuse_retry

MAX_RETRIES = 4  # halvings of one step before its out-of-memory error ends the run
MARGIN = 0.1  # of a GPU's memory that auto's choice leaves free
OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def parse(setting: str | int | None) -> int | None:
    """``--micro-batch``'s value as the runtime uses it: the size, or None for ``auto``."""
    if setting is None or str(setting).strip().lower() == "auto":
        return None
    size = int(setting) if str(setting).strip().isdigit() else 0
    if size < 1:
        raise ValueError(f"micro_batch must be 'auto' or at least 1, got {setting!r}")
    return size


def is_oom(exc: BaseException) -> bool:
    """An allocator's out-of-memory error: torch.cuda.OutOfMemoryError, MemoryError, or the CPU
    allocator's RuntimeError ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    cuda_oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if cuda_oom is not None and isinstance(exc, cuda_oom):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in OOM_TEXT)


class OptimizerOutOfMemory(MemoryError):
    """The optimizer step ran out of memory: no smaller micro-batch can make it fit (see the module docstring)."""


def describe(exc: BaseException) -> str:
    """An allocator's error in one line (CUDA's runs to a paragraph)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def optimizer_out_of_memory(runtime: Any, found: str) -> OptimizerOutOfMemory:
    """The error to raise when ``runtime``'s optimizer step ran out of memory (``found``: :func:`describe`);
    the job is marked not to be retried."""
    optimizer = runtime.optimizer
    groups = getattr(optimizer, "param_groups", None) or []
    count = sum(p.numel() for group in groups for p in group.get("params", ()))
    size = f", {count:,} parameters" if count else ""
    message = (
        f"rank {runtime.env.rank}: out of memory in the optimizer step ({type(optimizer).__name__}{size}): {found}. "
        "What the step allocates (the optimizer's state and the update) is the size of the parameters, not of the "
        "batch, so a smaller --micro-batch cannot help and the step is not redone. Make room for it: fewer or smaller "
        "parameters, an optimizer with less state (Adam keeps two copies of the parameters, SGD without momentum none), "
        "its state sharded over the ranks (--backend deepspeed with ZeRO), or nodes with more memory"
    )
    refuse_retry(os.environ.get(contract.ENV_NO_RETRY_FILE) or None, message)  # a requeued run would run out again
    return OptimizerOutOfMemory(message)


def free_memory(device: Any) -> None:
    """Give back what a failed step held: cycles (a traceback's frames) first, then CUDA's cache."""
    gc.collect()
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.empty_cache()


def peak_bytes(device_type: str) -> int:
    """This process's peak memory: CUDA's peak allocated on a GPU, the RSS high-water mark on the CPU."""
    if device_type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def rank_peaks(runtime: Any) -> list[int]:
    """Every rank's :func:`peak_bytes`, in rank order, through one all-reduce (each rank fills its slot)."""
    import torch

    env = runtime.env
    slots = torch.zeros(env.world_size, dtype=torch.float64, device=runtime.device)
    slots[env.rank] = float(peak_bytes(runtime.device.type))
    return [int(v) for v in runtime.all_reduce(slots).tolist()]


# -- batches as the collate function built them: tensors, tuples, lists, dicts -------------------------
def _tensors(obj: Any) -> Iterator[Any]:
    if hasattr(obj, "dim") and hasattr(obj, "shape"):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def batch_len(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (None without one)."""
    return next((int(t.shape[0]) for t in _tensors(batch) if t.dim() > 0), None)


def _slice(obj: Any, total: int, start: int, stop: int) -> Any:
    """``obj`` with every tensor whose first dimension is ``total`` cut to ``[start:stop]``."""
    if hasattr(obj, "dim") and hasattr(obj, "shape"):
        return obj[start:stop] if obj.dim() > 0 and obj.shape[0] == total else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_slice(o, total, start, stop) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_slice(o, total, start, stop) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _slice(v, total, start, stop)) for k, v in obj.items())
    return obj


def pieces(total: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each micro-batch of at most ``size`` of ``total`` samples."""
    return [(start, min(start + size, total)) for start in range(0, total, max(1, size))]


def _merge(outputs: list[Any], sizes: list[int]) -> Any:
    """One output from the outputs of the pieces: tensors joined on the first dimension (0-d ones
    averaged by size), containers merged element by element, anything else the first piece's."""
    first = outputs[0]
    if len(outputs) == 1:
        return first
    if hasattr(first, "dim") and hasattr(first, "shape"):
        import torch

        if first.dim() == 0:
            return sum(o * (n / sum(sizes)) for o, n in zip(outputs, sizes))
        return torch.cat(outputs)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_merge(list(items), sizes) for items in zip(*outputs)))
    if isinstance(first, (tuple, list)):
        return type(first)(_merge(list(items), sizes) for items in zip(*outputs))
    if isinstance(first, dict):
        return type(first)((k, _merge([o[k] for o in outputs], sizes)) for k in first)
    return first


# -- the state a probe must leave as it found it --------------------------------------------------------
def _to_cpu(obj: Any) -> Any:
    if hasattr(obj, "detach"):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def snapshot(module: Any, optimizer: Any) -> dict[str, Any]:
    """Model, optimizer, gradients and RNG, copied off the device (the probe needs its memory)."""
    import torch

    state: dict[str, Any] = {
        "model": _to_cpu(module.state_dict()),
        "optimizer": _to_cpu(optimizer.state_dict()) if optimizer is not None else None,
        "grads": [None if p.grad is None else _to_cpu(p.grad) for p in module.parameters()],
        "rng": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    return state


def restore(module: Any, optimizer: Any, state: dict[str, Any]) -> None:
    import torch

    module.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    for p, grad in zip(module.parameters(), state["grads"]):
        p.grad = None if grad is None else grad.to(p.device)
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"])


def _surrogate(output: Any) -> Any:
    """A loss with the script's memory profile: every output that needs a gradient, summed."""
    parts = [t.float().sum() for t in _tensors(output) if getattr(t, "requires_grad", False)]
    return sum(parts) if parts else None


class MicroBatcher:
    """Splits each loader batch into micro-batches, accumulates, and halves the size after an OOM."""

    def __init__(self, runtime: Any, setting: str, *, metrics: Any = None, say: Callable[[str], None] = print) -> None:
        self.runtime = runtime
        self.setting = setting
        self.micro = parse(setting)  # None until auto has chosen
        self.metrics = metrics
        self.say = say
        self.module: Any = None
        self.active = False  # a batch of ctx.loader / ctx.batches is being fed in micro-batches
        self._total = self._chunk = 0
        self._last = self._oom = self._redo = self._replay = False
        self._retries = 0
        self._error = ""
        self._probe_error = ""  # auto's last probe ran out in the optimizer step: this error
        self._loss: Any = None
        self._announced = False

    @classmethod
    def for_runtime(cls, runtime: Any, metrics: Any = None) -> MicroBatcher | None:
        setting = runtime.options.micro_batch
        if setting is None:
            return None
        if runtime.options.grad_accum > 1:  # submit refuses both; a script's rt.init(grad_accum=...) meets it here
            raise ValueError("micro_batch sets the accumulation itself (the loader's batch is one step): drop grad_accum")
        say = (lambda line: print(f"hpc_train: {line}", flush=True)) if runtime.env.rank == 0 else (lambda line: None)
        return cls(runtime, setting, metrics=metrics, say=say)

    # -- checkpoints (ctx.checkpointer tracks this object) -------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"micro_batch": self.micro}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("micro_batch"):
            self.micro = int(state["micro_batch"])  # said with the first batch

    # -- the model -----------------------------------------------------------------------------------
    def watch(self, model: Any) -> None:
        """Catch out-of-memory errors in the forward of the module beneath any wrapper (no collective
        runs there, so one rank may redo it alone) and run auto's probe at its first training call."""
        module = self.module = self.runtime.unwrap(model)
        forward = module.forward

        def guarded(*args: Any, **kwargs: Any) -> Any:
            return self._forward(forward, args, kwargs)

        module.forward = guarded

    def _forward(self, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch

        if not self.active or not torch.is_grad_enabled() or not self.module.training:
            return forward(*args, **kwargs)
        if self.micro is None:
            self.micro = self._choose(forward, args, kwargs)
            self._redo = self.micro < self._total
        if not (self._redo or self._oom):
            try:
                return forward(*args, **kwargs)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                self._ran_out("forward", exc)
            free_memory(self.runtime.device)  # outside the handler: the traceback's frames are gone
        return self._stand_in(forward, args, kwargs)

    def _stand_in(self, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The output without gradients, in pieces of half the micro-batch: something for the script's
        loss while the batch is passed over (it is redone)."""
        import torch

        size = max(1, min(self.micro or self._chunk, self._chunk) // 2)
        while True:  # smaller pieces until they fit: a rank that gave up here would leave the others waiting
            try:
                outputs, sizes = [], []
                with torch.no_grad():
                    for start, stop in pieces(self._chunk, size):
                        outputs.append(
                            forward(*_slice(args, self._chunk, start, stop), **_slice(kwargs, self._chunk, start, stop))
                        )
                        sizes.append(stop - start)
                return _merge(outputs, sizes)
            except Exception as exc:
                if not is_oom(exc) or size == 1:
                    raise
            outputs = sizes = []  # outside the handler: the traceback's frames are gone
            free_memory(self.runtime.device)
            size //= 2

    def _ran_out(self, where: str, exc: BaseException) -> None:
        self._oom = True
        self._error = describe(exc)
        rank = self.runtime.env.rank
        print(f"hpc_train: rank {rank}: out of memory in {where} (micro-batch {self._chunk}): {self._error}", flush=True)
        self._drop_gradients()

    def _drop_gradients(self) -> None:
        for p in self.module.parameters() if self.module is not None else ():
            p.grad = None

    # -- auto ----------------------------------------------------------------------------------------
    def _choose(self, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """The largest probed size that fit on every rank; the state is put back whatever happens."""
        saved = snapshot(self.module, self.runtime.optimizer)
        fitted, tried, size = 0, [], 1
        try:
            while True:
                fits = not self.runtime.any_rank(not self._probe(forward, args, kwargs, size))  # all ranks stop together
                tried.append(f"{size}{'' if fits else ' (too big)'}")
                if not fits:
                    break
                fitted = size
                if size >= self._total:
                    break
                size = min(2 * size, self._total)
        finally:
            restore(self.module, self.runtime.optimizer, saved)
            free_memory(self.runtime.device)
        if fitted == 0 and self._probe_error:  # the optimizer's state does not fit, whatever the batch
            raise optimizer_out_of_memory(self.runtime, f"--micro-batch auto's probe of one sample: {self._probe_error}")
        if fitted == 0:
            raise MemoryError(f"--micro-batch auto: not even one sample fits in memory (tried {', '.join(tried)})")
        self._announce(fitted, "auto", probed=tried)
        return fitted

    def _probe(self, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any], size: int) -> bool:
        """One step of ``size`` samples (forward, backward of a stand-in loss, optimizer step): did it fit?"""
        import torch

        device = self.runtime.device
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        fits, where = True, "forward"
        try:
            loss = _surrogate(forward(*_slice(args, self._total, 0, size), **_slice(kwargs, self._total, 0, size)))
            if loss is not None:
                where = "backward"
                loss.backward()
            if self.runtime.optimizer is not None:
                where = "optimizer step"
                self.runtime.optimizer.step()
        except Exception as exc:
            if not is_oom(exc):
                raise
            fits = False
            self._probe_error = describe(exc) if where == "optimizer step" else ""
        loss = None
        self._drop_gradients()
        if fits and cuda:
            fits = torch.cuda.max_memory_allocated(device) <= (1 - MARGIN) * torch.cuda.get_device_properties(device).total_memory
        free_memory(device)
        return fits

    def _announce(self, size: int, reason: str, **extra: Any) -> None:
        self._announced = True
        per_step = -(-self._total // size)
        self.say(f"micro-batch {size} of the batch of {self._total} ({per_step} per step; {reason})")
        if self.metrics is not None:  # written after the row of the step it applies to
            record = {"event": "micro_batch", "step": self.metrics.step + 1, "micro_batch": size, "batch": self._total}
            self.metrics.event({**record, "per_step": per_step, "reason": reason, **extra})

    # -- the loader ----------------------------------------------------------------------------------
    def split(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Each batch in micro-batches; the same batch again when the step at its end says so."""
        for batch in batches:
            total = batch_len(batch)
            if total is None:
                raise TypeError(f"--micro-batch: cannot split a batch with no tensor in it ({type(batch).__name__})")
            if not self._announced and self.micro is not None:
                self._total = total
                self._announce(self.micro, "--micro-batch" if self.micro == parse(self.setting) else "restored")
            self._replay = True
            while self._replay:
                self._replay = False
                self._total, pending = total, pieces(total, min(self.micro or total, total))
                for i, (start, stop) in enumerate(pending):
                    self._chunk, self._last = stop - start, i == len(pending) - 1
                    self.runtime.set_gradient_sync(False)  # averaged at the step, after the agreement
                    self.active = True
                    yield _slice(batch, total, start, stop)

    # -- backward and step ---------------------------------------------------------------------------
    def backward(self, loss: Any) -> None:
        if self._oom or self._redo:
            return  # a stand-in's loss: this batch is redone
        weight = self._chunk / self._total
        try:
            self.runtime.backward(loss * weight if weight != 1 else loss)
        except Exception as exc:
            if not is_oom(exc):
                raise
            self._ran_out("backward", exc)
        if self._oom:
            free_memory(self.runtime.device)
            return
        value = loss.detach() * weight
        self._loss = value if self._loss is None else self._loss + value

    def step(self) -> bool:
        """False between micro-batches; at the batch's end, one agreement, then the optimizer step."""
        if not self._last:
            return False
        self._last = False
        failed = self.runtime.any_rank(self._oom)  # the one collective: every rank redoes the batch, or none
        if failed or self._redo:
            self._again(failed)
            return False
        self._retries = 0
        if self.metrics is not None and self._loss is not None:
            self.metrics.on_backward(self._loss)  # the batch's loss, once, however many tries it took
        self._loss = None
        return bool(self.runtime.step())

    def _again(self, failed: bool) -> None:
        """Drop the batch's gradients and, after an OOM anywhere, halve the micro-batch for good."""
        self._drop_gradients()
        self._loss = None
        self._oom = self._redo = False
        self._replay = True
        free_memory(self.runtime.device)
        if not failed:
            return
        self._retries += 1
        size = min(self.micro or self._total, self._total)
        if size <= 1 or self._retries > MAX_RETRIES:
            raise MemoryError(
                f"out of memory with micro-batch {size} after {self._retries - 1} halvings of this step"
                + (f" ({self._error})" if self._error else " (on another rank)")
            )
        self.micro = max(1, size // 2)
        self._announce(self.micro, f"out of memory with {size}")
