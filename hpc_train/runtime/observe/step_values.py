"""The step rows' numbers: losses and extras turned into floats (one device transfer for all), and the
mean of each metric over a few rows, which is what one TensorBoard point and one Prometheus update show."""

from __future__ import annotations

import math
from typing import Any


def to_floats(values: list[Any]) -> list[float | None]:
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


def scalar_means(rows: list[dict[str, Any]]) -> dict[str, float]:
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
