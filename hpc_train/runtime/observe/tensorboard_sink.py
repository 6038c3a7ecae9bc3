"""TensorBoard's event files, a view of steps.jsonl written at each flush (rank 0): one point per metric
for a few steps at most ``TB_EVENTS_PER_S`` times a second, and each straggler window's per-rank compute
times. A requeued run continues the curves; the steps it redoes replace the old run's (``purge_step``).
A writer that fails never costs the run its steps.jsonl."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

from hpc_train.runtime.log import topic_log
from hpc_train.runtime.observe.step_values import scalar_means

_log = topic_log("metrics")

TB_DIR = "tensorboard"
TB_TRIES = 3  # attempts to start the TensorBoard writer before the run goes on without its files
# Building and checksumming one TensorBoard event costs ~0.1 ms of Python; past this rate each event
# carries the mean of the steps since the previous one, so fast steps do not pay per step.
TB_EVENTS_PER_S = 10.0
RANK_TAGS_UP_TO = 32  # ranks with a TensorBoard tag each; larger jobs get the median and the slowest


class TensorBoardSink:
    """The run's TensorBoard writer, started at the first write."""

    def __init__(self, folder: Path, run: int, start_step: int) -> None:
        self.folder, self.run, self.start_step = folder, run, start_step
        self._writer: Any = None  # None: not started; False: none for this run
        self._failures = 0
        self._last = time.perf_counter()

    @property
    def active(self) -> bool:
        return bool(self._writer)

    def failed(self, exc: Exception) -> None:
        """A writer that could not start (its thread, under memory pressure) is tried again at the next
        flush, TB_TRIES times in all; one that failed while writing, or too often, stops for the run."""
        self._failures += 1
        again = self._writer is None and self._failures < TB_TRIES
        _log(
            f"TensorBoard files: {type(exc).__name__}: {exc}; {'trying again' if again else 'none from now on'} (steps.jsonl goes on)"
        )
        if not again:
            with contextlib.suppress(Exception):
                if self._writer:
                    self._writer.close()
            self._writer = False

    def write(self, rows: list[dict[str, Any]]) -> None:
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                _log(f"no TensorBoard files: {exc} (pip install tensorboard)")
                self._writer = False
                return
            assert self.folder is not None
            # a requeued run redoes the steps after its checkpoint: drop the old run's copies of them
            purge = self.start_step + 1 if self.run > 1 else None
            self._writer = SummaryWriter(str(self.folder / TB_DIR), purge_step=purge, filename_suffix=f".run{self.run}")
        if self._writer is False:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        now = time.perf_counter()
        budget = max(1, int((now - self._last) * TB_EVENTS_PER_S))
        self._last = now
        per_event = max(1, math.ceil(len(rows) / budget))
        writer = self._writer._get_file_writer()
        for i in range(0, len(rows), per_event):
            chunk = rows[i : i + per_event]
            values = [Summary.Value(tag=tag, simple_value=v) for tag, v in scalar_means(chunk).items()]
            writer.add_summary(Summary(value=values), chunk[-1]["step"], chunk[-1]["time"])
        writer.flush()

    def write_ranks(self, windows: list[dict[str, Any]]) -> None:
        """One event per window: the median and slowest rank's compute time, and every rank's while
        there are few enough for TensorBoard's chart list to stay readable."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._writer._get_file_writer()
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

    def close(self) -> None:
        if self._writer:
            self._writer.close()
