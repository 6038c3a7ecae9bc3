"""The job-side half of a backend. The default is torch.distributed + DDP; other backends override.

A backend's login-side class names its runtime class by import path (``Backend.runtime``) so the
login node never imports this module's frameworks. Methods are called by :class:`Context`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
from collections.abc import Iterator
from typing import Any

from hpc_train.runtime.environment import DistEnv
from hpc_train.runtime.options import RuntimeOptions


class BackendRuntime:
    """torch.distributed with DDP; precision, clipping and accumulation for every backend."""

    name = "torchrun"

    def __init__(self, env: DistEnv, options: RuntimeOptions) -> None:
        self.env = env
        self.options = options
        self.model: Any = None
        self.optimizer: Any = None
        self.scaler: Any = None
        self.micro_step = 0

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
            dist.init_process_group(self.dist_backend, init_method="env://", rank=self.env.rank,
                                    world_size=self.env.world_size, timeout=datetime.timedelta(minutes=30), **kwargs)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

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
        """Wrap the model for data parallelism (DDP here)."""
        if self.env.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids)
        self._register_comm_hook(ddp)
        return ddp

    def _register_comm_hook(self, ddp: Any) -> None:
        hook = self.options.comm_hook
        if hook == "none":
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif hook == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        else:
            # start compressing after a short warm-up of exact all-reduces, as the PowerSGD paper advises
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=10)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

    def set_gradient_sync(self, sync: bool) -> None:
        """Whether the next backward all-reduces (off for accumulation micro-steps)."""
        if hasattr(self.model, "require_backward_grad_sync"):
            self.model.require_backward_grad_sync = sync

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
        if self.options.grad_clip is not None:
            import torch

            torch.nn.utils.clip_grad_norm_(self.parameters(), self.options.grad_clip)
        self.optimizer_step()
        if self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad()  # set_to_none by default; Horovod's wrapper takes no arguments
        self.set_gradient_sync(accum == 1)
        return True

    def synchronize_gradients(self) -> None:
        """Make gradients identical across ranks before clipping (DDP already did in backward)."""

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
        else:
            self.optimizer.step()

    def parameters(self) -> Iterator[Any]:
        return (p for p in self.model.parameters() if p.grad is not None)

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

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)


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

    if module_types:
        targets = [m for m in model.modules() if isinstance(m, module_types) and m is not model]
    else:
        targets = [m for m in model.children() if any(True for _ in m.parameters())]
    for module in targets:
        forward = module.forward

        def wrapped(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        module.forward = wrapped
    return len(targets)
