"""The GPUs: how many against the partition's, their driver and CUDA, their PCIe / NVLink topology against
the fabric variables, the NVLink lanes' speeds.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpc_train.fabric.doctor.commands import Runner
from hpc_train.fabric.doctor.facts import NodeFacts, is_off
from hpc_train.fabric.doctor.nvidia_smi import Topology, parse_nvlink, parse_query_gpu, parse_smi_header, parse_topo
from hpc_train.fabric.doctor.report import FAIL, OK, WARN, Check


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
    if nvlink and not is_off(env.get("NCCL_P2P_DISABLE")):
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
    if not nvlink and consumer and len(topo.gpus) > 1 and is_off(env.get("NCCL_P2P_DISABLE")):
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
