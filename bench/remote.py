"""A submit through a login node over ssh (``--remote``) against the same submit made on the login node, for
an unchanged 2,000-file git project: the second and later submits, as a user repeats them (the first sends
every file). Needs the Slurm sandbox (make cluster-up) and starts its own sshd on 127.0.0.1
(tests/cluster/login_node.py), as the tests do.

    .venv/bin/python bench/remote.py [--files 2000] [--runs 7]

Target (issue 33): over ssh, a second submit of an unchanged tree costs at most 2x the local one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]
TARGET = 2.0


def submit(script: Path, jobs: Path, *extra: str) -> tuple[float, str]:
    argv = ["submit", "--site", "sandbox", "--backend", "mpi", "--no-requeue", "--sbatch", "hold", "--parsable"]
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", *argv, "--job-root", str(jobs), *extra, str(script)],
        capture_output=True,
        text=True,
        cwd=script.parent,
    )
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"submit failed: {out.stderr[-2000:]}")
    return elapsed, out.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("SLURM_CONF", "/tmp/hpc_train-sandbox/etc/slurm.conf")
    if subprocess.run(["scontrol", "ping"], capture_output=True, check=False).returncode != 0:
        print("bench/remote.py needs the Slurm sandbox: make cluster-up", file=sys.stderr)
        return 2
    from snapshot import make_project  # bench/snapshot.py's project

    from tests.cluster.login_node import LoginNode

    work = Path(tempfile.mkdtemp(prefix="bench-remote-", dir="/tmp/hpc_train-sandbox/jobs"))
    work.chmod(0o755)
    node = LoginNode(work / "login").start()
    try:
        os.environ.update(
            HPC_TRAIN_SSH_CONFIG=str(node.config), XDG_CONFIG_HOME=str(work / "config"), HPC_TRAIN_STATE_DIR=str(work / "state")
        )
        config = work / "config" / "hpc_train" / "config.yaml"
        config.parent.mkdir(parents=True)
        config.write_text(f"remote:\n  python: {sys.executable}\n  root: {work / 'uploads'}\n")
        script = make_project(work / "project", args.files)
        jobs = work / "jobs"
        ids = [submit(script, jobs)[1], submit(script, jobs, "--remote", "login")[1]]  # the first of each: stored, sent
        local, remote = [], []
        for _ in range(args.runs):  # alternating: the machine's drift hits both alike
            for times, extra in ((local, ()), (remote, ("--remote", "login"))):
                elapsed, job_id = submit(script, jobs, *extra)
                times.append(elapsed)
                ids.append(job_id)
        subprocess.run(["scancel", *ids], check=False)
        a, b = statistics.median(local), statistics.median(remote)
        print(f"a git project of {args.files + 1} files, unchanged; submit (held, then cancelled), median of {args.runs}")
        print(f"  on the login node          {a * 1000:8.1f} ms")
        print(f"  through it, over ssh       {b * 1000:8.1f} ms")
        print(f"ratio over ssh / local: {b / a:.2f} (target <= {TARGET}) -> {'met' if b / a <= TARGET else 'NOT met'}")
    finally:
        node.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
