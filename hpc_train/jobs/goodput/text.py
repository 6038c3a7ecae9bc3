"""The goodput section of ``report`` and ``diagnose``: the summary as a dict (JSON round-trips) and as lines."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hpc_train.config.slurm_time import format_slurm_time
from hpc_train.jobs.goodput.records import CAUSES, Goodput


def as_dict(g: Goodput) -> dict[str, Any]:
    out = asdict(g)
    out["goodput"] = None if g.goodput is None else round(g.goodput, 4)
    for key in ("allocated_s", "productive_s", "queue_wait_s", "wall_s", "first_wait_s"):
        if out[key] is not None:
            out[key] = round(out[key], 3)
    out["lost_s"] = {k: round(v, 3) for k, v in g.lost_s.items()}
    return out


def _hms(seconds: float) -> str:
    return format_slurm_time(round(seconds))  # D-HH:MM:SS, as sacct and squeue write a duration


def format_lines(d: dict[str, Any]) -> list[str]:
    """The goodput section of ``report`` and ``diagnose`` (from ``as_dict``'s output: JSON round-trips)."""
    lines: list[str] = []

    def add(label: str, value: str) -> None:
        lines.append(f"  {label:<16}{value}")

    allocated = d["allocated_s"]
    if d.get("goodput") is not None:
        add(
            "goodput",
            f"{d['goodput'] * 100:.1f}%: {_hms(d['productive_s'])} training new steps of "
            f"{_hms(allocated)} allocated" + (" (estimated)" if d.get("estimated") else ""),
        )
    else:
        add("goodput", "unknown: no allocation found")
    for key, label in CAUSES.items():
        seconds = d["lost_s"].get(key, 0.0)
        if seconds >= 0.5 or (key == "startup" and allocated):
            lines.append(f"    {label:<20}{_hms(seconds)}{_share(seconds, allocated)}{_lost_detail(key, d)}")
    if d.get("requeues"):
        add("queue wait", f"{_hms(d['queue_wait_s'])} after {d['requeues']} requeue(s) (not allocated, not in GPU-hours)")
    if d.get("first_wait_s") is not None:
        add("first wait", f"{_hms(d['first_wait_s'])} from submission to the first start")
    add("GPU-hours", _gpu_line(d))
    if d.get("cost") is not None:
        add("cost", f"{d['cost']:,.2f} ({d['price_per_gpu_hour']:g} per GPU-hour)")
    lines.extend(run_table(d))
    if d.get("excluded"):
        add("excluded", ", ".join(d["excluded"]) + " (ExcNodeList of the next requeue)")
    for note in d.get("notes") or []:
        add("note", note)
    return lines


def _share(seconds: float, allocated: float) -> str:
    return f" ({seconds / allocated * 100:.1f}%)" if allocated > 0 else ""


def _lost_detail(key: str, d: dict[str, Any]) -> str:
    if key == "recomputed" and d.get("steps_recomputed"):
        return f", {d['steps_recomputed']} step(s) trained again after a restore"
    if key == "checkpoint_stalls" and d.get("saves"):
        return f", after {d['saves']} save(s)"
    return ""


def _gpu_line(d: dict[str, Any]) -> str:
    if d.get("gpu_hours") is not None:
        layout = (
            f" ({d['nodes']} node(s) x {d['gpus_per_node']} GPU(s) x {_hms(d['allocated_s'])})"
            if d.get("nodes") and d.get("gpus_per_node")
            else ""
        )
        return f"{d['gpu_hours']:.2f}{layout}"
    if d.get("node_hours") is not None:
        return f"none (a CPU job: {d['node_hours']:.2f} node-hours)"
    return "unknown (the job record gives no nodes)"


def run_table(d: dict[str, Any]) -> list[str]:
    runs = d.get("runs") or []
    if not runs:
        return []
    rows = [("run", "hosts", "steps", "ended")]
    for r in runs:
        steps = f"{r['first_step']}-{r['last_step']}" if r.get("first_step") is not None else "-"
        rows.append((str(r["run"]), ",".join(r.get("hosts") or []) or "?", steps, r["how"]))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    out = ["  runs"]
    for row in rows:
        out.append("    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    for r in runs:
        if r.get("suspects"):
            out.append(f"    run {r['run']} suspect nodes: {', '.join(r['suspects'])}")
        if r.get("stragglers"):
            out.append(f"    run {r['run']} stragglers: {', '.join(r['stragglers'])}")
    return out
