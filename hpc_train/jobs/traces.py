"""``--profile``'s output in a job folder, read on the login node: which traces and reports, where the
time went (the top operators by self time), and how much of it was communication. Never imports torch:
a torch.profiler trace is Chrome trace JSON, read as such.

``<job folder>/profile/run-R/rank-N.<time>.pt.trace.json`` (torch) and ``run-R/rank-N.nsys-rep`` (nsys).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_train import contract

TRACE = re.compile(r"rank-(\d+)\..*\.pt\.trace\.json(\.gz)?$")
REPORT = re.compile(r"rank-(\d+)\.nsys-rep$")
# the collectives as torch.profiler names them: c10d's ops, the process group's own spans
# (gloo:all_reduce, nccl:all_reduce, record_param_comms) and NCCL's kernels (ncclDevKernel_AllReduce_...)
COMMUNICATION = re.compile(
    r"nccl|gloo|c10d|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|broadcast|all_?to_?all|barrier|horovod|mpi_",
    re.IGNORECASE,
)
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
STEP = re.compile(r"ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class Found:
    path: Path
    run: int
    rank: int
    kind: str  # "torch" or "nsys"


def find(job_folder: Path) -> list[Found]:
    """Every trace and report under the job folder's ``profile/``, by run and rank."""
    found = []
    for run_dir in sorted((job_folder / contract.PROFILE).glob("run-*")):
        run = run_dir.name.removeprefix("run-")
        if not run.isdigit():
            continue
        for path in sorted(run_dir.iterdir()):
            for kind, pattern in (("torch", TRACE), ("nsys", REPORT)):
                match = pattern.match(path.name)
                if match:
                    found.append(Found(path, int(run), int(match.group(1)), kind))
    return sorted(found, key=lambda f: (f.run, f.rank, f.kind, f.path.name))


def _events(path: Path) -> list[dict[str, Any]]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]


def _operator(event: dict[str, Any]) -> bool:
    """An operator's span: a CPU op, a device kernel or copy, or a collective's own span on its thread."""
    cat = event.get("cat")
    return cat == "cpu_op" or cat in DEVICE or (cat == "user_annotation" and bool(COMMUNICATION.search(event["name"])))


def self_times(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each operator with its self time (µs): its duration less its direct children's, on its own thread."""
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if _operator(event):
            by_thread[(event.get("pid"), event.get("tid"))].append(event)
    out: list[tuple[dict[str, Any], float]] = []
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        own = [float(e["dur"]) for e in thread]
        stack: list[int] = []  # indices of the enclosing spans
        for i, event in enumerate(thread):
            while stack and thread[stack[-1]]["ts"] + thread[stack[-1]]["dur"] <= event["ts"]:
                stack.pop()
            if stack:
                own[stack[-1]] -= float(event["dur"])
            stack.append(i)
        out.extend(zip(thread, (max(0.0, t) for t in own)))
    return out


def summarize_trace(path: Path) -> dict[str, Any]:
    """One trace: its steps, its operators' self times, communication against compute."""
    events = _events(path)
    steps = sorted({int(m.group(1)) for e in events if (m := STEP.match(str(e.get("name", ""))))})
    timed = self_times(events)
    on_device = any(e.get("cat") in DEVICE for e, _ in timed)
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    comm = compute = 0.0
    for event, own in timed:
        if on_device != (event.get("cat") in DEVICE):
            continue  # on a GPU the device's time is the split; the host's launches overlap it
        ops[event["name"]][0] += own
        ops[event["name"]][1] += 1
        if COMMUNICATION.search(event["name"]):
            comm += own
        else:
            compute += own
    total = comm + compute
    return {
        "steps": steps,
        "basis": "GPU kernels" if on_device else "CPU operators",
        "comm_ms": round(comm / 1e3, 3),
        "compute_ms": round(compute / 1e3, 3),
        "comm_share": round(comm / total, 4) if total else None,
        "operators": {name: (round(t / 1e3, 3), int(n)) for name, (t, n) in ops.items()},
    }


def summary(job_folder: Path, top: int = 10) -> dict[str, Any] | None:
    """What ``report`` says of the job's profiles; None without any. The top operators: the newest run's, over its ranks."""
    found = find(job_folder)
    if not found:
        return None
    traces, problems = [], []
    for item in (f for f in found if f.kind == "torch"):
        try:
            traces.append({"path": str(item.path), "run": item.run, "rank": item.rank, **summarize_trace(item.path)})
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a trace being written, or cut short
            problems.append(f"{item.path.name}: not readable ({type(exc).__name__}: {exc})")
    latest = [t for t in traces if t["run"] == max((t["run"] for t in traces), default=0)]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for trace in latest:
        for name, (ms, calls) in trace.pop("operators").items():
            totals[name][0] += ms
            totals[name][1] += calls
    for trace in traces:
        trace.pop("operators", None)
    steps = sum(len(t["steps"]) for t in latest) or 1  # per step of one rank
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return {
        "folder": str(job_folder / contract.PROFILE),
        "traces": traces,
        "top": [
            {"name": n, "self_ms_per_step": round(t / steps, 3), "calls_per_step": round(c / steps, 2)} for n, (t, c) in ranked
        ],
        "top_of": {"run": latest[0]["run"], "ranks": [t["rank"] for t in latest], "basis": latest[0]["basis"]}
        if latest
        else None,
        "nsys": [{"path": str(f.path), "run": f.run, "rank": f.rank} for f in found if f.kind == "nsys"],
        "problems": problems,
    }


def _steps(steps: list[int]) -> str:
    if not steps:
        return "no steps"
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def format_lines(s: dict[str, Any]) -> list[str]:
    """The profile part of ``report``'s text, in its two columns."""
    lines: list[str] = []

    def add(label: str, value: str) -> None:
        lines.append(f"  {label:<16}{value}")

    for trace in s["traces"]:
        share = trace["comm_share"]
        split = (
            f"communication {share * 100:.1f}%, compute {100 - share * 100:.1f}% of {trace['basis']}' self time"
            if share is not None
            else "no operators"
        )
        add("profile", f"run {trace['run']} rank {trace['rank']}: {_steps(trace['steps'])}, {split}")
        add("", f"  {trace['path']}")
    for report in s["nsys"]:
        add("profile", f"run {report['run']} rank {report['rank']}: Nsight Systems report {report['path']} (nsys-ui, nsys stats)")
    if s["top"] and s["top_of"]:
        of = s["top_of"]
        add(
            "top operators",
            f"self ms/step  calls/step  ({of['basis']}, run {of['run']}, ranks {', '.join(map(str, of['ranks']))})",
        )
        for op in s["top"]:
            add("", f"{op['self_ms_per_step']:>12.3f}  {op['calls_per_step']:>10.1f}  {op['name']}")
    for problem in s["problems"]:
        add("note", problem)
    return lines
