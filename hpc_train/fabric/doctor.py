"""``doctor``: is this node (login or compute) fit to run the site's jobs? Each check: ok / warn / fail
and what to do about it.

Everything is read from commands and files (nvidia-smi, /sys, sinfo, package metadata), never by
importing torch: the login-side CLI stays light, and a broken CUDA install cannot crash the doctor
that is meant to diagnose it. Commands go through a ``runner`` and files through ``sys_root``, so
the parsers are tested on recorded outputs from real A100, H100 and RTX 4090 nodes.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.submission import slurm_cmd

OK, WARN, FAIL = "ok", "warn", "fail"
Runner = Callable[[list[str]], "tuple[int | None, str]"]  # (exit status or None when not found, output)


@dataclass
class Check:
    name: str
    status: str
    summary: str
    fix: str | None = None
    details: list[str] = field(default_factory=list)


@dataclass
class Report:
    host: str
    context: str  # "login node" / "compute node (job 42)"
    checks: list[Check]

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.checks}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else OK

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "context": self.context, "status": self.status, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        return cls(data["host"], data["context"], [Check(**c) for c in data["checks"]])


def run_command(cmd: list[str], timeout: float = 20, env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    if shutil.which(cmd[0]) is None:
        return None, ""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    except OSError as exc:
        return 126, str(exc)
    return done.returncode, done.stdout + done.stderr


# --- parsers for nvidia-smi's outputs ---------------------------------------------------------

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


# --- the checks ------------------------------------------------------------------------------


@dataclass
class NodeFacts:
    """What the checks need to know about the site and this node."""

    site: Any = None  # SiteConfig, or None without a site
    partition: str | None = None
    profile: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the job's fabric variables: site < partition < profile
    in_job: bool = False
    expected_gpus: int = 0
    site_warnings: list[str] = field(default_factory=list)


def _is_off(value: str | None) -> bool:
    return value is None or value.strip().lower() in ("", "0", "false", "no")


def check_gpus(ctx: NodeFacts, run: Runner) -> list[Check]:
    code, header = run(["nvidia-smi"])
    if code is None:
        if ctx.in_job and ctx.expected_gpus:
            return [
                Check(
                    "gpus",
                    FAIL,
                    f"no GPU: nvidia-smi not found, but partition {ctx.partition!r} has {ctx.expected_gpus} per node",
                    "the node lacks the NVIDIA driver; drain it and tell the admins",
                )
            ]
        later = f"; `doctor --submit -p {ctx.partition}` checks the GPU nodes" if ctx.expected_gpus else ""
        return [
            Check("gpus", OK, f"no GPU on this machine (nvidia-smi not found): GPU, topology and NVLink checks skipped{later}")
        ]
    if code != 0:
        return [
            Check(
                "gpus",
                FAIL,
                "nvidia-smi failed: " + (header.strip().splitlines() or ["no output"])[0],
                "the driver is not loaded or a GPU fell off the bus; check `dmesg`, reboot or drain the node",
            )
        ]
    driver, cuda = parse_smi_header(header)
    _, listing = run(["nvidia-smi", "--query-gpu=index,name,pci.bus_id,driver_version,memory.total", "--format=csv,noheader"])
    gpus = parse_query_gpu(listing)
    models = sorted({g.name for g in gpus})
    memory = f" ({round(gpus[0].memory_mib / 1024)} GB)" if gpus and gpus[0].memory_mib else ""
    summary = f"{len(gpus)} x {', '.join(models) or 'unknown'}{memory}, driver {driver}, CUDA {cuda}"
    checks = []
    if ctx.expected_gpus and len(gpus) < ctx.expected_gpus:
        checks.append(
            Check(
                "gpus",
                FAIL if ctx.in_job else WARN,
                summary + f"; partition {ctx.partition!r} promises {ctx.expected_gpus}",
                "a GPU is missing or hidden: check `nvidia-smi -q` and the node's gres.conf",
            )
        )
    elif len(models) > 1:
        checks.append(Check("gpus", WARN, summary, "mixed GPU models on one node: the slowest sets the pace"))
    else:
        checks.append(Check("gpus", OK, summary))
    _, topo_text = run(["nvidia-smi", "topo", "-m"])
    topo = parse_topo(topo_text)
    checks.append(check_topology(topo, models, ctx.env))
    if topo.nvlink_pairs():
        _, nvlink_text = run(["nvidia-smi", "nvlink", "--status"])
        checks.append(check_nvlink(parse_nvlink(nvlink_text)))
    return checks


def check_topology(topo: Topology, models: list[str], env: Mapping[str, str]) -> Check:
    if not topo.gpus:
        return Check("topology", WARN, "could not read `nvidia-smi topo -m`", "run it by hand; an old driver may not support -m")
    pairs = topo.gpu_pairs()
    kinds = sorted({kind for _, _, kind in pairs})
    nvlink = topo.nvlink_pairs()
    details = [f"{gpu}: nearest NIC {dev} ({kind})" for gpu in topo.gpus for dev, kind in [topo.best_nic(gpu)] if dev]
    if pairs and nvlink == len(pairs):
        summary = f"all {len(topo.gpus)} GPUs pairwise on NVLink ({', '.join(kinds)})"
    elif nvlink:
        summary = (
            f"{nvlink} of {len(pairs)} GPU pairs on NVLink; the rest over {', '.join(k for k in kinds if not k.startswith('NV'))}"
        )
    else:
        summary = f"no NVLink: GPUs talk over PCIe ({', '.join(kinds) or 'single GPU'})"
    if topo.nics:
        summary += f"; NICs {', '.join(topo.nics.values())}"
    consumer = any("GeForce" in m or "RTX" in m for m in models)
    if nvlink and not _is_off(env.get("NCCL_P2P_DISABLE")):
        return Check(
            "topology",
            WARN,
            summary,
            "the profile sets NCCL_P2P_DISABLE on an NVLink node: "
            "all-reduce goes through host memory; drop it (profile single-node-nvlink or infiniband)",
            details,
        )
    if not nvlink and env.get("NCCL_P2P_LEVEL", "").upper() == "NVL":
        return Check(
            "topology",
            WARN,
            summary,
            "the profile sets NCCL_P2P_LEVEL=NVL but there is no NVLink here: P2P is off; use a PCIe profile",
            details,
        )
    if not nvlink and consumer and len(topo.gpus) > 1 and _is_off(env.get("NCCL_P2P_DISABLE")):
        return Check(
            "topology",
            WARN,
            summary,
            "consumer GPUs on PCIe: P2P hangs on many boards; use the pcie-consumer profile (NCCL_P2P_DISABLE=1)",
            details,
        )
    return Check("topology", OK, summary, None, details)


def check_nvlink(links: dict[int, dict[int, float | None]]) -> Check:
    if not links or not any(links.values()):
        return Check(
            "nvlink",
            FAIL,
            "topology shows NVLink but `nvidia-smi nvlink --status` lists no links",
            "NVSwitch systems need nvidia-fabricmanager running; check `systemctl status nvidia-fabricmanager`",
        )
    down = [f"GPU {g} link {link}" for g, per in sorted(links.items()) for link, speed in sorted(per.items()) if speed is None]
    counts = {len(per) for per in links.values()}
    speeds = sorted({s for per in links.values() for s in per.values() if s is not None})
    total = sum(len(per) for per in links.values())
    summary = f"{total - len(down)} of {total} links up ({'/'.join(map(str, sorted(counts)))} per GPU at {', '.join(f'{s:g}' for s in speeds)} GB/s)"
    if down:
        return Check(
            "nvlink",
            WARN,
            summary + f"; inactive: {', '.join(down[:4])}{' ...' if len(down) > 4 else ''}",
            "an NVLink is down: all-reduce slows to the weakest link; drain the node and report it",
        )
    return Check("nvlink", OK, summary)


def torch_build() -> tuple[str | None, str | None]:
    """(torch version, CUDA it was built for) from the installed files, without importing torch."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    spec = importlib.util.find_spec("torch")
    cuda = None
    if spec is not None and spec.origin:
        text = (
            (Path(spec.origin).parent / "version.py").read_text(errors="replace")
            if (Path(spec.origin).parent / "version.py").is_file()
            else ""
        )
        found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([0-9.]+)['\"]", text, re.MULTILINE)
        cuda = found.group(1) if found else None
    return version, cuda


def nccl_wheel() -> str | None:
    for name in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _major_minor(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_versions(
    driver_cuda: str | None,
    have_gpu: bool,
    site_modules: list[str],
    build: tuple[str | None, str | None] | None = None,
    nccl: str | None = None,
    in_job: bool = True,
) -> Check:
    version, torch_cuda = build if build is not None else torch_build()
    nccl = nccl if build is not None else nccl_wheel()
    if version is None and not in_job:  # the login side never imports torch; the jobs' python must have it
        return Check(
            "versions",
            WARN,
            "torch is not installed in this Python (a login node needs none)",
            "jobs do: install torch in the python they run (the site's `python`, else this one)",
        )
    if version is None:
        return Check("versions", FAIL, "torch is not installed in this Python", "pip install torch (the build for your CUDA)")
    parts = [f"torch {version}", f"built for CUDA {torch_cuda}" if torch_cuda else "CPU build"]
    parts.append(f"NCCL {nccl}" if nccl else "no NCCL wheel")
    if driver_cuda:
        parts.append(f"driver supports CUDA {driver_cuda}")
    summary = ", ".join(parts)
    module = next((m for m in site_modules if m.lower().startswith("nccl/")), None)
    if have_gpu and torch_cuda is None:
        return Check(
            "versions",
            FAIL,
            summary,
            "this torch cannot use the GPUs: install a CUDA build (pip install torch --index-url .../cu121)",
        )
    need, have = _major_minor(torch_cuda), _major_minor(driver_cuda)
    if have_gpu and need and have:
        if need[0] > have[0]:
            return Check(
                "versions",
                FAIL,
                summary,
                f"the driver is too old for this torch: upgrade the driver or install torch built for CUDA {have[0]}.x",
            )
        if need > have:
            return Check(
                "versions",
                WARN,
                summary,
                "torch was built for a newer CUDA minor than the driver supports: "
                "most kernels run (minor version compatibility), PTX JIT ones fail; upgrade the driver",
            )
    if module and nccl and module.split("/", 1)[1] != nccl:
        return Check(
            "versions",
            WARN,
            summary,
            f"the site loads module {module} but torch uses its bundled NCCL {nccl}; "
            "only LD_PRELOAD or a source build uses the module's",
        )
    return Check("versions", OK, summary)


def _hca_matches(spec: str, device: str, port: int) -> bool:
    """NCCL_IB_HCA syntax: prefixes, '=' for exact names, '^' to exclude, ':port' per entry."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    exact = spec.lstrip("^").startswith("=")
    hit = False
    for entry in spec.lstrip("^").lstrip("=").split(","):
        name, _, want_port = entry.strip().partition(":")
        if not name:
            continue
        same = device == name if exact else device.startswith(name)
        if same and (not want_port or want_port == str(port)):
            hit = True
    return hit != exclude


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def check_infiniband(ctx: NodeFacts, sys_root: Path) -> Check:
    env = ctx.env
    wants_ib = bool(env.get("NCCL_IB_HCA")) and _is_off(env.get("NCCL_IB_DISABLE"))
    root = sys_root / "class" / "infiniband"
    ports = []
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        for port_dir in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            ports.append(
                (
                    dev.name,
                    int(port_dir.name),
                    _read(port_dir / "state"),
                    _read(port_dir / "rate"),
                    _read(port_dir / "link_layer"),
                    port_dir,
                )
            )
    if not ports:
        if not wants_ib:
            return Check(
                "infiniband", OK, "no InfiniBand/RoCE devices" + (" (the profile does not use them)" if ctx.profile else "")
            )
        return Check(
            "infiniband",
            FAIL if ctx.in_job else WARN,
            f"no InfiniBand devices, but profile {ctx.profile!r} sets NCCL_IB_HCA",
            "on a compute node: the HCA driver (mlx5_ib) is not loaded; on a login node this is normal, use `doctor --submit`",
        )
    details = [f"{d}:{p} {state.split(': ')[-1]} {rate} {layer}".strip() for d, p, state, rate, layer, _ in ports]
    active = [(d, p, layer, pd) for d, p, state, _, layer, pd in ports if "ACTIVE" in state]
    spec = env.get("NCCL_IB_HCA")
    usable = [a for a in active if not spec or _hca_matches(spec, a[0], a[1])]
    summary = f"{len(active)} of {len(ports)} ports active"
    if wants_ib and not usable:
        return Check(
            "infiniband",
            FAIL,
            summary + f"; none matches NCCL_IB_HCA={spec}",
            "NCCL falls back to TCP sockets (10-50x slower): fix NCCL_IB_HCA or the cabling",
            details,
        )
    gid = env.get("NCCL_IB_GID_INDEX")
    roce = [a for a in usable if a[2].lower() == "ethernet"]
    if gid and roce:
        kind = _read(roce[0][3] / "gid_attrs" / "types" / gid)
        if kind and "v2" not in kind.lower():
            return Check(
                "infiniband",
                WARN,
                summary + f"; GID index {gid} on {roce[0][0]} is {kind}",
                "RoCE wants the RoCE v2 GID: `show_gids` lists them; set NCCL_IB_GID_INDEX to one",
                details,
            )
    if any("ACTIVE" not in state for d, p, state, *_ in ports if not spec or _hca_matches(spec, d, p)):
        return Check(
            "infiniband", WARN, summary, "a port is down: jobs lose its bandwidth; check `ibstat` and the cable", details
        )
    return Check("infiniband", OK, summary + (f", {len(usable)} match NCCL_IB_HCA={spec}" if spec else ""), None, details)


def check_interfaces(ctx: NodeFacts, sys_root: Path) -> list[Check]:
    root = sys_root / "class" / "net"
    interfaces = {p.name: _read(p / "operstate") for p in sorted(root.iterdir())} if root.is_dir() else {}
    checks = []
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        spec = ctx.env.get(var)
        if not spec:
            continue
        names = [n for n in interfaces if _hca_matches(spec, n, 0)]
        up = [n for n in names if interfaces[n] in ("up", "unknown")]
        if up:
            checks.append(Check(f"interface {var}", OK, f"{var}={spec}: {', '.join(up)} up"))
        else:
            seen = ", ".join(f"{n} ({s})" for n, s in interfaces.items()) or "none"
            checks.append(
                Check(
                    f"interface {var}",
                    FAIL if ctx.in_job else WARN,
                    f"{var}={spec} matches no interface that is up; here: {seen}",
                    "bootstrap hangs or picks the wrong network: set the name the compute nodes use "
                    "(`ip -br link` on one)" + ("" if ctx.in_job else "; a login node may differ, use `doctor --submit`"),
                )
            )
    if not checks:
        checks.append(Check("interfaces", OK, "the profile names no socket interface (NCCL picks one itself)"))
    return checks


def check_slurm(ctx: NodeFacts, run: Runner) -> Check:
    site = ctx.site
    if site is None or site.scheduler == "local":
        return Check("slurm", OK, "local site: no Slurm needed")
    if site.slurm_conf and run is run_command:  # the site names its controller's config, for these calls only
        run = functools.partial(run_command, env=slurm_cmd.slurm_env(site.slurm_conf))
    code, version = run(["sinfo", "--version"])
    if code is None:
        return Check("slurm", FAIL, "sinfo not found", "load the Slurm module or run this on the cluster's login node")
    code, text = run(["sinfo", "-h", "-o", "%R|%a|%D|%T"])
    if code != 0:
        return Check(
            "slurm",
            FAIL,
            "the controller does not answer: " + (text.strip().splitlines() or ["no output"])[-1],
            "check SLURM_CONF / the site's slurm_conf, or ask the admins whether slurmctld is up",
        )
    seen: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            entry = seen.setdefault(parts[0], {"avail": parts[1], "states": {}})
            entry["states"][parts[3]] = entry["states"].get(parts[3], 0) + int(parts[2] or 0)
    wanted = list(site.partitions) or list(seen)
    problems: list[str] = []
    details: list[str] = []
    fails = False
    for name in wanted:
        found = seen.get(name)
        if found is None:
            problems.append(f"partition {name} does not exist")
            fails = True
            continue
        states = ", ".join(f"{n} {s}" for s, n in sorted(found["states"].items()))
        details.append(f"{name}: {found['avail']}, {states}")
        usable = sum(
            n
            for s, n in found["states"].items()
            if s.rstrip("*~#!%$@^-+").split("+")[0] in ("idle", "mixed", "allocated", "completing")
        )
        if found["avail"] != "up":
            problems.append(f"partition {name} is {found['avail']}")
            fails = True
        elif not usable:
            problems.append(f"partition {name} has no usable node ({states})")
    summary = f"{version.strip() or 'slurm'}; {len(wanted)} partition(s) checked"
    if problems:
        return Check(
            "slurm",
            FAIL if fails else WARN,
            summary + "; " + "; ".join(problems),
            "fix the site file's partitions, or ask the admins (`sinfo -R` says why nodes are down)",
            details,
        )
    return Check("slurm", OK, summary, None, details)


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_packages(backends: Mapping[str, Any], installed: Callable[[str], str | None] = _installed) -> Check:
    ready: list[str] = []
    missing: list[str] = []
    wanted: dict[str, None] = {}  # what the unavailable backends declare they need, in order, once each
    for name, cls in sorted(backends.items()):
        absent = [pkg for pkg in cls.requires if installed(pkg) is None]
        wanted.update(dict.fromkeys(absent))
        (missing if absent else ready).append(f"{name} (needs {', '.join(absent)})" if absent else name)
    summary = f"backends ready: {', '.join(ready) or 'none'}" + (f"; unavailable: {', '.join(missing)}" if missing else "")
    install = f"pip install {' '.join(wanted)}"
    if not ready:
        return Check("python packages", FAIL, summary, f"{install} (or only what the backend you use needs)")
    if missing:
        return Check("python packages", WARN, summary, f"install what a backend needs before using it: {install}")
    return Check("python packages", OK, summary)


def check_nsys(ctx: NodeFacts, run: Runner) -> Check:
    """Nsight Systems for ``--profile nsys``: the site's ``tools.nsys`` (default: nsys on PATH)."""
    tools = getattr(ctx.site, "tools", None)
    nsys = tools.nsys if tools is not None else "nsys"
    if not nsys:
        return Check("nsys", OK, f"site {ctx.site.name} has none (tools.nsys: null): --profile nsys is refused at submit")
    code, out = run([nsys, "--version"])
    if code == 0:
        version = re.search(r"version\s+([0-9][0-9.]*[0-9])", out)
        said = version.group(1) if version else "(version not said)"
        return Check("nsys", OK, f"Nsight Systems {said} ({nsys}): --profile nsys works here")
    if code is None:
        summary = f"{nsys!r} not found: --profile nsys would fail on this node"
    else:
        summary = f"`{nsys} --version` failed (exit {code}): " + (out.strip().splitlines() or ["no output"])[0]
    if not ctx.in_job:  # the login node need not have it; the compute nodes do
        return Check("nsys", OK, summary.replace("this node", "this machine") + "; `doctor --submit` checks the compute nodes")
    if run(["nvidia-smi", "-L"])[0] is None:  # a CPU node: nsys would have no GPU to trace
        return Check("nsys", OK, summary.replace("would fail", "has nothing to trace") + " (no NVIDIA driver here)")
    return Check(
        "nsys",
        WARN,
        summary,
        "install Nsight Systems (or load its module in the site's `modules`), set tools.nsys in the site file to its path, "
        "or tools.nsys: null so that --profile nsys is refused at submit",
    )


def check_site_config(ctx: NodeFacts) -> Check:
    if ctx.site is None:
        return Check("site config", OK, "no site given")
    n = len(ctx.site.nccl_profiles)
    summary = f"site {ctx.site.name}: {n} NCCL profile(s); job profile {ctx.profile or 'none'}"
    if ctx.site_warnings:
        return Check(
            "site config", WARN, summary, "see the details; `render` shows each warning with file:line", ctx.site_warnings
        )
    return Check("site config", OK, summary + "; every variable name checked")


def diagnose(
    ctx: NodeFacts,
    run: Runner = run_command,
    sys_root: Path = Path("/sys"),
    backends: Mapping[str, Any] | None = None,
    host: str | None = None,
) -> Report:
    checks = check_gpus(ctx, run)
    code, header = run(["nvidia-smi"])
    have_gpu = code == 0
    driver_cuda = parse_smi_header(header)[1] if have_gpu else None
    checks.append(check_versions(driver_cuda, have_gpu, list(ctx.site.modules) if ctx.site else [], in_job=ctx.in_job))
    checks.append(check_infiniband(ctx, sys_root))
    checks.extend(check_interfaces(ctx, sys_root))
    checks.append(check_slurm(ctx, run))
    checks.append(check_nsys(ctx, run))
    if backends is not None:
        packages = check_packages(backends)
        if packages.status == FAIL and not ctx.in_job:  # no backend runs on a login node: only its jobs need them
            packages.status = WARN
        checks.append(packages)
    checks.append(check_site_config(ctx))
    job = os.environ.get("SLURM_JOB_ID")
    context = f"compute node (job {job})" if ctx.in_job and job else "login node" if not ctx.in_job else "compute node"
    return Report(host or socket.gethostname(), context, checks)


def context_for(resolved: Any, partition: str | None, profile: str | None, environ: Mapping[str, str]) -> NodeFacts:
    """The fabric variables a job on ``partition`` would get (site < partition < profile), as plan.py sets them."""
    from hpc_train.fabric import nccl

    in_job = "SLURM_JOB_ID" in environ and "SLURM_NODELIST" in environ
    if resolved is None:
        return NodeFacts(in_job=in_job)
    site = resolved.config
    name = partition or (environ.get("SLURM_JOB_PARTITION") if in_job else None)
    part_name, part = site.partition(name)
    env = dict(site.env)
    if part is not None:
        env.update(part.env)
    selection = nccl.select(site.nccl_profiles, profile, part.nccl_profile if part else None, site.name)
    env.update({n: v for n, v, _ in selection.variables})
    warnings = [
        f"{f.key}: {f.message}"
        for f in nccl.site_findings(
            {"env": site.env, **{f"partitions.{p}.env": pt.env for p, pt in site.partitions.items()}}, site.nccl_profiles
        )
    ]
    warnings += [f"nccl_profile: {m}" for m, _ in selection.problems]
    return NodeFacts(
        site=site,
        partition=part_name,
        profile=selection.label,
        env=env,
        in_job=in_job,
        expected_gpus=part.gpus_per_node if part else 0,
        site_warnings=warnings,
    )


# --- output ----------------------------------------------------------------------------------


def format_report(report: Report, color: bool = False) -> str:
    marks = {OK: "ok", WARN: "WARN", FAIL: "FAIL"}
    paint = {OK: "\x1b[32m", WARN: "\x1b[33m", FAIL: "\x1b[31m"} if color else {}
    width = max(len(c.name) for c in report.checks)
    lines = [f"hpc_train doctor on {report.host} ({report.context})"]
    for check in report.checks:
        mark = marks[check.status]
        if color:
            mark = f"{paint[check.status]}{mark:<4}\x1b[0m"
        lines.append(f"  {mark:<4}  {check.name:<{width}}  {check.summary}")
        for detail in check.details:
            lines.append(f"        {'':<{width}}    {detail}")
        if check.fix and check.status != OK:
            lines.append(f"        {'':<{width}}  → {check.fix}")
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in (OK, WARN, FAIL)}
    lines.append(f"{report.status}: {counts[OK]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failure(s)")
    return "\n".join(lines) + "\n"


def node_report(site: str | None, partition: str | None, profile: str | None) -> dict[str, Any]:
    """Run on a compute node by ``doctor --submit``: each node writes its report into the job folder."""
    from hpc_train.plugin.manager import default_plugins
    from hpc_train.submission.prepare import resolve_site

    plugins = default_plugins()
    resolved = resolve_site(site, plugins) if site else None
    ctx = context_for(resolved, partition, profile, os.environ)
    report = diagnose(ctx, backends=plugins.backends).to_dict()
    folder = os.environ.get(contract.ENV_JOB_FOLDER)
    if folder:
        out = Path(folder) / "doctor"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{report['host']}.json").write_text(json.dumps(report, indent=1))
    return report
