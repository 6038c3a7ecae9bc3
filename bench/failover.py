"""Fault to training again on the Slurm sandbox: a restart inside the allocation (a spare node) against
the requeue path, same job, same fault (needs the cluster up: SLURM_CONF).

    python bench/failover.py [--repeats 2] [--hang-timeout 10] [--hold] [--no-agent]

Each job trains tests/e2e/faulty_train.py on 2 nodes (torchrun, 1 process each); in its first run rank 1
blocks at step 60. Timed from the job's files:

- detection latency: the ranks' last activity to the watchdog's verdict (hangs.jsonl: quiet_s), against
  the configured --hang-timeout (target: <= timeout + 5 s);
- fault to training again: the verdict to the first optimizer step of the next run (metrics/steps.jsonl),
  detection excluded; inside the allocation (--spare-nodes 1) against the requeue (target: <= 15 s and
  <= 0.25 x the requeue path). The requeue path includes Slurm's requeue and the ~2 min hold a requeued
  job gets, released here the way `submit --wait` does (after RELEASE_MARGIN_S) -- what a user waits.
  ``--hold`` also runs the requeue path with the hold kept: a site without ``requeue.release_held``, or a
  job nobody waits on, where the hold is part of every requeue (and a real queue's wait comes on top).
  ``--no-agent`` runs torchrun without its agent (``-o agent=false``: one srun task per rank).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpc_train import scontrol  # noqa: E402
from hpc_train.contract import RUNS  # noqa: E402
from hpc_train.jobs.handle import RELEASE_MARGIN_S, held_after_requeue  # noqa: E402

SCRIPT = REPO / "tests" / "e2e" / "faulty_train.py"


def submit(job_root: Path, spares: int, hang_timeout: int, agent: bool = True) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "sandbox",
            "--job-root",
            str(job_root),
            "--nodes",
            "2",
            "--procs-per-node",
            "1",
            "--parsable",
            "--checkpoint-every",
            "20",
            "--hang-timeout",
            str(hang_timeout),
            "--spare-nodes",
            str(spares),
            "-o",
            f"agent={str(agent).lower()}",
            str(SCRIPT),
            "--",
            "--steps",
            "120",
            "--hang",
            "1:60",
            "--step-seconds",
            "0.02",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    return out.stdout.strip()


def state(job: str) -> str:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job], capture_output=True, text=True)
    return (out.stdout.split() or ["PENDING"])[-1]


def wait(job: str, timeout: float = 600, release: bool = True) -> None:
    deadline, held_since = time.time() + timeout, None
    while time.time() < deadline and state(job) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        fields = scontrol.show("job", job)
        held_since = (held_since or time.time()) if held_after_requeue(fields) else None
        if release and held_since and time.time() - held_since >= RELEASE_MARGIN_S:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
            held_since = None
        time.sleep(0.5)


def timings(folder: Path) -> dict[str, float]:
    """Detection, then the verdict to training again split where the job's files can time it: the hang's
    report (stacks and flight records collected), the next run counted by the batch script (the step ended,
    the nodes planned; on the requeue path also Slurm's requeue and scheduling), the ranks' process group up
    (torch imported twice under torchrun: the agent, then its workers) and the first optimizer step
    (restore, model wrap, one step)."""
    [hang] = [json.loads(line) for line in (folder / "hangs.jsonl").read_text().splitlines()]
    verdict = max(r["at"] for r in hang["ranks"].values()) + hang["quiet_s"]
    lines = [json.loads(line) for line in (folder / "metrics" / "steps.jsonl").read_text().splitlines()]
    run2 = [r for r in lines if r.get("run") == 2]
    started = min(r["time"] for r in run2 if r.get("event") == "run_start")
    first = min(r["time"] for r in run2 if "step" in r and "event" not in r)
    return {
        "detection": hang["quiet_s"],
        "total": first - verdict,
        "report": hang["at"] - verdict,
        "next run": (folder / RUNS).stat().st_mtime - verdict,
        "ranks up": started - verdict,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hang-timeout", type=int, default=10)
    parser.add_argument("--hold", action="store_true", help="also the requeue path with Slurm's hold kept (~2 min more)")
    parser.add_argument("--no-agent", action="store_true", help="torchrun's -o agent=false: one srun task per rank")
    args = parser.parse_args()
    paths = [("inside the allocation", 1, True), ("requeue", 0, True)]
    if args.hold:
        paths.append(("requeue, hold kept", 0, False))
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in paths}
    with tempfile.TemporaryDirectory(dir="/tmp/hpc_train-sandbox/jobs") as root:
        for _ in range(args.repeats):
            for label, spares, release in paths:
                job = submit(Path(root), spares, args.hang_timeout, agent=not args.no_agent)
                wait(job, release=release)
                results[label].append(timings(Path(root) / job))
    for label, rows in results.items():
        median = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        print(
            f"{label:>22}: detection {median['detection']:5.1f} s (timeout {args.hang_timeout} s), "
            f"fault to training again {median['total']:5.1f} s"
        )
        print(
            f"{'':>22}  from the verdict: report {median['report']:4.1f} s, next run counted {median['next run']:4.1f} s, "
            f"ranks up {median['ranks up']:4.1f} s, first step {median['total']:4.1f} s"
        )
    inside = statistics.median(r["total"] for r in results["inside the allocation"])
    requeue = statistics.median(r["total"] for r in results["requeue"])
    print(f"ratio inside / requeue: {inside / requeue:.3f} (target <= 0.25; inside target <= 15 s)")
    if args.hold:
        held = statistics.median(r["total"] for r in results["requeue, hold kept"])
        print(f"ratio inside / requeue with the hold kept: {inside / held:.3f}")


if __name__ == "__main__":
    main()
