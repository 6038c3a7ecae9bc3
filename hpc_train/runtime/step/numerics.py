"""Bad numerics: a non-finite loss or gradient skips the optimizer step on every rank.

Every optimizer step's gradient norm goes to the metrics (the one ``--grad-clip`` computes anyway, else
one fused norm). A step whose loss or gradient is not finite on any rank is skipped on every rank, its
gradients dropped, counted, and logged once; ``--max-bad-steps N`` of them in a row (default 5, 0: never)
stop the run with :class:`DivergenceError`, which the batch script does not retry, or, with
``--on-divergence rollback``, restore the job's last committed checkpoint in place and train on with
the batches that came after the bad ones.

How every rank learns of one rank's bad loss without a collective of its own: ``ctx.backward`` multiplies
the loss by a seed of 1 (a finite loss: the same gradients, bit for bit) or NaN (a non-finite one), so a
bad loss makes that rank's gradients NaN; the backend's gradient averaging, the collective every step
already has, carries the NaN to every rank, and every rank reads a non-finite norm from its averaged
gradients and decides the same. (On the CPU, where reading a number costs no device sync, the loss is read
instead and only a bad one is seeded.) Where ranks hold different parameters (a ``--parallel`` layout with tp
or pp) the runtime adds one small all-reduce of the flag. Only a bad step costs more: one gather, to
name the ranks whose loss was not finite.

A loss scaler's own overflow skips (fp16's GradScaler, DeepSpeed's fp16 engine) stay as they are: a
non-finite gradient with every loss finite is the scaler searching its scale, counted as a scale skip,
not as divergence. A framework that skips by itself (DeepSpeed's overflow check) is counted, never
skipped twice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from math import isfinite
from typing import TYPE_CHECKING, Any, NoReturn

from hpc_train import contract
from hpc_train.runtime.lifecycle.no_retry import refuse_retry
from hpc_train.runtime.log import topic_log

_log = topic_log("numerics")

if TYPE_CHECKING:
    from hpc_train.runtime.checkpoint.manager import Checkpointer
    from hpc_train.runtime.engine.backend import BackendRuntime

# Rolling back to the same checkpoint again and again, each time skipping other batches, is a run whose
# weights (not its data) diverge: after this many rollbacks to one checkpoint the run stops instead.
ROLLBACKS_PER_CHECKPOINT = 3
EVENT = "bad_step"  # the steps.jsonl line of a skipped step (report reads it)
ROLLBACK_EVENT = "rollback"


def _as_float(norm: Any) -> float:
    """A gradient norm as a number: a tensor's (one read), a DTensor's whole (tensor parallel), 0 for none."""
    if norm is None:
        return 0.0
    if hasattr(norm, "full_tensor"):  # clipping DTensor gradients (tensor parallel) returns a DTensor norm
        norm = norm.full_tensor()
    return float(norm)


class DivergenceError(RuntimeError):
    """Training diverged: too many optimizer steps in a row had a non-finite loss or gradient.

    Running the same job again would diverge the same way, so the run writes the job's no-retry file
    and ``--on-failure requeue`` does not requeue it.
    """


@dataclass
class BadStep:
    """One skipped step, as every rank agreed on it."""

    step: int
    loss_ranks: list[int]  # ranks whose loss was not finite (none: only the averaged gradient was)
    reason: str  # "loss" or "gradient"


@dataclass
class NumericsGuard:
    """One per process; the runtime calls :meth:`check` at each optimizer step, the Context the rest."""

    rank: int = 0
    world_size: int = 1
    max_bad_steps: int = 5
    on_divergence: str = "stop"
    run: int = 1
    no_retry_file: str | None = None
    metrics: Any = None  # the MetricsRecorder: the step number, the row's fields, the event lines
    consecutive: int = 0  # bad steps in a row, up to the current one
    bad_steps: int = 0  # this run's steps skipped for a non-finite loss or gradient
    scale_skips: int = 0  # steps a loss scaler skipped for an overflow (not divergence)
    events: list[dict[str, Any]] = field(default_factory=list)  # what was recorded (tests, ctx users)
    _steps: int = 0  # optimizer steps when metrics are off
    _start: int = 0
    _seeds: list[Any] = field(default_factory=list)  # this step's loss seeds (1 or NaN), one per seeded backward
    _key: Any = None  # the (device, dtype) of the last loss, and the constants made for it
    _one: Any = None
    _zero: Any = None
    # runtime.gradients_agree(), asked once of the runtime in _agreed: it is fixed once the runtime is set up
    _agreed: Any = None
    _agree: bool = True
    _outcome: BadStep | None = None
    _scale_skipped: bool = False
    _rollbacks: dict[int, int] = field(default_factory=dict)

    @classmethod
    def for_runtime(cls, runtime: BackendRuntime) -> NumericsGuard:
        options = runtime.options
        return cls(
            rank=runtime.env.rank,
            world_size=runtime.env.world_size,
            max_bad_steps=options.max_bad_steps,
            on_divergence=options.on_divergence,
            run=int(os.environ.get(contract.ENV_RUN) or 1),
            no_retry_file=os.environ.get(contract.ENV_NO_RETRY_FILE) or None,
            metrics=runtime.metrics,
        )

    # -- the hot path ---------------------------------------------------------------------------
    def on_backward(self, loss: Any) -> Any:
        """The loss to differentiate: times 1 if finite, times NaN if not (see the module docstring)."""
        # On the CPU reading the loss costs no sync and less than the seed's two ops and its backward node,
        # so only a bad loss is seeded there (read as it is: a detached copy would be one op more per step).
        try:
            if loss.is_cpu and isfinite(loss.item()):
                return loss
        except AttributeError:  # not a tensor
            return loss
        except RuntimeError:  # more than one element: seeded as on a device
            pass
        return self._seeded(loss)

    def _seeded(self, loss: Any) -> Any:
        value = loss.detach()
        key = (value.device, value.dtype)
        if key != self._key:  # the constants once per device and dtype, not per step
            import torch

            self._key = key
            self._one, self._zero = torch.ones((), device=key[0], dtype=key[1]), torch.zeros((), device=key[0], dtype=key[1])
        # One fused op, no host sync: 1 + loss * 0 is exactly 1 for a finite loss and NaN for inf or NaN
        # (isfinite then where would be two ops and a temporary, every step).
        seed = self._one.addcmul(value, self._zero)
        self._seeds.append(seed)
        return loss * seed

    def check(self, runtime: BackendRuntime, norm: Any, *, loss_scaling: bool = False) -> bool:
        """At an optimizer step, after averaging: whether to apply it. ``norm`` is this rank's gradient
        norm (a tensor). Reading it is the check's one device sync per optimizer step, and it cannot go:
        whether ``optimizer.step()`` runs is decided on the host (as fp16's GradScaler decides with its
        own read of its overflow flag, which then costs next to nothing after this one). ``loss_scaling``:
        a scaler skips overflowing steps itself (fp16), so a non-finite gradient with finite losses is
        left to it."""
        value = norm if type(norm) is float else _as_float(norm)  # the CPU probe's float needs no conversion
        finite = isfinite(value)
        if self._agreed is not runtime:
            self._agreed, self._agree = runtime, runtime.gradients_agree()
        if not self._agree:  # ranks hold different parameters: their norms differ
            finite = not runtime.any_rank(not finite)
        if self.metrics is not None:
            self.metrics.step_scalars({"grad_norm": value})
        if finite:
            if self._seeds:
                self._seeds.clear()
            return True
        return not self._judge(runtime, loss_scaling)

    def framework_step(self, runtime: BackendRuntime, *, skipped: bool, norm: float | None, loss_scaling: bool) -> None:
        """For a framework that decides the skip itself (DeepSpeed's overflow check): count what it did.
        ``skipped`` must be the same on every rank (the framework agreed on it)."""
        self._note({"grad_norm": norm})  # None: not computed, or not finite
        if not skipped:
            self._seeds.clear()
            return
        self._judge(runtime, loss_scaling)

    def _judge(self, runtime: BackendRuntime, loss_scaling: bool) -> bool:
        """A non-finite step, on every rank: a scale skip (False) or a bad step (True). One gather."""
        mine = self._loss_bad()
        loss_ranks = [r for r, bad in enumerate(runtime.gather_object(mine)) if bad]
        if loss_scaling and not loss_ranks:
            self.scale_skips += 1
            self._scale_skipped = True
            self._note({"scale_skipped": 1})
            return False
        self._outcome = BadStep(self._step_number(), loss_ranks, "loss" if loss_ranks else "gradient")
        self._note({"nonfinite": 1})
        return True

    def _loss_bad(self) -> bool:
        seeds, self._seeds = self._seeds, []
        import torch

        return not all(bool(torch.isfinite(seed).all()) for seed in seeds)  # a bad step only: one read each

    # -- after the step (the Context) -------------------------------------------------------------
    def start_at(self, step: int) -> None:
        if self._steps == 0:
            self._start = int(step)

    def _step_number(self) -> int:
        """The step under way, numbered as the metrics number it."""
        if self.metrics is not None:
            return int(self.metrics.step) + 1
        return self._start + self._steps + 1

    def after_step(self, checkpointers: list[Checkpointer]) -> None:
        """Count the step just made; stop or roll back after too many bad ones in a row (every rank)."""
        self._steps += 1
        outcome = self._outcome
        if outcome is None:
            if self._scale_skipped:  # a scale skip neither counts nor ends the streak
                self._scale_skipped = False
            else:
                self.consecutive = 0
            return
        self._outcome, self._scale_skipped = None, False
        self.consecutive += 1
        self.bad_steps += 1
        due = bool(self.max_bad_steps) and self.consecutive >= self.max_bad_steps
        action = ("rollback" if self.on_divergence == "rollback" else "stop") if due else "skipped"
        self._record(outcome, action)
        if not due:
            return
        if action == "stop":
            self._stop(outcome, f"stopping (--max-bad-steps {self.max_bad_steps}, --on-divergence stop)")
        self._rollback(outcome, checkpointers)

    def _record(self, bad: BadStep, action: str) -> None:
        who = (
            f"non-finite loss on rank{'s' if len(bad.loss_ranks) > 1 else ''} {', '.join(map(str, bad.loss_ranks))}"
            if bad.loss_ranks
            else "non-finite averaged gradient (every loss finite)"
        )
        limit = f"stops after {self.max_bad_steps}" if self.max_bad_steps else "never stops: --max-bad-steps 0"
        if self.rank == 0:
            _log(f"step {bad.step} skipped on every rank: {who}; {self.consecutive} in a row ({limit})")
        event = {
            "event": EVENT,
            "step": bad.step,
            "run": self.run,
            "time": round(time.time(), 3),
            "reason": bad.reason,
            "ranks": bad.loss_ranks,
            "consecutive": self.consecutive,
            "bad_steps": self.bad_steps,
            "action": action,
        }
        self.events.append(event)
        if self.metrics is not None:
            self.metrics.event(event)

    def _note(self, scalars: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.step_scalars(scalars)

    # -- stopping and rolling back ----------------------------------------------------------------
    def _stop(self, bad: BadStep, why: str) -> NoReturn:
        first = bad.step - self.consecutive + 1
        steps = f"step {bad.step}" if first == bad.step else f"steps {first}-{bad.step}"
        message = (
            f"training diverged: {self.consecutive} optimizer step(s) in a row had a non-finite loss or gradient "
            f"({steps}); {why}. Lower the learning rate, clip gradients (--grad-clip), or resubmit with "
            "--on-divergence rollback to restore the last checkpoint and skip past the bad batches"
        )
        if self.rank == 0:
            _log(message)
            refuse_retry(self.no_retry_file, message)
        raise DivergenceError(message)

    def _rollback(self, bad: BadStep, checkpointers: list[Checkpointer]) -> None:
        """Restore the newest committed checkpoint in place; the training loop's batches go on from the
        one after the bad ones (the data position is the loop's, never the checkpoint's)."""
        if not checkpointers:
            self._stop(bad, "--on-divergence rollback needs the job's checkpoints (ctx.checkpointer()), and there are none")
        checkpointer = checkpointers[-1]
        checkpointer.wait()  # a background write commits first: it may be the newest checkpoint
        runtime = checkpointer.ctx.runtime
        found = checkpointer.complete() if self.rank == 0 else []
        target = runtime.gather_object(found[0][0] if found else None)[0]  # rank 0's listing, as restore() uses
        if target is None:
            self._stop(bad, "no checkpoint is committed yet to roll back to")
        if self._rollbacks.get(target, 0) >= ROLLBACKS_PER_CHECKPOINT:
            self._stop(bad, f"rolled back to step {target} {ROLLBACKS_PER_CHECKPOINT} times already")
        restored = checkpointer.restore()
        self._rollbacks[restored] = self._rollbacks.get(restored, 0) + 1
        if self.rank == 0:
            _log(
                f"rolled back to the checkpoint of step {restored} after {self.consecutive} bad steps in a row; "
                f"training goes on from the batch after step {bad.step}"
            )
        event = {"event": ROLLBACK_EVENT, "step": bad.step, "restored": restored, "run": self.run, "time": round(time.time(), 3)}
        self.events.append(event)
        if self.metrics is not None:
            self.metrics.event(event)
        self.consecutive = 0
