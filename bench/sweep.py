"""Sweep submission and polling cost on the Slurm sandbox (needs the cluster up: SLURM_CONF).

    python bench/sweep.py [--tasks 200] [--repeats 3] [--no-submitit] [--poll-cycles N]

1. Submission time of an N-task sweep: hpc_train.sweep (its code snapshot on: the script is one file of a
   200-file git project) against raw `sbatch --array` and against submitit's map_array, each as the
   cluster's MaxArraySize requires (arrays of at most that many tasks: ceil(N / MaxArraySize) sbatch calls
   for everyone). Median of --repeats; every array but the last hpc_train one is cancelled at once. Target
   (issue 33): <= 1.5x raw at 10,000 tasks. Every side submits held (released only to be polled): trivial
   tasks that start while the submission goes on keep the controller busy starting and ending them, and made
   every later sbatch 5-10x slower on this sandbox, whoever submitted it. With --paired, the sweep is also
   timed against a raw sbatch of the same size after each of its arrays: the controller's cost per sbatch
   grows with the jobs it holds, so at 10,000 tasks whichever side runs second pays for the first's records. The snapshot store after every sweep of the run: how many trees,
   and its size against the project's (target <= 1.05x: one snapshot for the whole sweep).
2. Submission time with 2000 old job folders and records beside it, against an empty job root.
3. Scheduler calls while polling the sweep (trivial tasks), counted by shims on PATH that log each
   squeue/sacct/scontrol call: calls per poll cycle, for N tasks and for MaxArraySize tasks. To completion,
   or for --poll-cycles cycles (the default past 1,000 tasks: 10,000 tasks take the sandbox's 3 nodes long).

A sweep of 10,000 needs room in the controller: MaxJobCount (the sandbox's HPC_TRAIN_SANDBOX_MAX_JOB_COUNT).
"""

from __future__ import annotations

import argparse
import math
import os
import re
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


def raw_sbatch(folder: Path, n: int, size: int, hold: bool = True) -> tuple[float, list[str]]:
    script = folder / "raw.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    ids = []
    start = time.perf_counter()
    for chunk in range(math.ceil(n / size)):
        count = min(size, n - chunk * size)
        out = subprocess.run(
            [
                "sbatch",
                "--parsable",
                *(["--hold"] if hold else []),
                f"--array=0-{count - 1}",
                "--time=5",
                "-o",
                "/dev/null",
                str(script),
            ],
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
    executor.update_parameters(time=5, additional_parameters={"hold": True})
    jobs = []
    for chunk in range(math.ceil(n / size)):
        jobs += executor.map_array(abs, range(chunk * size, min(n, (chunk + 1) * size)))
    elapsed = time.perf_counter() - start
    return elapsed, sorted({j.job_id.split("_")[0] for j in jobs})


def store_size(job_roots: list[Path], project: Path) -> str:
    """The snapshots under the job roots against the project: trees, and the bytes of their files (each inode
    once: a tree's files are hard links to the store's objects) with each tree's manifest; the index (a cache of
    the project's stamps, one per project, not per snapshot) apart."""

    def content(folders: list[Path]) -> int:
        seen, total = set(), 0
        for folder in folders:
            for path in folder.rglob("*"):
                info = path.lstat()
                if path.is_file() and not path.is_symlink() and info.st_ino not in seen:
                    seen.add(info.st_ino)
                    total += info.st_size
        return total

    stores = [root / "snapshots" for root in job_roots if (root / "snapshots").is_dir()]
    trees = sum(1 for store in stores for tree in (store / "trees").iterdir() if tree.is_dir())
    from hpc_train.snapshot.files import find_project, project_files

    own = sum(entry.size for entry in project_files(find_project(project / "train.py")))
    stored = content([folder for store in stores for folder in (store / "objects", store / "trees")])
    index = content([store / "index" for store in stores])
    return (
        f"{trees} snapshot tree(s) in {len(stores)} store(s): {stored / 1e3:.1f} kB with their manifests against the "
        f"project's {own / 1e3:.1f} kB ({stored / own:.3f}x, target <= 1.05x); the index {index / 1e3:.1f} kB"
    )


def paired_sweep(folder: Path, script: Path, n: int) -> tuple[float, float, object, list[str]]:
    """hpc_train.sweep with a raw ``sbatch --array`` of the same size after each of its arrays: the controller's
    cost per sbatch grows with the jobs it holds (4 ms with none pending, 40 ms with 8,600 on this sandbox), so
    at 10,000 tasks whichever side runs second pays for the first's records. Paired, both meet the same queue.
    Returns the sweep's time without the raw calls, the raw calls' time, the handle and the raw arrays' ids."""
    from hpc_train.submission import executor

    submit_script, raw_times, raw_ids = executor.submit_script, [], []
    raw = folder / "raw.sh"
    folder.mkdir(parents=True, exist_ok=True)
    raw.write_text("#!/bin/bash\ntrue\n")

    def with_raw(sweep_executor, slurm_conf):
        job = submit_script(sweep_executor, slurm_conf)
        size = re.search(r"^#SBATCH --array=0-(\d+)", sweep_executor._render(""), re.MULTILINE)
        start = time.perf_counter()
        out = subprocess.run(
            ["sbatch", "--parsable", "--hold", f"--array=0-{size.group(1)}", "--time=5", "-o", "/dev/null", str(raw)],
            capture_output=True,
            text=True,
            check=True,
        )
        raw_times.append(time.perf_counter() - start)
        raw_ids.append(out.stdout.strip().split(";")[0])
        return job

    executor.submit_script = with_raw  # submit_arrays imports it at each call
    try:
        total, handle = hpc_train_sweep(folder, script, n)
    finally:
        executor.submit_script = submit_script
    return total - sum(raw_times), sum(raw_times), handle, raw_ids


def hpc_train_sweep(folder: Path, script: Path, n: int, hold: bool = True) -> tuple[float, object]:
    import hpc_train

    start = time.perf_counter()
    handle = hpc_train.sweep(
        script,
        over={"i": list(range(n))},
        site="sandbox",
        backend="mpi",
        requeue=False,
        python="/bin/true",
        job_root=str(folder),
        sbatch={"hold": True} if hold else {},
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


def poll(handle, log: Path, cycles: int | None) -> dict[str, float]:
    """Release the sweep (submitted held), then poll it to completion, or ``cycles`` times a second apart (then
    cancel it)."""
    subprocess.run(["scontrol", "release", *handle.array_ids], capture_output=True, check=False)
    log.write_text("")
    start = time.perf_counter()
    if cycles is None:
        counts = handle.wait(poll_s=1.0, max_poll_s=5.0, timeout_s=900)
    else:
        for _ in range(cycles):
            handle.poll()
            time.sleep(1.0)
        counts = handle.counts(poll=False)
        handle.cancel()
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
    parser.add_argument("--no-submitit", action="store_true", help="leave submitit out (138 s at 10,000 tasks)")
    parser.add_argument("--poll-cycles", type=int, default=None, help="poll N cycles instead of to completion")
    parser.add_argument("--paired", action="store_true", help="also time the sweep against raw sbatch paired array by array")
    args = parser.parse_args()
    if args.poll_cycles is None and args.tasks > 1000:
        args.poll_cycles = 10
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
    from snapshot import make_project  # bench/snapshot.py's git project

    project = work / "project"
    project.mkdir()
    script = make_project(project, 200)

    from hpc_train.plugin.manager import default_plugins
    from hpc_train.sweeps.arrays import max_array_size

    size = max_array_size()
    n = args.tasks
    # Every task submitted here stays a job record in the controller for MinJobAge (an hour on the
    # sandbox), cancelled or not; a full table (MaxJobCount) refuses everyone's jobs. Leave room.
    needed = args.repeats * ((2 if args.no_submitit else 3) * n + 3 * size) + (2 * n if args.paired else 0)
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
        if not args.no_submitit:
            t, ids = submitit_map_array(work, n, size)
            sub.append(t)
            scancel(ids)
        t, handle = hpc_train_sweep(work / f"root{r}", script, n)
        ours.append(t)
        if r == args.repeats - 1:
            keep = handle
        else:
            scancel(handle.array_ids)
    t_raw, t_ours = statistics.median(raw), statistics.median(ours)
    print(f"  raw sbatch --array      {t_raw * 1000:8.1f} ms   ({t_raw / math.ceil(n / size) * 1000:.2f} ms per array)")
    versus = ""
    if sub:
        t_sub = statistics.median(sub)
        print(f"  submitit map_array      {t_sub * 1000:8.1f} ms   ({t_sub / t_raw:.2f}x raw)")
        versus = f", {t_ours / t_sub:.2f}x submitit"
    print(
        f"  hpc_train.sweep         {t_ours * 1000:8.1f} ms   ({t_ours / t_raw:.2f}x raw{versus})"
        f"   target <= 1.5x raw: {'ok' if t_ours <= 1.5 * t_raw else 'MISSED'}"
    )
    print("  " + store_size([work / f"root{r}" for r in range(args.repeats)], project))
    if args.paired:
        scancel(keep.array_ids)  # the sequential run's pending tasks would slow every sbatch that follows
        t_ours, t_raw, keep, raw_ids = paired_sweep(work / "paired", script, n)  # the paired sweep is polled below
        scancel(raw_ids)
        print(
            f"  paired, array by array: hpc_train.sweep {t_ours * 1000:.1f} ms, raw sbatch --array {t_raw * 1000:.1f} ms "
            f"({t_ours / t_raw:.2f}x raw, target <= 1.5x: {'ok' if t_ours <= 1.5 * t_raw else 'MISSED'})"
        )

    log = work / "calls.log"
    path = os.environ["PATH"]
    os.environ["PATH"] = counting_shims(work / "shims", log)
    big_poll = poll(keep, log, args.poll_cycles)
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
    small_poll = poll(small, log, None)
    for row in (small_poll, big_poll):
        print(
            f"polling {row['tasks']:5d} tasks: {row['completed']} COMPLETED in {row['seconds']:.1f} s, "
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
