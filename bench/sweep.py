"""Sweep submission and polling cost on the Slurm sandbox (needs the cluster up: SLURM_CONF).

    python bench/sweep.py [--tasks 200] [--repeats 3]

1. Submission time of an N-task sweep: hpc_train.sweep against raw `sbatch --array` and against
   submitit's map_array, each as the cluster's MaxArraySize requires (arrays of at most that many
   tasks: ceil(N / MaxArraySize) sbatch calls for everyone). Median of --repeats; every array but
   the last hpc_train one is cancelled at once.
2. Submission time with 2000 old job folders and records beside it, against an empty job root.
3. Scheduler calls while polling the sweep to completion (trivial tasks), counted by shims on PATH
   that log each squeue/sacct/scontrol call: calls per poll cycle, for N tasks and for MaxArraySize tasks.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TOOLS = ("squeue", "sacct", "scontrol", "sbatch", "scancel")


def scancel(ids: list[str]) -> None:
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)


def raw_sbatch(folder: Path, n: int, size: int) -> tuple[float, list[str]]:
    script = folder / "raw.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    ids = []
    start = time.perf_counter()
    for chunk in range(math.ceil(n / size)):
        count = min(size, n - chunk * size)
        out = subprocess.run(
            ["sbatch", "--parsable", f"--array=0-{count - 1}", "--time=5", "-o", "/dev/null", str(script)],
            capture_output=True,
            text=True,
            check=True,
        )
        ids.append(out.stdout.strip().split(";")[0])
    return time.perf_counter() - start, ids


def submitit_map_array(folder: Path, n: int, size: int) -> tuple[float, list[str]]:
    import submitit

    start = time.perf_counter()
    executor = submitit.SlurmExecutor(folder / "submitit")
    executor.update_parameters(time=5)
    jobs = []
    for chunk in range(math.ceil(n / size)):
        jobs += executor.map_array(abs, range(chunk * size, min(n, (chunk + 1) * size)))
    elapsed = time.perf_counter() - start
    return elapsed, sorted({j.job_id.split("_")[0] for j in jobs})


def hpc_train_sweep(folder: Path, script: Path, n: int) -> tuple[float, object]:
    import hpc_train

    start = time.perf_counter()
    handle = hpc_train.sweep(
        script, over={"i": list(range(n))}, site="sandbox", backend="mpi", requeue=False, python="/bin/true", job_root=str(folder)
    )
    return time.perf_counter() - start, handle


def counting_shims(folder: Path, log: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        shim = folder / tool
        shim.write_text(f'#!/bin/bash\necho "{tool} $*" >> {log}\nexec {real} "$@"\n')
        shim.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def poll_to_completion(handle, log: Path) -> dict[str, float]:
    log.write_text("")
    start = time.perf_counter()
    counts = handle.wait(poll_s=1.0, max_poll_s=5.0, timeout_s=900)
    elapsed = time.perf_counter() - start
    calls = [line.split()[0] for line in log.read_text().splitlines()]
    polls = sum(1 for c in calls if c in ("squeue", "sacct"))
    return {
        "tasks": len(handle),
        "completed": counts.get("COMPLETED", 0),
        "seconds": elapsed,
        "cycles": handle.cycles,
        "poll_calls": polls,
        "other_calls": len(calls) - polls,
        "per_cycle": polls / max(1, handle.cycles),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old-jobs", type=int, default=2000)
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF") and Path("/tmp/hpc_train-sandbox/etc/slurm.conf").exists():
        os.environ["SLURM_CONF"] = "/tmp/hpc_train-sandbox/etc/slurm.conf"
    if subprocess.run(["scontrol", "ping"], capture_output=True, check=False).returncode != 0:
        print("bench/sweep.py needs the Slurm sandbox: make cluster-up", file=sys.stderr)
        return 2
    jobs_dir = Path("/tmp/hpc_train-sandbox/jobs")
    jobs_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-", dir=jobs_dir))
    work.chmod(0o755)
    os.environ["HPC_TRAIN_STATE_DIR"] = str(work / "state")
    script = work / "task.py"
    script.write_text("pass\n")

    from hpc_train.plugin.manager import default_plugins
    from hpc_train.sweeps.arrays import max_array_size

    size = max_array_size()
    n = args.tasks
    # Every task submitted here stays a job record in the controller for MinJobAge (an hour on the
    # sandbox), cancelled or not; a full table (MaxJobCount) refuses everyone's jobs. Leave room.
    needed = args.repeats * (3 * n + 3 * size)
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=False).stdout
    limit = int(next((line.split("=")[1] for line in config.splitlines() if line.startswith("MaxJobCount")), "10000"))
    existing = len(
        subprocess.run(
            ["squeue", "-h", "-r", "--states=all", "-o", "%i"], capture_output=True, text=True, check=False
        ).stdout.split()
    )
    if existing + 2 * needed > limit:
        print(
            f"bench/sweep.py would add {needed} job records to the controller's {existing} (MaxJobCount {limit}); "
            "wait until finished jobs age out (MinJobAge) or use --tasks/--repeats",
            file=sys.stderr,
        )
        return 2
    import hpc_train.api
    import hpc_train.submission.executor  # noqa: F401  (a warm process: imports are not what is measured)

    default_plugins()  # plugin discovery once, as in any process that submits more than one thing
    print(f"sweep of {n} trivial tasks; MaxArraySize {size}: {math.ceil(n / size)} array(s) each way; median of {args.repeats}")

    raw, sub, ours = [], [], []
    keep = None
    for r in range(args.repeats):
        t, ids = raw_sbatch(work, n, size)
        raw.append(t)
        scancel(ids)
        t, ids = submitit_map_array(work, n, size)
        sub.append(t)
        scancel(ids)
        t, handle = hpc_train_sweep(work / f"root{r}", script, n)
        ours.append(t)
        if r == args.repeats - 1:
            keep = handle
        else:
            scancel(handle.array_ids)
    t_raw, t_sub, t_ours = (statistics.median(x) for x in (raw, sub, ours))
    print(f"  raw sbatch --array      {t_raw * 1000:8.1f} ms")
    print(f"  submitit map_array      {t_sub * 1000:8.1f} ms   ({t_sub / t_raw:.2f}x raw)")
    print(
        f"  hpc_train.sweep         {t_ours * 1000:8.1f} ms   ({t_ours / t_raw:.2f}x raw, {t_ours / t_sub:.2f}x submitit)"
        f"   target <= 2x raw: {'ok' if t_ours <= 2 * t_raw else 'MISSED'}"
    )

    log = work / "calls.log"
    path = os.environ["PATH"]
    os.environ["PATH"] = counting_shims(work / "shims", log)
    big_poll = poll_to_completion(keep, log)
    os.environ["PATH"] = path

    # the same sweep beside many old job folders and records: nothing may look at them
    crowded = work / "crowded"
    for i in range(args.old_jobs):
        (crowded / str(100000 + i)).mkdir(parents=True)
        (crowded / str(100000 + i) / "hpc_train.json").write_text("{}")
    records = Path(os.environ["HPC_TRAIN_STATE_DIR"]) / "jobs"
    records.mkdir(parents=True, exist_ok=True)
    for i in range(args.old_jobs):
        (records / f"{100000 + i}.json").write_text("{}")
    empty, full = [], []
    for r in range(args.repeats):
        t, handle = hpc_train_sweep(work / f"empty{r}", script, size)
        empty.append(t)
        scancel(handle.array_ids)
        t, handle = hpc_train_sweep(crowded, script, size)
        full.append(t)
        if r < args.repeats - 1:
            scancel(handle.array_ids)
        else:
            small = handle
    t_empty, t_full = statistics.median(empty), statistics.median(full)
    one = []
    for _ in range(args.repeats):
        t, ids = raw_sbatch(work, size, size)
        one.append(t)
        scancel(ids)
    t_one = statistics.median(one)
    print(
        f"{size}-task sweep: empty job root {t_empty * 1000:.1f} ms, beside {args.old_jobs} old job folders and "
        f"records {t_full * 1000:.1f} ms ({t_full / t_empty:.2f}x)"
    )
    print(
        f"{size}-task sweep (one array): hpc_train.sweep {t_empty * 1000:.1f} ms, one raw sbatch --array "
        f"{t_one * 1000:.1f} ms ({t_empty / t_one:.2f}x)"
    )

    os.environ["PATH"] = counting_shims(work / "shims", log)
    small_poll = poll_to_completion(small, log)
    for row in (small_poll, big_poll):
        print(
            f"polling {row['tasks']:4d} tasks to completion: {row['completed']} COMPLETED in {row['seconds']:.1f} s, "
            f"{row['cycles']} cycles, {row['poll_calls']} squeue/sacct calls ({row['per_cycle']:.2f} per cycle), "
            f"{row['other_calls']} other scheduler calls"
        )
    naive = big_poll["cycles"] * big_poll["tasks"]
    print(
        f"  calls per cycle, {big_poll['tasks']} tasks vs {small_poll['tasks']}: "
        f"{big_poll['per_cycle'] / small_poll['per_cycle']:.2f}x; one state call per task per cycle would have made "
        f"{naive} calls ({naive / max(1, big_poll['poll_calls']):.0f}x)"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
