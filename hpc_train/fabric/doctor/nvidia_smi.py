"""Parsers of nvidia-smi's outputs (the header, ``--query-gpu``, ``topo -m``, ``nvlink -s``), tested on recorded
outputs from real A100, H100 and RTX 4090 nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_smi_header(text: str) -> tuple[str | None, str | None]:
    """(driver version, highest CUDA version the driver supports) from plain ``nvidia-smi``."""
    driver = re.search(r"Driver Version:\s*([0-9.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    bus_id: str
    driver: str
    memory_mib: int | None


def parse_query_gpu(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        memory = re.match(r"(\d+)", parts[4])
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], parts[3], int(memory.group(1)) if memory else None))
    return gpus


@dataclass
class Topology:
    gpus: list[str]
    links: dict[tuple[str, str], str]  # ("GPU0", "GPU1") -> "NV12" / "PIX" / "SYS" ...; GPU-NIC pairs too
    nics: dict[str, str]  # "NIC0" -> "mlx5_0"
    cpu_affinity: dict[str, str]

    def gpu_pairs(self) -> list[tuple[str, str, str]]:
        return [(a, b, self.links[(a, b)]) for i, a in enumerate(self.gpus) for b in self.gpus[i + 1 :] if (a, b) in self.links]

    def nvlink_pairs(self) -> int:
        return sum(1 for _, _, kind in self.gpu_pairs() if kind.startswith("NV"))

    def best_nic(self, gpu: str) -> tuple[str | None, str | None]:
        order = ["PIX", "PXB", "PHB", "NODE", "SYS"]
        best: tuple[str | None, str | None] = (None, None)
        for nic, dev in self.nics.items():
            kind = self.links.get((gpu, nic))
            if kind in order and (best[1] is None or order.index(kind) < order.index(best[1])):
                best = (dev, kind)
        return best


def parse_topo(text: str) -> Topology:
    """``nvidia-smi topo -m``: the matrix, the NIC legend and each GPU's CPU affinity."""
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if line.startswith("\t") and "GPU0" in line), None)
    if header_at is None:
        return Topology([], {}, {}, {})
    columns = [c.strip() for c in lines[header_at].strip("\t").split("\t")]
    devices = [c for c in columns if re.fullmatch(r"(GPU|NIC)\d+|mlx\d+_\d+", c)]
    topo = Topology([d for d in devices if d.startswith("GPU")], {}, {}, {})
    for line in lines[header_at + 1 :]:
        if not line.strip() or line.startswith("Legend"):
            break
        cells = [c.strip() for c in line.split("\t")]
        row, values = cells[0], cells[1:]
        for column, value in zip(devices, values):
            if value and value != "X":
                topo.links[(row, column)] = value
        if row.startswith("GPU") and len(values) > len(devices):
            topo.cpu_affinity[row] = values[len(devices)]
    for line in lines:
        legend = re.match(r"\s+(NIC\d+):\s+(\S+)", line)
        if legend:
            topo.nics[legend.group(1)] = legend.group(2)
    for column in devices:  # old drivers name NICs in the header directly (mlx5_0)
        if not column.startswith(("GPU", "NIC")):
            topo.nics[column] = column
    return topo


def parse_nvlink(text: str) -> dict[int, dict[int, float | None]]:
    """``nvidia-smi nvlink --status``: {gpu: {link: GB/s, or None when inactive}}."""
    out: dict[int, dict[int, float | None]] = {}
    gpu = None
    for line in text.splitlines():
        head = re.match(r"GPU (\d+):", line)
        if head:
            gpu = int(head.group(1))
            out[gpu] = {}
            continue
        link = re.match(r"\s+Link (\d+):\s*(.*)", line)
        if link and gpu is not None:
            speed = re.match(r"([0-9.]+) GB/s", link.group(2).strip())
            out[gpu][int(link.group(1))] = float(speed.group(1)) if speed else None
    return out
