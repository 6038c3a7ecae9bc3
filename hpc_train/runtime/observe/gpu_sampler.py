"""The GPU's utilisation and memory in use, sampled through NVML once per flush on rank 0 (a time average:
one sample per flush is what it can say). Sampling that fails stops for the run; training goes on."""

from __future__ import annotations

from collections.abc import Callable

from hpc_train.runtime.log import topic_log

_log = topic_log("metrics")


class GpuSampler:
    """Started at the first sample: NVML is asked only where there is a GPU."""

    def __init__(self) -> None:
        self._sampler: Callable[[], dict[str, float]] | None = None
        self._checked = False

    def sample(self) -> dict[str, float]:
        if not self._checked:
            self._checked = True
            self._sampler = nvml_sampler()
        if self._sampler is None:
            return {}
        try:
            return self._sampler()
        except Exception as exc:
            _log(f"GPU sampling stopped: {type(exc).__name__}: {exc}")
            self._sampler = None
            return {}


def nvml_sampler() -> Callable[[], dict[str, float]] | None:
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
