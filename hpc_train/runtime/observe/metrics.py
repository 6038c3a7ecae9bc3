"""What each step cost, recorded inside the job with no code in the training script.

The Context calls the recorder at four points: the prepared model's forward (batch size, and the
start of a run's first step), ``ctx.backward(loss)`` (the loss), ``ctx.step()`` (a step boundary) and
``ctx.shutdown()``. Gradient communication is timed where each backend does it: a DDP communication
hook around every bucket's all-reduce (the time any bucket is in flight), the engine's
``allreduce_gradients`` for DeepSpeed, and ``synchronize_gradients`` for Horovod and MPI (the time
the step waits for the averaged gradients).

The hot path appends one tuple per step. Everything else -- turning losses into numbers (one device
sync), JSON, TensorBoard, the Prometheus file, NVML -- happens in ``flush()``, every couple of
seconds, on rank 0 only. Files (in ``$HPC_TRAIN_JOB_FOLDER/metrics/``)::

    steps.jsonl             one line per optimizer step, plus a ``run_start``/``run_end`` line per run
    tensorboard/            event files (a requeued run continues the curves; redone steps replace theirs;
                            observe.tensorboard_sink)
    hpc_train.prom          Prometheus text format, rewritten atomically every ~10 s (observe.prometheus_sink)
    stragglers.jsonl        one line per rank named slower than the others (hpc_train.runtime.observe.straggler)

Straggler detection (``HPC_TRAIN_STRAGGLER_THRESHOLD``, ``HPC_TRAIN_STRAGGLER_WINDOW``) rides on the
same step path: each step hands its wall time and communication intervals to the monitor, which
gathers every rank's compute time once per window and adds an ``"event": "ranks"`` line to steps.jsonl.

``HPC_TRAIN_METRICS=0`` (``submit --no-metrics``, ``rt.init(metrics=False)``) turns all of it off.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train.runtime.checkpoint.events import CheckpointObserver
from hpc_train.runtime.log import topic_log
from hpc_train.runtime.observe import straggler
from hpc_train.runtime.observe.clocks import CpuClock, CudaClock
from hpc_train.runtime.observe.gpu_sampler import GpuSampler
from hpc_train.runtime.observe.prometheus_sink import PrometheusSink
from hpc_train.runtime.observe.step_values import to_floats
from hpc_train.runtime.observe.tensorboard_sink import TensorBoardSink
from hpc_train.runtime.step.memory import peak_bytes

_log = topic_log("metrics")

if TYPE_CHECKING:
    from hpc_train.runtime.engine.backend import BackendRuntime

SWITCH = contract.ENV_METRICS
JSONL = contract.STEPS
FLUSH_S = 2.0


def enabled(default: bool = True, environ: dict[str, str] | None = None) -> bool:
    """The job's setting (HPC_TRAIN_METRICS) wins over the script's default."""
    raw = (os.environ if environ is None else environ).get(SWITCH, "").strip().lower()
    if raw in ("0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    return default


def metrics_dir(environ: dict[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    if env.get(contract.ENV_METRICS_DIR):
        return Path(env[contract.ENV_METRICS_DIR])
    if env.get(contract.ENV_JOB_FOLDER):
        return Path(env[contract.ENV_JOB_FOLDER]) / contract.METRICS
    return None  # outside a job: measure, write nothing


def batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The leading dimension of the first tensor given to forward (one level into lists and dicts)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            value = next((v for v in value if hasattr(v, "shape")), None)
        elif isinstance(value, dict):
            value = next((v for v in value.values() if hasattr(v, "shape")), None)
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return None


class MetricsRecorder(CheckpointObserver):
    """Per-step measurements of one process; rank 0 writes them (see the module docstring)."""

    def __init__(
        self,
        folder: Path | None,
        *,
        rank: int = 0,
        world_size: int = 1,
        backend: str = "torchrun",
        device_type: str = "cpu",
        run: int | None = None,
        job_id: str | None = None,
        flush_s: float | None = None,
    ) -> None:
        env = os.environ
        self.folder = folder
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.writes = folder is not None and rank == 0
        self.run = run if run is not None else int(env.get(contract.ENV_RUN) or 1)
        self.job_id = job_id if job_id is not None else env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID")
        self.flush_s = flush_s if flush_s is not None else float(env.get(contract.ENV_METRICS_FLUSH_S) or FLUSH_S)
        self.device_type = device_type
        self.clock: Any = CudaClock() if device_type == "cuda" else CpuClock()
        self.step = 0  # optimizer steps, continuing from a restored checkpoint
        self.start_step = 0
        self.started_at = time.time()
        self._mark: float | None = None  # perf_counter at the last boundary; None before this run's first forward
        self._samples = 0
        self._samples_known = False
        self._loss: Any = None
        self._loss_n = 0
        self._extras: dict[str, Any] = {}
        self._comm: list[tuple[Any, Any]] = []
        self._pending: list[tuple[Any, ...]] = []
        self._windows: list[dict[str, Any]] = []  # the straggler monitor's per-rank records, written at flush
        self._events: list[dict[str, Any]] = []  # lines of their own (a skipped step, a rollback), written at flush
        self.straggler: straggler.StragglerMonitor | None = None  # set by attach(): it needs the runtime's gather
        self._last_flush = time.perf_counter()
        self._header_written = False
        self._closed = False
        self._jsonl: Any = None
        # the views of steps.jsonl (rank 0's); None: not written (a test's recorder, or turned off)
        self.tensorboard = TensorBoardSink(folder, self.run, 0) if self.writes and folder else None
        self.prometheus = PrometheusSink(folder, self.job_id, self.run) if self.writes and folder else None
        self.gpu = GpuSampler() if device_type == "cuda" else None
        self.last: dict[str, Any] = {}  # the newest written row (for tests and ctx users)
        self.at_end: dict[str, Any] = {}  # more for the run_end line: every rank's peak memory (the Context's)
        if self.writes:
            atexit.register(self.close)

    # -- wiring ---------------------------------------------------------------------------
    def attach(self, runtime: BackendRuntime) -> None:
        """Time the backend's blocking gradient averaging (Horovod, MPI); DDP is timed by its comm hook.
        Compare the ranks' compute times through the runtime's gather (straggler detection)."""
        from hpc_train.runtime.engine.backend import BackendRuntime

        if type(runtime).synchronize_gradients is not BackendRuntime.synchronize_gradients:
            self.time_method(runtime, "synchronize_gradients")
        parallel = getattr(runtime, "parallel", None)  # pipeline stages do different work: compared apart
        self.straggler = straggler.monitor(
            rank=self.rank,
            world_size=self.world_size,
            gather=runtime.gather_object,
            seconds=self.clock.seconds,
            settle=self.clock.settle,
            gather_numbers=number_gather(runtime, self.rank, self.world_size),
            folder=self.folder if self.rank == 0 else None,
            run=self.run,
            group=getattr(parallel, "stage", None) if parallel is not None and parallel.pp_size > 1 else None,
            samples=True,  # per-rank samples per step (data balance), counted at the model's forward
        )

    def time_method(self, obj: Any, name: str) -> None:
        """Replace ``obj.name`` on the instance by a version that counts its time as communication."""
        method = getattr(obj, name)
        clock, comm = self.clock, self._comm_list

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock.mark()
            try:
                return method(*args, **kwargs)
            finally:
                comm().append((start, clock.mark()))

        setattr(obj, name, timed)

    def _comm_list(self) -> list[tuple[Any, Any]]:
        return self._comm

    def comm_hook(self, hook: Callable[[Any, Any], Any] | None = None) -> Callable[[Any, Any], Any]:
        """A DDP communication hook that runs ``hook`` (None: an averaging all-reduce, as DDP's own) and
        records when each bucket's reduction completes."""
        clock, comm = self.clock, self._comm_list
        if hook is None:
            import torch.distributed as dist

            world = dist.get_world_size()

            def timed_allreduce(state, bucket):  # DDP rejects annotations it does not expect
                start = clock.mark()

                def done(fut: Any) -> Any:
                    comm().append((start, clock.mark()))  # runs when the reduction has finished
                    return fut.value()[0]

                # one future and one callback per bucket: the least a Python hook can cost
                return dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future().then(done)

            return timed_allreduce

        def timed_hook(state, bucket):
            start = clock.mark()

            def done(fut: Any) -> Any:
                comm().append((start, clock.mark()))
                return fut.value()

            return hook(state, bucket).then(done)

        return timed_hook

    def watch(self, model: Any) -> None:
        """Count samples (the batch dimension) and start a run's first step at the model's first forward."""
        register = getattr(model, "register_forward_pre_hook", None)
        if register is None:
            return
        import torch

        grad_enabled = torch.is_grad_enabled

        def before_forward(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not grad_enabled():
                return  # evaluation, not training
            if self._mark is None:
                self._mark = time.perf_counter()
            n = batch_size(args, kwargs)
            if n is not None:
                self._samples += n
                self._samples_known = True

        register(before_forward, with_kwargs=True)

    def after_restore(self, step: int) -> None:
        """Number steps from the checkpoint a requeued run restores (a checkpointer's event)."""
        self.start_at(step)

    def start_at(self, step: int) -> None:
        if self.step == self.start_step and not self._pending and not self._header_written:
            self.step = self.start_step = int(step)

    # -- the hot path ---------------------------------------------------------------------
    def on_backward(self, loss: Any) -> None:
        if self._mark is None:
            self._mark = time.perf_counter()
        value = loss.detach() if hasattr(loss, "detach") else float(loss)
        self._loss = value if self._loss is None else self._loss + value
        self._loss_n += 1

    def log(self, scalars: dict[str, Any]) -> None:
        """Extra scalars (numbers or 0-d tensors; converted at flush) for this step: the one just
        finished when called between ``ctx.step()`` and the next forward, else the one under way."""
        between = self._pending and self._loss_n == 0 and not self._samples_known
        target = self._pending[-1][6] if between else self._extras
        for name, value in scalars.items():
            target[str(name)] = value.detach() if hasattr(value, "detach") else value

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        """Numbers of the step under way from the runtime itself (the gradient norm, a skip)."""
        self._extras.update(scalars)

    def event(self, record: dict[str, Any]) -> None:
        """A line of its own in steps.jsonl (``{"event": ...}``), written with the next flush (rank 0)."""
        if self.writes:
            self._events.append(record)

    def on_step(self) -> None:
        now = time.perf_counter()
        if now - self._last_flush >= self.flush_s:
            self.flush()  # the steps before this one: this one stays open for ctx.log() until the next
        self.step += 1
        step_s = now - self._mark if self._mark is not None else None
        loss = self._loss / self._loss_n if self._loss_n else None
        samples = self._samples if self._samples_known else None
        self._pending.append((self.step, time.time(), step_s, samples, loss, self._comm, self._extras))
        if self.straggler is not None:
            window = self.straggler.on_step(self.step, step_s, self._comm, samples)  # a gather once per window
            if window is not None and self.writes:
                self._windows.append(window)
        self._comm, self._extras = [], {}
        self._loss, self._loss_n, self._samples, self._samples_known = None, 0, 0, False
        self._mark = now

    # -- writing --------------------------------------------------------------------------
    def flush(self, final: bool = False) -> list[dict[str, Any]]:
        """Turn pending steps into rows and write them (rank 0); returns the rows. ``final``: the run's last
        values, which the Prometheus file gets whatever its schedule."""
        pending, self._pending = self._pending, []
        windows, self._windows = self._windows, []
        self._last_flush = time.perf_counter()
        if not pending or not self.writes:
            return []
        events, self._events = self._events, []  # recorded at a step: written after its row
        try:
            rows = self._rows(pending)
            self._write(rows, windows, events, final)
        except Exception as exc:  # metrics must never end a training run
            _log(f"disabled after an error: {type(exc).__name__}: {exc}")
            self.writes = False
            return []
        self.last = rows[-1]
        return rows

    def _rows(self, pending: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()  # once per flush: losses and event timings are final
        losses = to_floats([p[4] for p in pending])
        rows = []
        for (step, wall, step_s, samples, _, comm, extras), loss in zip(pending, losses):
            row: dict[str, Any] = {"step": step, "time": round(wall, 3), "run": self.run}
            if step_s is not None:
                row["step_s"] = round(step_s, 6)
            if samples is not None:
                row["samples"] = samples * self.world_size  # ranks get equal batches (DistributedSampler)
                if row.get("step_s"):  # from the written step time, so the two always agree
                    row["samples_per_s"] = round(row["samples"] / row["step_s"], 3)
            if loss is not None:
                row["loss"] = loss
            comm_s = self.clock.seconds(comm)
            row["comm_s"] = round(comm_s, 6)
            if step_s:
                row["comm_share"] = round(min(1.0, comm_s / step_s), 5)
            for name, value in zip(extras, to_floats(list(extras.values()))):
                row.setdefault(name, value)
            rows.append(row)
        rows[-1]["peak_mem_bytes"] = peak_bytes(self.device_type)  # a high-water mark: one sample per flush
        gpu = self.gpu.sample() if self.gpu else {}
        if gpu:
            rows[-1].update(gpu)  # utilisation is a time average: one sample per flush
        return rows

    def _write(
        self,
        rows: list[dict[str, Any]],
        windows: list[dict[str, Any]] | None = None,
        events: list[dict[str, Any]] | None = None,
        final: bool = False,
    ) -> None:
        assert self.folder is not None
        if self._jsonl is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.folder / JSONL, "a", buffering=1 << 16)  # noqa: SIM115 (kept open for the run)
        if not self._header_written:
            self._header_written = True
            header = {
                "event": "run_start",
                "run": self.run,
                "start_step": self.start_step,
                "time": round(self.started_at, 3),
                "job_id": self.job_id,
                "backend": self.backend,
                "world_size": self.world_size,
                "host": socket.gethostname(),
                "device": self.device_type,
            }
            self._jsonl.write(json.dumps(header) + "\n")
        lines = rows + (windows or []) + (events or [])
        self._jsonl.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines))
        self._jsonl.flush()  # to the OS: readable from the login node; no fsync per flush
        self._write_views(rows, windows, final)

    def _write_views(self, rows: list[dict[str, Any]], windows: list[dict[str, Any]] | None, final: bool = False) -> None:
        if self.tensorboard is not None:
            self.tensorboard.start_step = self.start_step
            try:
                self.tensorboard.write(rows)
                if windows and self.tensorboard.active:
                    self.tensorboard.write_ranks(windows)
            except Exception as exc:  # TensorBoard's files are a view of steps.jsonl: never lose the record for them
                self.tensorboard.failed(exc)
        if self.prometheus is not None and self.prometheus.due(time.perf_counter(), final):
            self.prometheus.write(rows)

    def close(self) -> None:
        """Write what is pending and a ``run_end`` line; every file is complete afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self.flush(final=True)
        if not self.writes:
            return
        try:
            if self._jsonl is not None:
                end = {"event": "run_end", "run": self.run, "step": self.step, "time": round(time.time(), 3), **self.at_end}
                self._jsonl.write(json.dumps(end) + "\n")
                self._jsonl.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
            if self.prometheus is not None:
                self.prometheus.close()
        except Exception as exc:
            _log(f"closing failed: {type(exc).__name__}: {exc}")
        atexit.unregister(self.close)


def number_gather(runtime: BackendRuntime, rank: int, world_size: int) -> Callable[[float | None], list[float | None]]:
    """Every rank's number through one all-reduce of a float per rank, each rank filling its own slot.

    Every backend's runtime has an all-reduce, and this one is cheaper than ``gather_object`` (pickling
    and two collectives): what a check every few dozen steps can afford. NaN stands for None.
    """

    def gather(value: float | None) -> list[float | None]:
        import torch

        slots = torch.zeros(world_size, dtype=torch.float64, device=runtime.device)  # NCCL reduces device memory
        slots[rank] = math.nan if value is None else value
        return [None if math.isnan(v) else v for v in runtime.all_reduce(slots).tolist()]

    return gather


def recorder_for(backend: str, runtime: BackendRuntime, default: bool = True) -> MetricsRecorder | None:
    """The recorder for this process, attached to ``runtime``; None when metrics are off."""
    if not enabled(default):
        return None
    device_type = getattr(runtime.device, "type", "cpu")
    env = runtime.env  # Horovod and MPI correct the launcher's view in init()
    recorder = MetricsRecorder(metrics_dir(), rank=env.rank, world_size=env.world_size, backend=backend, device_type=device_type)
    recorder.attach(runtime)
    return recorder
