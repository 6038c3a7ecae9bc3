"""The login side of ``preflight``: submit the bandwidth job, read its results, judge them.

The job (hpc_train/runtime/preflight_job.py) measures; this module decides. Judging is a pure
function of the results and the site's figures (``preflight:`` in the site file, per partition),
so a past job's results can be judged again against another figure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hpc_train
from hpc_train.config.models import Preflight
from hpc_train.errors import UsageError

JOB_SCRIPT = Path(hpc_train.__file__).resolve().parent / "runtime" / "preflight_job.py"
RELATIVE_SLOW = 0.5  # without a site figure, a pair under half the best pair is slow
CPU_MAX_SIZE = "64M"  # gloo over Ethernet: bigger messages only make the job longer


def expected_for(site: Any, partition: str | None) -> Preflight:
    _, part = site.partition(partition)
    if part is not None and part.preflight is not None:
        return part.preflight
    return site.preflight if site.preflight is not None else Preflight()


def max_size_for(site: Any, partition: str | None) -> str:
    """The site's figure when it sets one; else 1G on GPU partitions, 64M over gloo on CPU ones."""
    _, part = site.partition(partition)
    if part is not None and part.preflight is not None:
        return part.preflight.max_size
    if site.preflight is not None or (part is not None and part.gpus_per_node):
        return (site.preflight or Preflight()).max_size
    return CPU_MAX_SIZE


@dataclass
class Verdict:
    passed: bool
    lines: list[str] = field(default_factory=list)  # why, one finding a line
    slow_pairs: list[tuple[str, str]] = field(default_factory=list)
    suspects: list[str] = field(default_factory=list)


def find_slow_nodes(
    pairs: list[dict[str, Any]], threshold: float | None
) -> tuple[list[tuple[str, str]], list[str], float | None]:
    """Slow pairs (under ``threshold``, else under half the best pair) and the nodes to blame.

    A node is blamed when more than half of its pairs are slow: with one bad node among N, its
    N-1 pairs are all slow while every other node has just one slow pair.
    """
    if not pairs:
        return [], [], threshold
    if threshold is None:
        if len(pairs) < 3:
            return [], [], None  # one or two pairs cannot say which of them is off
        # the best pair, not the median: with 4 nodes a bad one is in half of the pairs
        threshold = RELATIVE_SLOW * max(p["busbw_gbs"] for p in pairs)
    slow = [tuple(p["nodes"]) for p in pairs if p["busbw_gbs"] < threshold]
    total: dict[str, int] = {}
    bad: dict[str, int] = {}
    for p in pairs:
        for node in p["nodes"]:
            total[node] = total.get(node, 0) + 1
            if tuple(p["nodes"]) in slow:
                bad[node] = bad.get(node, 0) + 1
    suspects = sorted(n for n, k in bad.items() if k * 2 > total[n])
    return slow, suspects, threshold


def evaluate(result: dict[str, Any], expect: Preflight) -> Verdict:
    verdict = Verdict(True)
    rows = result.get("sizes") or []
    if not rows:
        return Verdict(False, ["the job measured nothing"])
    top = rows[-1]
    if expect.busbw_gbs is None:
        verdict.lines.append(
            f"bus bandwidth {top['busbw_gbs']:.3f} GB/s at {human(top['bytes'])}; "
            "the site sets no expected figure (preflight.busbw_gbs), so nothing to compare"
        )
    elif top["busbw_gbs"] >= expect.busbw_gbs:
        verdict.lines.append(
            f"bus bandwidth {top['busbw_gbs']:.3f} GB/s at {human(top['bytes'])} >= expected {expect.busbw_gbs:g} GB/s"
        )
    else:
        verdict.passed = False
        verdict.lines.append(
            f"bus bandwidth {top['busbw_gbs']:.3f} GB/s at {human(top['bytes'])} "
            f"< expected {expect.busbw_gbs:g} GB/s: check the NCCL profile (doctor) and the fabric"
        )
    pairs = result.get("pairs") or []
    slow, suspects, threshold = find_slow_nodes(pairs, expect.pair_busbw_gbs)
    verdict.slow_pairs, verdict.suspects = slow, suspects
    if len(result.get("nodes", [])) < 2:
        verdict.lines.append("pair check: one node, no pairs")
    elif slow:
        verdict.passed = False
        blame = f"; slow node: {', '.join(suspects)} (drain it: scontrol update nodename=... state=drain)" if suspects else ""
        verdict.lines.append(
            f"pair check: {len(slow)} of {len(pairs)} pair(s) under {threshold:.3f} GB/s: "
            + ", ".join("-".join(p) for p in slow)
            + blame
        )
    else:
        bar = f" (all >= {threshold:.3f} GB/s)" if threshold is not None else ""
        verdict.lines.append(f"pair check: {len(pairs)} pair(s) ok{bar}")
    return verdict


def human(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def format_table(result: dict[str, Any], verdict: Verdict) -> str:
    lines = [
        (
            f"all-reduce over {result['backend']}: {result['world_size']} ranks on {len(result['nodes'])} node(s) "
            f"({', '.join(result['nodes'])}), {result.get('device', '')}"
        ),
        f"{'size':>8}  {'time (us)':>12}  {'algbw (GB/s)':>13}  {'busbw (GB/s)':>13}",
    ]
    for row in result["sizes"]:
        lines.append(f"{human(row['bytes']):>8}  {row['time_us']:12.1f}  {row['algbw_gbs']:13.3f}  {row['busbw_gbs']:13.3f}")
    if result.get("pairs"):
        lines.append("")
        lines.append(f"{'node pair':<24}  {'size':>6}  {'busbw (GB/s)':>13}")
        for pair in result["pairs"]:
            mark = "  SLOW" if tuple(pair["nodes"]) in verdict.slow_pairs else ""
            lines.append(f"{'-'.join(pair['nodes']):<24}  {human(pair['bytes']):>6}  {pair['busbw_gbs']:13.3f}{mark}")
    lines.append("")
    lines.extend(verdict.lines)
    lines.append("PASS" if verdict.passed else "FAIL")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class PreflightJob:
    """What ``preflight`` runs: where, on how many nodes, how far the sizes go and how often each is timed."""

    site: str | None
    nodes: int
    partition: str | None = None
    nccl_profile: str | None = None
    max_size: str | None = None  # the largest message; default: the partition's (max_size_for)
    iters: int = 5
    job_root: str | None = None
    time: str = "00:10:00"


def submit_preflight(job: PreflightJob) -> tuple[Any, Preflight]:
    """Submit the job; returns (handle, the figures it will be judged against)."""
    from hpc_train.api import resolve_site, submit
    from hpc_train.plugin.manager import default_plugins

    site, nodes, partition = job.site, job.nodes, job.partition
    plugins = default_plugins()
    site_config = resolve_site(site, plugins).config
    expect = expected_for(site_config, partition)
    _, part = site_config.partition(partition)
    if nodes < 2 and not (part and part.gpus_per_node > 1):
        raise UsageError("preflight needs at least 2 ranks; a CPU node runs one", "use --nodes 2 or more")
    size = job.max_size or max_size_for(site_config, partition)
    options: dict[str, Any] = {
        "site": site,
        "nodes": nodes,
        "partition": partition,
        "nccl_profile": job.nccl_profile,
        "job_root": job.job_root,
        "time": job.time,
        "job_name": "hpc_train-preflight",
        "backend": "torchrun",
        "requeue": False,
    }
    handle = submit(
        str(JOB_SCRIPT),
        "--max-size",
        size,
        "--iters",
        str(job.iters),
        plugins=plugins,
        **{k: v for k, v in options.items() if v is not None},
    )
    return handle, expect


def read_result(folder: Path) -> dict[str, Any] | None:
    path = folder / "preflight.json"
    return json.loads(path.read_text()) if path.is_file() else None
