"""The network: InfiniBand devices and ports against NCCL_IB_HCA, and the interfaces NCCL_SOCKET_IFNAME names,
read from ``/sys`` (``sys_root`` in the tests).
"""

from __future__ import annotations

from pathlib import Path

from hpc_train.fabric.doctor.facts import NodeFacts, is_off
from hpc_train.fabric.doctor.report import FAIL, OK, WARN, Check


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
    wants_ib = bool(env.get("NCCL_IB_HCA")) and is_off(env.get("NCCL_IB_DISABLE"))
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
