"""Job side of the torchrun backend: DistributedDataParallel, its communication hooks and bucket layout."""

from __future__ import annotations

from typing import Any

from hpc_train.runtime.engine.backend import BackendRuntime, average_in_place


class TorchrunRuntime(BackendRuntime):
    """torch.distributed with DDP: gradients are averaged during backward, bucket by bucket."""

    name = "torchrun"

    def wrap(self, model: Any) -> Any:
        """DDP over every rank; ``--comm-hook`` and ``--exact-resume`` apply to it."""
        if self.env.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids)
        if self.options.exact_resume:
            _fix_bucket_layout(ddp)
        self._register_comm_hook(ddp)
        return ddp

    def _register_comm_hook(self, ddp: Any) -> None:
        hook = self.options.comm_hook
        if hook == "none" and self.metrics is None:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import (
            default_hooks,
            powerSGD_hook,
        )

        state: Any = None
        fn: Any
        if hook == "none":
            fn = None  # DDP's own averaging all-reduce, timed by the metrics' hook
        elif hook == "fp16":
            fn = default_hooks.fp16_compress_hook
        elif hook == "bf16":
            fn = default_hooks.bf16_compress_hook
        else:
            # start compressing after a short warm-up of exact all-reduces, as the PowerSGD paper advises
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=10)
            fn = powerSGD_hook.powerSGD_hook
        ddp.register_comm_hook(state, fn if self.metrics is None else self.metrics.comm_hook(fn))

    def set_gradient_sync(self, sync: bool) -> None:
        """Whether DDP all-reduces in the next backward (off for accumulation micro-steps)."""
        # the model is DDP's only with more than one process and without a --parallel layout; read from
        # its __dict__ and set only on a change: a module's attribute lookup and __setattr__ are slow Python,
        # and this runs at every step
        model = self.model
        current = vars(model).get("require_backward_grad_sync") if hasattr(model, "__dict__") else None
        if current is not None and current != sync:
            model.require_backward_grad_sync = sync

    def synchronize_gradients(self) -> None:
        """Average here what DDP did not in backward: under --micro-batch every backward runs without
        its all-reduce, so that a rank out of memory mid-backward leaves no collective half done."""
        # from __dict__, as set_gradient_sync: a plain module's attribute miss raises inside nn.Module.__getattr__
        if getattr(self.model, "__dict__", {}).get("require_backward_grad_sync", True):
            return  # DDP averaged in backward (or there is no DDP)
        average_in_place([p.grad for p in self.model.parameters() if p.grad is not None], self.env.world_size)


def _fix_bucket_layout(ddp: Any) -> None:
    """Give DDP its final gradient-bucket layout now, instead of after the first iteration.

    DDP reduces the first iteration in one bucket, then rebuilds its buckets in the order gradients
    became ready. Where a bucket boundary falls decides how each gradient is summed across ranks, so a
    run resumed from a checkpoint (first iteration again: one bucket) would differ from an
    uninterrupted one in the last bit. A layout fixed at construction is the same in every run. It
    follows parameter order, so for models larger than one bucket (25 MB) DDP overlaps less of the
    communication with backward: turn it off (--no-exact-resume) where that matters more.
    """
    reducer = ddp.reducer
    # private reducer methods: absent from a torch that renamed them, where DDP keeps its own layout
    if hasattr(reducer, "_push_all_rebuilt_params") and hasattr(reducer, "_rebuild_buckets"):
        reducer._push_all_rebuilt_params()
        reducer._rebuild_buckets()
