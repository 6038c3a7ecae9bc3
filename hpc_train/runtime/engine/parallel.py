"""Inside the job: the device mesh of a ``--parallel`` layout and the helpers that train on it.

The plan exports the layout as ``HPC_TRAIN_PARALLEL``; ``rt.init()`` then mixes :class:`LayoutRuntime`
in front of the backend's runtime class. The mesh has the axes ``pp, dp, tp`` (tp innermost: a
tensor-parallel group is consecutive ranks, so it stays on one node):

    ctx.mesh["tp"]                   the 1-D tensor-parallel mesh (for parallelize_module)
    ctx.parallel.dp_group            data-parallel process group (sampler, gradient averaging)
    ctx.parallel.stage               this rank's pipeline stage index

With a layout the runtime does not wrap the model for data parallelism (DDP under torchrun): that
would all-reduce over every rank, but only the ranks of one data-parallel group hold the same shard of
the same stage. Instead the gradients are averaged over the dp group, in one coalesced all-reduce,
before clipping and the optimizer step. State is saved with torch.distributed.checkpoint
(checkpoint/sharded.py). A runtime whose framework has its own engine for this declares
``BackendRuntime.owns_parallelism`` and gets the mesh only.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpc_train.runtime.engine.parallel_state import ParallelState
from hpc_train.submission.layout import AXES, ENV_VAR, Layout, parse

if TYPE_CHECKING:
    from hpc_train.runtime.engine.backend import BackendRuntime
    from hpc_train.runtime.views import ContextView

SCHEDULES = ("gpipe", "1f1b")


def layout_from_env(environ: Mapping[str, str] | None = None, world_size: int | None = None) -> Layout | None:
    raw = (os.environ if environ is None else environ).get(ENV_VAR)
    return parse(raw, world_size=world_size) if raw else None


def build_mesh(layout: Layout, device_type: str) -> ParallelState:
    from torch.distributed.device_mesh import init_device_mesh

    return ParallelState(layout, init_device_mesh(device_type, layout.shape, mesh_dim_names=AXES))


def with_layout(cls: type[BackendRuntime], environ: Mapping[str, str] | None = None) -> type[BackendRuntime]:
    """``cls`` itself without a layout; with one, ``cls`` with the mesh, dp-group gradients and sharded state.

    A runtime whose framework runs its own parallel engine (DeepSpeed's pipeline) sets
    ``owns_parallelism`` and gets the mesh only.
    """
    if not (os.environ if environ is None else environ).get(ENV_VAR):
        return cls
    mixin = MeshOnly if cls.owns_parallelism else LayoutRuntime
    return type(f"{cls.__name__}With{mixin.__name__}", (mixin, cls), {})


class MeshOnly:
    """Builds the device mesh after the backend started its process group."""

    parallel: ParallelState

    def init(self) -> None:
        super().init()  # type: ignore[misc]
        layout = layout_from_env(world_size=self.env.world_size)  # type: ignore[attr-defined]
        assert layout is not None
        if layout.size != self.env.world_size:  # type: ignore[attr-defined]
            raise RuntimeError(f"{ENV_VAR}={layout} needs {layout.size} processes, this job has {self.env.world_size}")  # type: ignore[attr-defined]
        if self.env.world_size == 1:  # type: ignore[attr-defined]
            _single_process_group(self.dist_backend)  # type: ignore[attr-defined]
        self.parallel = build_mesh(layout, self.device.type)  # type: ignore[attr-defined]


class LayoutRuntime(MeshOnly):
    """DDP replaced by dp-group gradient averaging; checkpoints through torch.distributed.checkpoint."""

    def wrap(self, model: Any) -> Any:
        return model  # gradients are averaged over the dp group in synchronize_gradients

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        model, optimizer = super().prepare(model, optimizer)  # type: ignore[misc]
        _broadcast_parameters(model, self.parallel)  # what DDP's constructor would do, within the dp group
        return model, optimizer

    def synchronize_gradients(self) -> None:
        average_gradients(self.model, self.parallel)  # type: ignore[attr-defined]

    def checkpoint_state(self) -> dict[str, Any] | None:
        return None  # sharded: every rank writes its part in write_engine_state

    def write_engine_state(self, folder: str) -> None:
        import hpc_train.runtime.checkpoint.sharded as sharded_checkpoint

        sharded_checkpoint.save(folder, self.unwrap(self.model), self.optimizer, self.scaler)  # type: ignore[attr-defined]

    def start_engine_state(self, folder: str) -> Callable[[], None] | None:
        import hpc_train.runtime.checkpoint.sharded as sharded_checkpoint

        saver = self.__dict__.setdefault("_async_saver", sharded_checkpoint.AsyncSaver())
        return saver.start(folder, self.unwrap(self.model), self.optimizer, self.scaler)  # type: ignore[attr-defined, no-any-return]

    def load_checkpoint_state(self, state: dict[str, Any] | None, folder: str) -> None:
        import hpc_train.runtime.checkpoint.sharded as sharded_checkpoint

        sharded_checkpoint.load(folder, self.unwrap(self.model), self.optimizer, self.scaler)  # type: ignore[attr-defined]


def _single_process_group(backend: str) -> None:
    """A mesh needs a process group even for one process (a reference run with dp=1,tp=1,pp=1)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", rank=0, world_size=1)


def _local(tensor: Any) -> Any:
    """The tensor this rank holds (a DTensor's shard; the tensor itself otherwise), to change in place.

    ``to_local()`` is an autograd op meant for forward code; collectives here write the shard itself.
    """
    return tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor


def _broadcast_parameters(model: Any, state: ParallelState) -> None:
    if state.dp_size == 1:
        return
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(_local(tensor), group=state.dp_group, group_src=0)


def average_gradients(model: Any, state: ParallelState) -> None:
    """Average gradients over the data-parallel group: one flat all-reduce, in parameter order."""
    if state.dp_size == 1:
        return
    from hpc_train.runtime.engine.backend import average_in_place

    average_in_place([_local(p.grad) for p in model.parameters() if p.grad is not None], state.dp_size, state.dp_group)


def _require(ctx: ContextView) -> ParallelState:
    state = ctx.parallel
    if state is None:
        raise RuntimeError(f"no parallel layout: submit with --parallel (it sets {ENV_VAR}), e.g. --parallel dp=2,tp=2")
    return state


# -- tensor parallel ---------------------------------------------------------------------------------
def _style(value: Any) -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if isinstance(value, str):
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        if value not in styles:
            raise ValueError(f"unknown tensor-parallel style {value!r}: use 'colwise', 'rowwise' or a ParallelStyle")
        return styles[value]()
    return value


def tensor_parallel(ctx: ContextView, module: Any, plan: Mapping[str, Any]) -> Any:
    """Shard ``module``'s submodules over the tp group: ``{"mlp.fc1": "colwise", "mlp.fc2": "rowwise"}``.

    Values may be ParallelStyle objects (ColwiseParallel(...), PrepareModuleInput, ...). Weights are
    taken from tp rank 0, so every rank may build the model the same way first.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    state = _require(ctx)
    module = module.to(ctx.device)
    if state.tp_size == 1:
        return module
    return parallelize_module(module, state.mesh["tp"], {name: _style(style) for name, style in plan.items()})


# -- pipeline parallel -------------------------------------------------------------------------------
def stage_bounds(num_layers: int, num_stages: int, stage: int) -> tuple[int, int]:
    """The layers [lo, hi) of ``stage`` when ``num_layers`` are split as evenly as possible (earlier stages get the extra)."""
    if num_layers < num_stages:
        raise ValueError(f"{num_layers} layers cannot fill {num_stages} pipeline stages")
    base, extra = divmod(num_layers, num_stages)
    lo = stage * base + min(stage, extra)
    return lo, lo + base + (1 if stage < extra else 0)


def stage_module(layers: Sequence[Any], num_stages: int, stage: int) -> Any:
    """This stage's layers as one module whose parameter names are the full model's (``3.fc1.weight``),
    so every stage's checkpoint keys are distinct."""
    import torch

    lo, hi = stage_bounds(len(layers), num_stages, stage)
    return torch.nn.Sequential(OrderedDict((str(i), layers[i]) for i in range(lo, hi)))


class Pipeline:
    """One pipeline stage and its schedule: ``loss = pipe.step(inputs, targets)`` runs forward and
    backward over the micro-batches; call ``ctx.step()`` after it as usual."""

    def __init__(
        self, ctx: ContextView, layers: Sequence[Any], loss_fn: Callable[..., Any], microbatches: int, schedule: str = "gpipe"
    ) -> None:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
        )

        if schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {schedule!r}: use one of {SCHEDULES}")
        self.state = state = _require(ctx)
        self.microbatches = microbatches
        self.module = stage_module(list(layers), state.pp_size, state.stage).to(ctx.device)
        self.stage = PipelineStage(self.module, state.stage, state.pp_size, ctx.device, group=state.pp_group)
        schedule_cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        self.schedule = schedule_cls(self.stage, n_microbatches=microbatches, loss_fn=loss_fn)
        self.device = ctx.device

    def step(self, inputs: Any, targets: Any) -> Any:
        """Forward and backward of one batch; the mean micro-batch loss, on every stage."""
        import torch
        import torch.distributed as dist

        state = self.state
        losses: list[Any] = []
        if state.pp_size == 1:
            self.schedule.step(inputs, target=targets, losses=losses)
        elif state.is_first_stage:
            self.schedule.step(inputs)
        elif state.is_last_stage:
            self.schedule.step(target=targets, losses=losses)
        else:
            self.schedule.step()
        loss = torch.stack([x.detach().float() for x in losses]).mean() if losses else torch.zeros((), device=self.device)
        if state.pp_size > 1:  # the last stage has the loss; every stage reports it
            dist.broadcast(loss, group=state.pp_group, group_src=state.pp_size - 1)
        return loss


def pipeline(
    ctx: ContextView, layers: Sequence[Any], loss_fn: Callable[..., Any], *, microbatches: int, schedule: str = "gpipe"
) -> Any:
    """This rank's pipeline stage of ``layers`` (split evenly), with a GPipe or 1F1B schedule.

    A runtime that declares ``owns_parallelism`` (DeepSpeed's) runs its framework's pipeline engine instead.
    """
    if ctx.runtime.owns_parallelism:
        return ctx.runtime.pipeline(layers, loss_fn, microbatches=microbatches)
    return Pipeline(ctx, layers, loss_fn, microbatches, schedule)


def dp_all_reduce_mean(ctx: ContextView, tensor: Any) -> Any:
    """The mean of ``tensor`` over the data-parallel group (e.g. a loss to report)."""
    import torch.distributed as dist

    state = _require(ctx)
    if state.dp_size > 1:
        dist.all_reduce(tensor, group=state.dp_group)
        tensor /= state.dp_size
    return tensor
