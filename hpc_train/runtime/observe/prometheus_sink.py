"""The Prometheus text file (``hpc_train.prom`` in the metrics folder, and one per job in a site's
node-exporter textfile folder), rewritten atomically at most every ``PROM_EVERY_S`` seconds by rank 0;
the job's file in the site's folder goes when the run closes, so a finished job never looks alive."""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.runtime.log import topic_log
from hpc_train.runtime.observe.step_values import scalar_means

_log = topic_log("metrics")

PROM = "hpc_train.prom"
PROM_EVERY_S = 10.0


class PrometheusSink:
    """The job's gauges, registered at the first write."""

    def __init__(self, folder: Path, job_id: str | None, run: int) -> None:
        self.folder, self.job_id, self.run = folder, job_id, run
        self._gauges: Any = None
        self._last = -math.inf
        self.off = False  # prometheus_client is missing

    def due(self, now: float, final: bool = False) -> bool:
        """Whether to write now: every PROM_EVERY_S seconds, and the run's final values."""
        if self.off or not (final or now - self._last >= PROM_EVERY_S):
            return False
        self._last = now
        return True

    def write(self, rows: list[dict[str, Any]]) -> None:
        try:
            from prometheus_client import CollectorRegistry, Gauge, write_to_textfile
        except ImportError as exc:
            _log(f"no Prometheus file: {exc} (pip install prometheus_client)")
            self.off = True
            return
        if self._gauges is None:
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
            self._gauges = (registry, gauges, write_to_textfile)
        registry, gauges, write = self._gauges
        key = {"job_id": self.job_id or "", "host": socket.gethostname()}
        means = scalar_means(rows)
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

    def close(self) -> None:
        textfile_dir = os.environ.get(contract.ENV_PROMETHEUS_DIR)
        if textfile_dir and self.job_id:  # a finished job must not look alive in Grafana
            Path(textfile_dir, f"hpc_train_job_{self.job_id}.prom").unlink(missing_ok=True)
