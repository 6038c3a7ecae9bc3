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
    tensorboard/            event files (a requeued run continues the curves; redone steps replace theirs)
    hpc_train.prom          Prometheus text format, rewritten atomically every ~10 s
    stragglers.jsonl        one line per rank named slower than the others (hpc_train.runtime.observe.straggler)

Straggler detection (``HPC_TRAIN_STRAGGLER_THRESHOLD``, ``HPC_TRAIN_STRAGGLER_WINDOW``) rides on the
same step path: each step hands its wall time and communication intervals to the monitor, which
gathers every rank's compute time once per window and adds an ``"event": "ranks"`` line to steps.jsonl.

``HPC_TRAIN_METRICS=0`` (``submit --no-metrics``, ``rt.init(metrics=False)``) turns all of it off.
"""

from __future__ import annotations

import atexit
import contextlib
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
from hpc_train.runtime.step.memory import peak_bytes

_log = topic_log("metrics")

if TYPE_CHECKING:
    from hpc_train.runtime.engine.backend import BackendRuntime

SWITCH = contract.ENV_METRICS
JSONL = contract.STEPS
PROM = "hpc_train.prom"
TB_DIR = "tensorboard"
TB_TRIES = 3  # attempts to start the TensorBoard writer before the run goes on without its files
FLUSH_S = 2.0
PROM_EVERY_S = 10.0
# Building and checksumming one TensorBoard event costs ~0.1 ms of Python; past this rate each event
# carries the mean of the steps since the previous one, so fast steps do not pay per step.
TB_EVENTS_PER_S = 10.0
RANK_TAGS_UP_TO = 32  # ranks with a TensorBoard tag each; larger jobs get the median and the slowest


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


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: overlapping buckets count once."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


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


class _CpuClock:
    """Marks are perf_counter seconds; intervals are already numbers."""

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, intervals: list[tuple[Any, Any]]) -> float:
        return union_seconds(intervals)

    def settle(self) -> None:
        """Nothing is in flight on the host clock."""


class _CudaClock:
    """Marks are CUDA events on the current stream, so they time the device, not the kernel launches."""

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def mark(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, intervals: list[tuple[Any, Any]]) -> float:
        if not intervals:
            return 0.0
        ref = intervals[0][0]
        return union_seconds([(ref.elapsed_time(a) / 1e3, ref.elapsed_time(b) / 1e3) for a, b in intervals])

    def settle(self) -> None:
        """Wait for the device: events can be read, and host time since the last settle is device time."""
        self.torch.cuda.synchronize()


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
        self.clock: Any = _CudaClock() if device_type == "cuda" else _CpuClock()
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
        self._last_prom = -math.inf
        self._last_tb = time.perf_counter()
        self._header_written = False
        self._closed = False
        self._jsonl: Any = None
        self._tb: Any = None
        self._tb_failures = 0
        self._prom: Any = None
        self._gpu: Callable[[], dict[str, float]] | None = None
        self._gpu_checked = False
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
    def flush(self) -> list[dict[str, Any]]:
        """Turn pending steps into rows and write them (rank 0); returns the rows."""
        pending, self._pending = self._pending, []
        windows, self._windows = self._windows, []
        self._last_flush = time.perf_counter()
        if not pending or not self.writes:
            return []
        events, self._events = self._events, []  # recorded at a step: written after its row
        try:
            rows = self._rows(pending)
            self._write(rows, windows, events)
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
        losses = _to_floats([p[4] for p in pending])
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
            for name, value in zip(extras, _to_floats(list(extras.values()))):
                row.setdefault(name, value)
            rows.append(row)
        rows[-1]["peak_mem_bytes"] = peak_bytes(self.device_type)  # a high-water mark: one sample per flush
        gpu = self._gpu_sample()
        if gpu:
            rows[-1].update(gpu)  # utilisation is a time average: one sample per flush
        return rows

    def _write(
        self, rows: list[dict[str, Any]], windows: list[dict[str, Any]] | None = None, events: list[dict[str, Any]] | None = None
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
        try:
            self._write_tensorboard(rows)
            if windows and self._tb:
                self._write_rank_scalars(windows)
        except Exception as exc:  # TensorBoard's files are a view of steps.jsonl: never lose the record for them
            self._tensorboard_failed(exc)
        now = time.perf_counter()
        if now - self._last_prom >= PROM_EVERY_S:
            self._last_prom = now
            self._write_prometheus(rows)

    def _tensorboard_failed(self, exc: Exception) -> None:
        """A writer that could not start (its thread, under memory pressure) is tried again at the next
        flush, TB_TRIES times in all; one that failed while writing, or too often, stops for the run."""
        self._tb_failures += 1
        again = self._tb is None and self._tb_failures < TB_TRIES
        _log(
            f"TensorBoard files: {type(exc).__name__}: {exc}; {'trying again' if again else 'none from now on'} (steps.jsonl goes on)"
        )
        if not again:
            with contextlib.suppress(Exception):
                if self._tb:
                    self._tb.close()
            self._tb = False

    def _write_tensorboard(self, rows: list[dict[str, Any]]) -> None:
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                _log(f"no TensorBoard files: {exc} (pip install tensorboard)")
                self._tb = False
                return
            assert self.folder is not None
            # a requeued run redoes the steps after its checkpoint: drop the old run's copies of them
            purge = self.start_step + 1 if self.run > 1 else None
            self._tb = SummaryWriter(str(self.folder / TB_DIR), purge_step=purge, filename_suffix=f".run{self.run}")
        if self._tb is False:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        now = time.perf_counter()
        budget = max(1, int((now - self._last_tb) * TB_EVENTS_PER_S))
        self._last_tb = now
        per_event = max(1, math.ceil(len(rows) / budget))
        writer = self._tb._get_file_writer()
        for i in range(0, len(rows), per_event):
            chunk = rows[i : i + per_event]
            values = [Summary.Value(tag=tag, simple_value=v) for tag, v in _tb_scalars(chunk).items()]
            writer.add_summary(Summary(value=values), chunk[-1]["step"], chunk[-1]["time"])
        writer.flush()

    def _write_rank_scalars(self, windows: list[dict[str, Any]]) -> None:
        """One event per window: the median and slowest rank's compute time, and every rank's while
        there are few enough for TensorBoard's chart list to stay readable."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._tb._get_file_writer()
        for window in windows:
            compute = window["compute_ms"]
            known = [c for c in compute if c is not None]
            if not known:
                continue
            scalars = {"ranks/compute_ms_median": window.get("median_ms", 0.0), "ranks/compute_ms_max": max(known)}
            if len(compute) <= RANK_TAGS_UP_TO:
                scalars.update({f"ranks/compute_ms/rank_{r}": c for r, c in enumerate(compute) if c is not None})
            values = [Summary.Value(tag=tag, simple_value=v) for tag, v in scalars.items()]
            writer.add_summary(Summary(value=values), window["last_step"], window["time"])
        writer.flush()

    def _write_prometheus(self, rows: list[dict[str, Any]]) -> None:
        try:
            from prometheus_client import CollectorRegistry, Gauge, write_to_textfile
        except ImportError as exc:
            _log(f"no Prometheus file: {exc} (pip install prometheus_client)")
            self._last_prom = math.inf
            return
        if self._prom is None:
            registry = CollectorRegistry()
            labels = ["job_id", "host"]
            gauges = {
                "step": Gauge("hpc_train_step", "Optimizer steps done", labels, registry=registry),
                "run": Gauge("hpc_train_run", "Run of the job (1 + requeues)", labels, registry=registry),
                "step_s": Gauge("hpc_train_step_seconds", "Mean step time since the last update", labels, registry=registry),
                "samples_per_s": Gauge(
                    "hpc_train_samples_per_second", "Samples per second, all ranks", labels, registry=registry
                ),
                "loss": Gauge("hpc_train_loss", "Rank 0's training loss (last step)", labels, registry=registry),
                "comm_share": Gauge(
                    "hpc_train_comm_share_ratio", "Share of step time in gradient communication", labels, registry=registry
                ),
                "gpu_util": Gauge(
                    "hpc_train_gpu_utilization_ratio", "Rank 0's GPU utilisation (NVML)", labels, registry=registry
                ),
                "gpu_mem_bytes": Gauge(
                    "hpc_train_gpu_memory_used_bytes", "Rank 0's GPU memory in use (NVML)", labels, registry=registry
                ),
                "updated": Gauge(
                    "hpc_train_last_update_timestamp_seconds", "When this file was written", labels, registry=registry
                ),
            }
            self._prom = (registry, gauges, write_to_textfile)
        registry, gauges, write = self._prom
        key = {"job_id": self.job_id or "", "host": socket.gethostname()}
        means = _tb_scalars(rows)
        last = rows[-1]
        values = {
            "step": last["step"],
            "run": self.run,
            "step_s": means.get("time/step_s"),
            "samples_per_s": means.get("throughput/samples_per_s"),
            "loss": last.get("loss"),
            "comm_share": means.get("comm/share"),
            "updated": time.time(),
        }
        if "gpu_util" in last:
            values["gpu_util"] = last["gpu_util"] / 100.0
            values["gpu_mem_bytes"] = last.get("gpu_mem_bytes")
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                gauges[name].labels(**key).set(value)
        assert self.folder is not None
        write(str(self.folder / PROM), registry)
        textfile_dir = os.environ.get(contract.ENV_PROMETHEUS_DIR)  # a site's node-exporter textfile collector
        if textfile_dir and self.job_id:
            write(str(Path(textfile_dir) / f"hpc_train_job_{self.job_id}.prom"), registry)

    def _gpu_sample(self) -> dict[str, float]:
        if self.device_type != "cuda":
            return {}
        if not self._gpu_checked:
            self._gpu_checked = True
            self._gpu = _nvml_sampler()
        if self._gpu is None:
            return {}
        try:
            return self._gpu()
        except Exception as exc:
            _log(f"GPU sampling stopped: {type(exc).__name__}: {exc}")
            self._gpu = None
            return {}

    def close(self) -> None:
        """Write what is pending and a ``run_end`` line; every file is complete afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._last_prom = -math.inf  # the final values, whatever the schedule
            self.flush()
        if not self.writes:
            return
        try:
            if self._jsonl is not None:
                end = {"event": "run_end", "run": self.run, "step": self.step, "time": round(time.time(), 3), **self.at_end}
                self._jsonl.write(json.dumps(end) + "\n")
                self._jsonl.close()
            if self._tb:
                self._tb.close()
            textfile_dir = os.environ.get(contract.ENV_PROMETHEUS_DIR)
            if textfile_dir and self.job_id:  # a finished job must not look alive in Grafana
                Path(textfile_dir, f"hpc_train_job_{self.job_id}.prom").unlink(missing_ok=True)
        except Exception as exc:
            _log(f"closing failed: {type(exc).__name__}: {exc}")
        atexit.unregister(self.close)


def _to_floats(values: list[Any]) -> list[float | None]:
    """Numbers and 0-d tensors to floats, with one device transfer for all the tensors."""
    tensors = [i for i, v in enumerate(values) if hasattr(v, "detach")]
    out: list[Any] = [None if v is None or hasattr(v, "detach") else float(v) for v in values]
    if tensors:
        import torch

        device = values[tensors[0]].device
        numbers = torch.stack([values[i].detach().float().mean().to(device) for i in tensors]).cpu().tolist()
        for i, number in zip(tensors, numbers):
            out[i] = number
    return [v if v is None or math.isfinite(v) else None for v in out]


def _tb_scalars(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of each metric over ``rows`` (one TensorBoard point, one Prometheus update)."""
    out: dict[str, float] = {}
    step_s = sum(r["step_s"] for r in rows if "step_s" in r)
    timed = [r for r in rows if "step_s" in r]
    if timed:
        out["time/step_s"] = step_s / len(timed)
        with_samples = [r for r in timed if "samples" in r]
        seconds = sum(r["step_s"] for r in with_samples)
        if with_samples and seconds > 0:
            out["throughput/samples_per_s"] = sum(r["samples"] for r in with_samples) / seconds
        comm_s = sum(r["comm_s"] for r in timed)
        out["comm/seconds"] = comm_s / len(timed)
        if step_s > 0:
            out["comm/share"] = min(1.0, comm_s / step_s)
    losses = [r["loss"] for r in rows if r.get("loss") is not None]
    if losses:
        out["loss"] = sum(losses) / len(losses)
    for key, tag in (("gpu_util", "gpu/utilization_percent"), ("gpu_mem_bytes", "gpu/memory_used_bytes")):
        if key in rows[-1]:
            out[tag] = rows[-1][key]
    known = {
        "step",
        "time",
        "run",
        "step_s",
        "samples",
        "samples_per_s",
        "loss",
        "comm_s",
        "comm_share",
        "gpu_util",
        "gpu_mem_bytes",
    }
    for name in {k for r in rows for k in r} - known:
        values = [r[name] for r in rows if isinstance(r.get(name), (int, float))]
        if values:
            out[name] = sum(values) / len(values)
    return out


def _nvml_sampler() -> Callable[[], dict[str, float]] | None:
    """GPU utilisation (%) and memory in use (bytes) of this process's GPU, through NVML (pynvml)."""
    try:
        import torch

        device = torch.cuda.current_device()
        torch.cuda.utilization(device)  # raises without pynvml (pip install nvidia-ml-py)
    except Exception as exc:
        _log(f"no GPU utilisation: {type(exc).__name__}: {exc}")
        return None

    def sample() -> dict[str, float]:
        return {"gpu_util": float(torch.cuda.utilization(device)), "gpu_mem_bytes": float(torch.cuda.device_memory_used(device))}

    return sample


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
