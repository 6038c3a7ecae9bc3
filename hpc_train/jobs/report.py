"""A finished (or running) job's metrics, read on the login node: a summary and PNG plots.

Reads ``<job folder>/metrics/steps.jsonl`` (written by hpc_train.runtime.observe.metrics), with its per-rank
``"event": "ranks"`` windows, and ``stragglers.jsonl`` beside it (hpc_train.runtime.observe.straggler). Steps a
requeued run redid after restoring its checkpoint are taken from the newest run. Never imports torch;
matplotlib is imported only to plot.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.config.slurm_time import format_slurm_time
from hpc_train.errors import UsageError
from hpc_train.jobs import goodput, traces

JSONL = contract.STEPS
NUMERICS_EVENTS = ("bad_step", "rollback")  # hpc_train.runtime.step.numerics's lines in steps.jsonl


@dataclass
class Run:
    run: int
    start_step: int
    start_time: float
    end_time: float | None = None
    end_step: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Metrics:
    path: Path
    rows: list[dict[str, Any]]  # one per step, in step order, newest run's copy of a redone step
    runs: list[Run]
    bad_lines: int = 0
    windows: list[dict[str, Any]] = field(default_factory=list)  # per-rank compute times, one per window
    stragglers: list[dict[str, Any]] = field(default_factory=list)  # ranks named slower than the others
    memory: list[dict[str, Any]] = field(default_factory=list)  # "micro_batch" lines and run_end's peaks per rank
    numerics: list[dict[str, Any]] = field(default_factory=list)  # skipped steps and rollbacks (runtime.numerics)

    @property
    def hosts(self) -> dict[int, str]:
        """rank -> host, from the newest run that said (a requeued run may land on other nodes)."""
        out: dict[int, str] = {}
        for window in self.windows:
            out.update(enumerate(window.get("hosts") or []))
        return out

    @property
    def first_steps(self) -> set[int]:
        """Each run's first step: it includes warm-up (allocations, connections), so rates leave it out."""
        firsts: set[int] = set()
        for run in self.runs:
            steps = [r["step"] for r in self.rows if r.get("run") == run.run]
            if steps:
                firsts.add(min(steps))
        return firsts

    @property
    def steady(self) -> list[dict[str, Any]]:
        firsts = self.first_steps
        return [r for r in self.rows if r["step"] not in firsts and r.get("step_s")]


def find_jsonl(folder: Path) -> Path:
    """The steps file of a job folder, a metrics folder, or the file itself."""
    for candidate in (folder, folder / JSONL, folder / contract.METRICS / JSONL):
        if candidate.is_file():
            return candidate
    raise UsageError(
        f"no metrics in {folder}: {folder / 'metrics' / JSONL} does not exist",
        hint="metrics are written by scripts using hpc_train.runtime (ctx.backward/ctx.step), "
        "unless the job ran with --no-metrics; a job that has not reached its first steps "
        "has none yet",
    )


def load(folder: str | Path) -> Metrics:
    path = find_jsonl(Path(folder))
    by_step: dict[int, dict[str, Any]] = {}
    runs: dict[int, Run] = {}
    windows: list[dict[str, Any]] = []
    numerics: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    bad = 0
    with path.open(errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1  # a line being written while we read, or a run killed mid-write
                continue
            if not isinstance(record, dict):
                bad += 1
                continue
            event = record.get("event")
            if event == "run_start":
                number = int(record.get("run", len(runs) + 1))
                runs[number] = Run(number, int(record.get("start_step", 0)), float(record.get("time", 0.0)), info=record)
            elif event == "run_end":
                run = runs.get(int(record.get("run", 0)))
                if run is not None:
                    run.end_time, run.end_step = record.get("time"), record.get("step")
                if isinstance(record.get("peak_bytes"), list):  # every rank's peak memory, at the run's end
                    memory.append({**record, "event": "memory"})
            elif event == "ranks":
                if isinstance(record.get("compute_ms"), list) and isinstance(record.get("last_step"), int):
                    windows.append(record)
            elif event in NUMERICS_EVENTS:
                numerics.append(record)
            elif event in ("memory", "micro_batch"):
                memory.append(record)
            elif event is not None:
                continue  # a kind of line a newer writer added: not a step
            elif "step" in record:
                by_step[int(record["step"])] = record  # a redone step: the newer run's line wins
    rows = [by_step[s] for s in sorted(by_step)]
    for run in runs.values():  # a run that ended without run_end (killed): its last line
        if run.end_time is None:
            own = [r for r in rows if r.get("run") == run.run]
            if own:
                run.end_time, run.end_step = own[-1].get("time"), own[-1]["step"]
    ordered = [runs[k] for k in sorted(runs)]
    found = Metrics(path, rows, ordered, bad, _current_windows(windows, ordered), _read_lines(path.parent / contract.STRAGGLERS))
    found.numerics = numerics
    found.memory = memory
    return found


def _current_windows(windows: list[dict[str, Any]], runs: list[Run]) -> list[dict[str, Any]]:
    """The windows no later run redid: as for steps, the newest run's numbers count."""

    def superseded(window: dict[str, Any]) -> bool:
        run = window.get("run", 0)
        return any(later.run > run and later.start_step < window["last_step"] for later in runs)

    return sorted((w for w in windows if not superseded(w)), key=lambda w: w["last_step"])


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file that may be missing or have a line being written."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            out.append(record)
    return out


def summarize(m: Metrics) -> dict[str, Any]:
    rows, steady = m.rows, m.steady
    out: dict[str, Any] = {
        "metrics": str(m.path),
        "runs": len(m.runs),
        "restarts": max(0, len(m.runs) - 1),
        "steps": rows[-1]["step"] if rows else 0,
        "steps_recorded": len(rows),
    }
    if m.runs:
        info = m.runs[-1].info
        out.update({k: info.get(k) for k in ("job_id", "backend", "world_size", "device") if info.get(k) is not None})
    if rows:
        first = min([run.start_time for run in m.runs] + [rows[0]["time"]])
        last = max([run.end_time or 0 for run in m.runs] + [rows[-1]["time"]])
        out["duration_s"] = round(last - first, 3)
        out["step_time_s"] = round(sum(r.get("step_s") or 0 for r in rows), 3)
        expected = rows[-1]["step"] - rows[0]["step"] + 1
        out["missing_steps"] = expected - len(rows)
    if steady:
        seconds = sum(r["step_s"] for r in steady)
        out["median_step_s"] = round(statistics.median(r["step_s"] for r in steady), 6)
        out["steps_per_s"] = round(len(steady) / seconds, 3)
        counted = [r for r in steady if "samples" in r]
        if counted:
            out["samples_per_s"] = round(sum(r["samples"] for r in counted) / sum(r["step_s"] for r in counted), 2)
        out["comm_share"] = round(sum(r.get("comm_s", 0.0) for r in steady) / seconds, 4)
    losses = [r for r in rows if r.get("loss") is not None]
    if losses:
        out["first_loss"], out["final_loss"] = losses[0]["loss"], losses[-1]["loss"]
    gpu = [r for r in rows if "gpu_util" in r]
    if gpu:
        out["gpu_util_mean"] = round(statistics.fmean(r["gpu_util"] for r in gpu), 1)
        out["gpu_mem_max_bytes"] = max(r.get("gpu_mem_bytes", 0) for r in gpu)
    out.update(_rank_summary(m))
    out.update(_memory_summary(m))
    out.update(_numerics_summary(m))
    if m.bad_lines:
        out["unreadable_lines"] = m.bad_lines
    return out


def _numerics_summary(m: Metrics) -> dict[str, Any]:
    """The gradient norm over the run, the steps skipped for a non-finite loss or gradient, the rollbacks."""
    out: dict[str, Any] = {}
    norms = [r["grad_norm"] for r in m.rows if isinstance(r.get("grad_norm"), (int, float))]
    if norms:
        out["grad_norm"] = {"first": norms[0], "last": norms[-1], "median": statistics.median(norms), "max": max(norms)}
    bad = [e for e in m.numerics if e.get("event") == "bad_step"]
    scale = sum(1 for r in m.rows if r.get("scale_skipped"))
    if bad or scale or any(r.get("nonfinite") for r in m.rows):
        out["skipped_steps"] = [{k: e.get(k) for k in ("step", "run", "reason", "ranks", "consecutive", "action")} for e in bad]
        out["scale_skips"] = scale
    rollbacks = [{k: e.get(k) for k in ("step", "restored", "run")} for e in m.numerics if e.get("event") == "rollback"]
    if rollbacks:
        out["rollbacks"] = rollbacks
    return out


def _numerics_lines(s: dict[str, Any]) -> list[tuple[str, str]]:
    lines = []
    if "grad_norm" in s:
        g = s["grad_norm"]
        lines.append(("grad norm", f"{g['first']:.4g} -> {g['last']:.4g} (median {g['median']:.4g}, max {g['max']:.4g})"))
    if "skipped_steps" in s:
        skipped = s["skipped_steps"]
        steps = ", ".join(str(e["step"]) for e in skipped[:10]) + (", ..." if len(skipped) > 10 else "")
        text = f"{len(skipped)} skipped for a non-finite loss or gradient" + (f" (steps {steps})" if skipped else "")
        lines.append(("bad steps", text + (f"; {s['scale_skips']} loss-scale overflow skips" if s.get("scale_skips") else "")))
        for e in skipped[:10]:
            ranks = e.get("ranks") or []
            who = f"loss not finite on rank {', '.join(map(str, ranks))}" if ranks else "averaged gradient not finite"
            lines.append(("", f"step {e['step']} (run {e.get('run', '?')}): {who}; {e.get('action', 'skipped')}"))
    for r in s.get("rollbacks", []):
        lines.append(("rollback", f"at step {r['step']} to the checkpoint of step {r['restored']} (run {r.get('run', '?')})"))
    return lines


def _rank_summary(m: Metrics) -> dict[str, Any]:
    """How the ranks compared: the windows, the rank furthest above the median, the named stragglers."""
    if not m.windows and not m.stragglers:
        return {}
    out: dict[str, Any] = {
        "stragglers": [
            {k: s.get(k) for k in ("rank", "host", "slowdown", "step", "windows", "run", "compute_ms", "median_ms")}
            for s in m.stragglers
        ]
    }
    if m.windows:
        out["rank_windows"] = len(m.windows)
        out["ranks_compared"] = max(len(w["compute_ms"]) for w in m.windows)
        ratios: dict[int, list[float]] = {}
        for window in m.windows:
            median = window.get("median_ms")
            for rank, value in enumerate(window["compute_ms"]):
                if value is not None and median:
                    ratios.setdefault(rank, []).append(value / median)
        if ratios:
            rank = max(ratios, key=lambda r: statistics.fmean(ratios[r]))
            out["slowest_rank"] = {
                "rank": rank,
                "host": m.hosts.get(rank),
                "slowdown": round(statistics.fmean(ratios[rank]) - 1, 4),
            }
    return out


def _memory_summary(m: Metrics) -> dict[str, Any]:
    """Peak memory per rank (the newest run's end, else rank 0's rows) and the micro-batch chosen last."""
    out: dict[str, Any] = {}
    peaks = [e["peak_bytes"] for e in m.memory if e.get("event") == "memory" and isinstance(e.get("peak_bytes"), list)]
    rank0 = [r["peak_mem_bytes"] for r in m.rows if isinstance(r.get("peak_mem_bytes"), (int, float))]
    if peaks or rank0:
        out["peak_mem_bytes"] = peaks[-1] if peaks else [max(rank0)]
    chosen = [e for e in m.memory if e.get("event") == "micro_batch"]
    if chosen:
        out["micro_batch"] = {k: chosen[-1].get(k) for k in ("micro_batch", "batch", "per_step", "reason", "step")}
        out["micro_batch_changes"] = len(chosen)
    return out


def _duration(seconds: float) -> str:
    return format_slurm_time(round(seconds))  # D-HH:MM:SS, as sacct and squeue write a duration


def format_summary(s: dict[str, Any]) -> str:
    lines = []
    who = ", ".join(
        str(x) for x in (s.get("backend"), f"{s['world_size']} processes" if s.get("world_size") else None, s.get("device")) if x
    )
    lines.append(f"job {s.get('job_id') or '?'}" + (f" ({who})" if who else ""))

    def add(label: str, value: str) -> None:
        lines.append(f"  {label:<16}{value}")

    if "duration_s" in s:
        add("duration", f"{_duration(s['duration_s'])} wall, {_duration(s['step_time_s'])} in steps")
    add("runs", f"{s['runs']} ({s['restarts']} restart{'s' if s['restarts'] != 1 else ''})")
    missing = f", {s['missing_steps']} missing" if s.get("missing_steps") else ""
    add("steps", f"{s['steps']} ({s['steps_recorded']} recorded{missing})")
    if "steps_per_s" in s:
        rate = f"{s['steps_per_s']:.2f} steps/s, median step {s['median_step_s'] * 1e3:.1f} ms"
        if "samples_per_s" in s:
            rate = f"{s['samples_per_s']:,.0f} samples/s, " + rate
        add("throughput", rate)
        add("communication", f"{s['comm_share'] * 100:.1f}% of step time")
    if "final_loss" in s:
        add("loss", f"{s['first_loss']:.4g} -> {s['final_loss']:.4g} (rank 0)")
    if "gpu_util_mean" in s:
        add("GPU", f"{s['gpu_util_mean']:.0f}% utilised on average, {s['gpu_mem_max_bytes'] / 2**30:.1f} GiB at most")
    for label, line in _numerics_lines(s):
        add(label, line)
    if "peak_mem_bytes" in s:
        add("peak memory", ", ".join(f"{b / 2**30:.2f} GiB (rank {r})" for r, b in enumerate(s["peak_mem_bytes"])))
    if "micro_batch" in s:
        mb = s["micro_batch"]
        why = f"{mb['per_step']} per step; {mb['reason']}, step {mb['step']} on"
        add("micro-batch", f"{mb['micro_batch']} of {mb['batch']} ({why})")
    if "stragglers" in s:
        for label, line in zip(["stragglers"] + [""] * len(s["stragglers"]), _straggler_lines(s)):
            add(label, line)
    if s.get("unreadable_lines"):
        add("note", f"{s['unreadable_lines']} unreadable line(s) skipped")
    if s.get("profile"):  # --profile's traces: top operators, communication against compute (hpc_train.jobs.traces)
        lines.extend(traces.format_lines(s["profile"]))
    if s.get("goodput"):  # where the allocation went and how each run ended (hpc_train.jobs.goodput)
        lines.extend(goodput.format_lines(s["goodput"]))
    return "\n".join(lines)


def _straggler_lines(s: dict[str, Any]) -> list[str]:
    lines = []
    for named in s["stragglers"]:
        where = f" on {named['host']}" if named.get("host") else ""
        compute = (
            f" (compute {named['compute_ms']:.1f} vs {named['median_ms']:.1f} ms/step)"
            if named.get("compute_ms") is not None and named.get("median_ms") is not None
            else ""
        )
        lines.append(
            f"rank {named['rank']}{where}: {named['slowdown'] * 100:.0f}% slower than the median{compute}, "
            f"named at step {named['step']} (run {named.get('run', '?')})"
        )
    if not lines:
        details = [f"{s['rank_windows']} windows of {s['ranks_compared']} ranks compared"] if "rank_windows" in s else []
        slowest = s.get("slowest_rank")
        if slowest:
            details.append(f"slowest rank {slowest['rank']}, {slowest['slowdown'] * 100:+.0f}% against the median")
        lines.append("none named" + (f" ({'; '.join(details)})" if details else ""))
    return lines


# -- plots ---------------------------------------------------------------------------------------
def smooth(values: list[float], weight: float | None = None) -> list[float]:
    """TensorBoard's debiased exponential moving average; the weight grows with the number of points."""
    if weight is None:
        window = max(3.0, len(values) / 15)
        weight = 1 - 2 / (window + 1)
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = last * weight + (1 - weight) * v
        norm = norm * weight + (1 - weight)
        out.append(last / norm)
    return out


COLOURS = {"loss": "#1f77b4", "throughput": "#2ca02c", "comm": "#d62728", "gpu": "#9467bd"}
# every rank its own line up to this many; past it a band (fastest to slowest) and the named ranks
RANK_LINES_UP_TO = 16


def plot(m: Metrics, out_dir: str | Path, title: str | None = None) -> list[Path]:
    """Write loss.png, throughput.png and comm_share.png (gpu.png with GPU data, ranks.png with per-rank
    windows); return their paths."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "plots need matplotlib, which is not installed",
            hint="pip install 'hpc_train[report]' (or matplotlib), or use --no-plots",
        ) from None
    matplotlib.use("Agg")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    job_id = m.runs[-1].info.get("job_id") if m.runs else None
    title = title or (f"job {job_id}" if job_id else m.path.parent.parent.name)
    steady = m.steady
    loss = [(r["step"], r["loss"]) for r in m.rows if r.get("loss") is not None]
    rate = [(r["step"], r["samples_per_s"]) for r in steady if r.get("samples_per_s") is not None]
    median_rate = statistics.median(y for _, y in rate) if rate else 0.0
    comm = [(r["step"], 100.0 * r["comm_share"]) for r in steady if r.get("comm_share") is not None]
    total = sum(r.get("comm_s", 0.0) for r in steady) / max(1e-12, sum(r["step_s"] for r in steady)) * 100
    util = [(r["step"], r["gpu_util"]) for r in m.rows if "gpu_util" in r]
    figures = [
        Figure("loss", "Training loss", "loss (rank 0's batch)", loss, log_ok=True),
        Figure(
            "throughput",
            "Throughput",
            "samples / second (all ranks)",
            rate,
            reference=(f"median {median_rate:,.0f} samples/s", median_rate),
            robust=True,
        ),
        Figure(
            "comm_share",
            "Time in gradient communication",
            "share of step time",
            comm,
            percent=True,
            reference=(f"whole run {total:.1f}%", total),
        ),
        Figure("gpu", "GPU utilisation (rank 0, NVML)", "utilisation", util, percent=True),
    ]
    written = [_figure(m, out / f"{f.name}.png", f"{f.heading} — {title}", f) for f in figures if f.series]
    if m.windows:
        written.append(_rank_figure(m, out / "ranks.png", f"Compute time per rank — {title}"))
    return written


@dataclass(frozen=True)
class Figure:
    """One metric to plot over the steps, and how its axis reads."""

    name: str  # the file's name, and its colour (COLOURS by the part before "_")
    heading: str
    ylabel: str
    series: list[tuple[int, float]]
    percent: bool = False
    log_ok: bool = False  # a log scale where the values span decades
    reference: tuple[str, float] | None = None  # a dotted line: its label and value
    robust: bool = False  # rare spikes clipped from the axis


def _figure(m: Metrics, path: Path, heading: str, figure: Figure) -> Path:
    """One metric over the steps: every step faint, smoothed bold, the runs marked; written to ``path``."""
    import matplotlib.pyplot as plt

    colour, reference = COLOURS[figure.name.split("_")[0]], figure.reference
    xs, ys = [p[0] for p in figure.series], [p[1] for p in figure.series]
    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=120, layout="constrained")
    ax.plot(xs, ys, color=colour, alpha=0.28, linewidth=1.0, label="every step")
    if len(ys) > 2:
        ax.plot(xs, smooth(ys), color=colour, linewidth=2.2, label="smoothed")
    if reference:
        ax.axhline(reference[1], color="#555555", linestyle=":", linewidth=1.2, label=reference[0])
    _y_axis(ax, ys, percent=figure.percent, log_ok=figure.log_ok, robust=figure.robust)
    _mark_runs(ax, m, xs)
    ax.set_title(heading, fontsize=13, loc="left")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(figure.ylabel)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="best", frameon=False, fontsize=9)
    fig.savefig(path)
    plt.close(fig)
    return path


def _y_axis(ax: Any, ys: list[float], *, percent: bool, log_ok: bool, robust: bool) -> None:
    """Log scale for a loss spanning decades; a throughput's rare spikes clipped; percentages as such."""
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    positive = [y for y in ys if y > 0]
    if log_ok and positive and len(positive) == len(ys) and max(ys) / min(positive) > 100:
        ax.set_yscale("log")
    elif robust and len(ys) > 10:
        high = sorted(ys)[int(0.99 * (len(ys) - 1))]
        ax.set_ylim(0, high * 1.15 if high > 0 else 1)
    else:
        ax.set_ylim(bottom=0 if min(ys) >= 0 else None)
    if percent:
        ax.set_ylim(0, max(5.0, min(100.0, max(ys) * 1.15)))
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    elif not log_ok:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}"))


def _mark_runs(ax: Any, m: Metrics, xs: list[int]) -> None:
    """A dashed line where each requeued run resumed, and a shade over the steps it redid."""
    if len(m.runs) < 2:
        return
    from matplotlib.transforms import blended_transform_factory

    top = blended_transform_factory(ax.transData, ax.transAxes)
    for previous, run in zip(m.runs, m.runs[1:]):
        x = run.start_step + 0.5
        ax.axvline(
            x,
            color="#ff7f0e",
            linestyle="--",
            linewidth=1.3,
            label="requeued: next run resumes" if previous is m.runs[0] else None,
        )
        if previous.end_step is not None and previous.end_step > run.start_step:
            ax.axvspan(
                x,
                previous.end_step + 0.5,
                color="#ff7f0e",
                alpha=0.08,
                label="steps redone from the checkpoint" if previous is m.runs[0] else None,
            )
        ax.text(x, 0.98, f" run {run.run}", transform=top, color="#ff7f0e", fontsize=9, va="top", ha="left")


def _rank_figure(m: Metrics, path: Path, heading: str) -> Path:
    """Each rank's compute time per step (step time minus communication) over the windows, the median
    dashed, the named stragglers in colour with a mark where they were named."""
    import matplotlib.pyplot as plt

    xs = [w["last_step"] for w in m.windows]
    world = max(len(w["compute_ms"]) for w in m.windows)

    def series(rank: int) -> list[float]:
        values = [w["compute_ms"][rank] if rank < len(w["compute_ms"]) else None for w in m.windows]
        return [math.nan if v is None else v for v in values]

    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=120, layout="constrained")
    named = sorted({s["rank"] for s in m.stragglers if s.get("rank", world) < world})
    if world <= RANK_LINES_UP_TO:
        for rank in range(world):
            if rank not in named:
                ax.plot(
                    xs,
                    series(rank),
                    color="#9e9e9e",
                    alpha=0.6,
                    linewidth=1.0,
                    label="other ranks" if rank == min(set(range(world)) - set(named), default=-1) else None,
                )
    else:
        low = [min((v for v in w["compute_ms"] if v is not None), default=math.nan) for w in m.windows]
        high = [max((v for v in w["compute_ms"] if v is not None), default=math.nan) for w in m.windows]
        ax.fill_between(xs, low, high, color="#9e9e9e", alpha=0.25, linewidth=0, label=f"all {world} ranks (fastest to slowest)")
    ax.plot(xs, [w.get("median_ms", math.nan) for w in m.windows], color="#333333", linestyle="--", linewidth=1.4, label="median")
    hosts, marked = m.hosts, False
    for i, rank in enumerate(named):
        colour = STRAGGLER_COLOURS[i % len(STRAGGLER_COLOURS)]
        host = f" on {hosts[rank]}" if rank in hosts else ""
        ax.plot(xs, series(rank), color=colour, linewidth=2.2, label=f"rank {rank}{host} (straggler)")
        for s in (s for s in m.stragglers if s["rank"] == rank and s.get("step") in xs):
            ax.plot(
                [s["step"]],
                [series(rank)[xs.index(s["step"])]],
                marker="o",
                color=colour,
                markersize=7,
                linestyle="none",
                label=None if marked else "named",
            )
            marked = True
    ax.set_ylim(bottom=0)
    _mark_runs(ax, m, xs)
    ax.set_title(heading, fontsize=13, loc="left")
    ax.set_xlabel("optimizer step (end of each window)")
    ax.set_ylabel("compute ms / step (not in communication)")
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="best", frameon=False, fontsize=9)
    fig.savefig(path)
    plt.close(fig)
    return path


STRAGGLER_COLOURS = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]
