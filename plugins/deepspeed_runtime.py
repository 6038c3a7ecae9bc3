"""Job side of the deepspeed backend: deepspeed.init_distributed, the engine, its backward and step."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc_train_backends import deepspeed_async, deepspeed_reshard

from hpc_train.contract import ENV_CHECKPOINT_DIR, ENV_PARALLEL
from hpc_train.runtime.engine.backend import BackendRuntime
from hpc_train.runtime.log import log


class DeepSpeedRuntime(BackendRuntime):
    name = "deepspeed"
    # with --parallel, DeepSpeed's own pipeline engine averages over dp and saves; hpc_train adds the mesh
    owns_parallelism = True
    # the engine writes its own files; ZeRO partitions load at another size through the universal checkpoint
    engine_checkpoint = True
    pipeline_microbatches: int | None = None

    def init(self) -> None:
        import deepspeed

        for key, value in self.env.as_torch_env().items():
            os.environ.setdefault(key, value)
        deepspeed.init_distributed(
            dist_backend=self.dist_backend,
            auto_mpi_discovery=False,
            init_method="env://",
            rank=self.env.rank,
            world_size=self.env.world_size,
        )

    def ds_config(self) -> dict[str, Any]:
        """The config the job wrote; built from the runtime options when run outside hpc_train's launch."""
        from hpc_train_backends.deepspeed import CONFIG_ENV, DeepSpeedOptions, JobTraining, build_ds_config

        raw = os.environ.get(CONFIG_ENV)
        if raw:
            return json.loads(raw)
        from hpc_train.config.validate import validate

        options = validate(DeepSpeedOptions, self.options.backend_options)
        return build_ds_config(options, JobTraining(self.options.precision, self.options.grad_accum, self.options.grad_clip))

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        import deepspeed

        config = self.ds_config()
        if self.pipeline_microbatches is not None:
            # the pipeline engine runs one micro-batch per accumulation step and supports ZeRO-0/1 only
            config["gradient_accumulation_steps"] = self.pipeline_microbatches
            config.pop("train_batch_size", None)
            zero = config.setdefault("zero_optimization", {})
            zero["stage"] = min(int(zero.get("stage", 0)), 1)
        model = model.to(self.device)
        kwargs: dict[str, Any] = {"optimizer": optimizer} if optimizer is not None else {"model_parameters": model.parameters()}
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, **kwargs)
        if config.get("bf16", {}).get("enabled") or config.get("fp16", {}).get("enabled"):
            _cast_float_inputs(engine.module)
        self.model, self.optimizer = engine, optimizer
        if self.metrics is not None:  # the engine averages gradients here at accumulation boundaries
            self.metrics.time_method(engine, "allreduce_gradients")
        return engine, optimizer

    def backward(self, loss: Any) -> None:
        self.model.backward(loss)  # the engine scales for accumulation and fp16 itself

    def step(self) -> bool:
        if self.pipeline_microbatches is not None:
            self.micro_step += 1
            return True  # train_batch() already stepped
        boundary = self.model.is_gradient_accumulation_boundary()
        if boundary and self.numerics is not None:
            self._checked_step()
        else:
            self.model.step()  # clips, steps and zeroes at boundaries, per the ds_config
        self.micro_step += 1
        return bool(boundary)

    def _checked_step(self) -> None:
        """The engine's step with the numerics check. Its ZeRO, bf16 and fp16 optimizers skip a
        non-finite step themselves (an overflow, agreed across ranks): counted, not skipped twice. A
        plain torch optimizer (no ZeRO, fp32) does not: hpc_train checks the averaged gradients first and
        drops them, so the engine's step updates nothing."""
        engine = self.model
        if not hasattr(engine.optimizer, "overflow"):
            if not self.numerics.check(self, self.gradient_norm()):
                engine.zero_grad()  # no gradients: the optimizer leaves every parameter as it is
            engine.step()
            return
        skipped_before = engine.skipped_steps
        engine.step()
        norm = engine.get_global_grad_norm()
        finite = norm is not None and math.isfinite(float(norm))
        self.numerics.framework_step(
            self,
            skipped=engine.skipped_steps > skipped_before,
            norm=float(norm) if finite else None,
            loss_scaling=bool(engine.fp16_enabled()),
        )

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)

    def checkpoint_state(self) -> dict[str, Any] | None:
        return None  # the engine holds model, optimizer and loss scale, sharded across ranks

    def write_engine_state(self, folder: str) -> None:
        # every rank must call save_checkpoint (rank 0 alone hangs)
        self.model.save_checkpoint(folder, tag=deepspeed_reshard.TAG)

    def start_engine_state(self, folder: str) -> Callable[[], None] | None:
        """The engine's save with its files written in the background: DeepSpeed builds the state dicts,
        they are copied into kept buffers now, and written when the checkpoint writer calls the waiter."""
        engine = self.model
        staging = self.__dict__.setdefault("_engine_staging", {})
        deferred = deepspeed_async.DeferredWrites(engine.checkpoint_engine, staging, self._writers_group())
        own, engine.checkpoint_engine = engine.checkpoint_engine, deferred
        try:
            engine.save_checkpoint(folder, tag=deepspeed_reshard.TAG)  # every rank, as for a synchronous save
        finally:
            engine.checkpoint_engine = own
        return deferred.write_all

    def _writers_group(self) -> Any:
        """A gloo group of the ranks' writer threads, made at the first async save (every rank is there):
        their barrier never interleaves with training's collectives."""
        if self.env.world_size == 1:
            return None
        if "_writers" not in self.__dict__:
            import torch.distributed as dist

            self.__dict__["_writers"] = dist.new_group(backend="gloo")
        return self.__dict__["_writers"]

    def reshard_refusal(self) -> str | None:
        if self.pipeline_microbatches is not None or (self.parallel is not None and self.parallel.pp_size > 1):
            return (
                "DeepSpeed's pipeline engine writes its layers per stage, which hpc_train does not convert; "
                "resume it with the world size that saved it"
            )
        engine = self.model
        if engine is None or (engine.zero_optimization_stage() == 0 and not engine.bfloat16_enabled()):
            return None  # one full state, not partitioned: it loads at any size as it is
        return deepspeed_reshard.unconvertible(getattr(self.optimizer, "optimizer", self.optimizer))

    def load_checkpoint_state(self, state: dict[str, Any] | None, folder: str) -> None:
        saved = deepspeed_reshard.saved_partitions(Path(folder) / deepspeed_reshard.TAG)
        if saved is None or saved == self._dp_size():
            self._load_engine(folder, universal=False)
        else:
            self._load_resharded(Path(folder), saved)

    def _dp_size(self) -> int:
        return int(getattr(self.model, "dp_world_size", None) or self.env.world_size)

    def _load_engine(self, folder: str, *, universal: bool) -> None:
        # the flag is what the ds_config's checkpoint.load_universal sets; the engine reads it as it loads
        config = self.model._config
        before, config.load_universal_checkpoint = config.load_universal_checkpoint, universal
        try:
            path, _ = self.model.load_checkpoint(
                folder, tag=deepspeed_reshard.TAG, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        finally:
            config.load_universal_checkpoint = before
        if path is None:
            raise RuntimeError(f"DeepSpeed found no engine checkpoint in {folder}")

    def _load_resharded(self, folder: Path, saved: int) -> None:
        """Rank 0 converts the partitions of ``saved`` ranks to a universal checkpoint, every rank loads it."""
        scratch = deepspeed_reshard.scratch_folder(os.environ.get(ENV_CHECKPOINT_DIR))
        if self.env.rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)  # no outcome of an earlier attempt is read
        self.barrier()
        if self.env.rank == 0:
            try:
                problem = deepspeed_reshard.convert(folder / deepspeed_reshard.TAG, scratch / deepspeed_reshard.TAG)
            except Exception as exc:  # the others wait for an outcome: they get this one
                problem = f"{type(exc).__name__}: {exc}"
            deepspeed_reshard.write_outcome(scratch, problem)
        else:
            problem = deepspeed_reshard.wait_for_outcome(scratch)
        if problem:
            self.barrier()  # every rank has read the outcome
            if self.env.rank == 0:
                shutil.rmtree(scratch, ignore_errors=True)
            raise RuntimeError(f"converting the ZeRO partitions of {saved} ranks to a universal checkpoint failed: {problem}")
        try:
            self._load_engine(str(scratch), universal=True)
        finally:
            self.gather_object(None)  # every rank has read the conversion before it goes
            if self.env.rank == 0:
                shutil.rmtree(scratch, ignore_errors=True)
        if self.env.rank == 0:
            log(
                f"DeepSpeed: the ZeRO partitions of {saved} data-parallel ranks loaded into {self._dp_size()} (universal checkpoint)"
            )

    def pipeline(self, layers: Any, loss_fn: Any, *, microbatches: int) -> DeepSpeedPipeline:
        """``ctx.pipeline(...)`` under this backend: DeepSpeed's PipelineModule and pipeline engine."""
        return DeepSpeedPipeline(self, layers, loss_fn, microbatches)


class DeepSpeedPipeline:
    """``pipe.module`` goes to ``ctx.prepare``; ``pipe.step(x, y)`` is the engine's train_batch (forward,
    backward and optimizer step over the micro-batches, 1F1B) and returns the mean loss on every rank."""

    def __init__(self, runtime: DeepSpeedRuntime, layers: Any, loss_fn: Any, microbatches: int) -> None:
        from deepspeed.pipe import PipelineModule

        if runtime.parallel is None:
            raise RuntimeError(f"no parallel layout: submit with --parallel (it sets {ENV_PARALLEL}), e.g. --parallel dp=2,pp=2")
        self.runtime = runtime
        self.microbatches = microbatches
        runtime.pipeline_microbatches = microbatches
        stages = runtime.parallel.pp_size
        self.module = PipelineModule(layers=list(layers), num_stages=stages, loss_fn=loss_fn, partition_method="uniform")

    def step(self, inputs: Any, targets: Any) -> Any:
        pairs = zip(inputs.chunk(self.microbatches), targets.chunk(self.microbatches), strict=True)
        return self.runtime.model.train_batch(iter(pairs))


def _cast_float_inputs(module: Any) -> None:
    """The engine holds bf16/fp16 weights; cast floating inputs to match so one script fits all backends."""
    import torch

    dtype = next(module.parameters()).dtype
    forward = module.forward

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        return forward(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    module.forward = wrapped
