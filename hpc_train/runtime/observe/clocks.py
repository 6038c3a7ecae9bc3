"""Where a step's time is read: the host's clock on CPU, CUDA events on a GPU (they time the device, not the
kernel launches). Communication intervals may overlap (DDP's buckets): their union is what counts."""

from __future__ import annotations

import math
import time
from typing import Any


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: overlapping buckets count once."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


class CpuClock:
    """Marks are perf_counter seconds; intervals are already numbers."""

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, intervals: list[tuple[Any, Any]]) -> float:
        return union_seconds(intervals)

    def settle(self) -> None:
        """Nothing is in flight on the host clock."""


class CudaClock:
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
