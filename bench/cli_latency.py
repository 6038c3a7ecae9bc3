"""CLI latency on a login node: `hpc_train render` for a 4-node job against torchx's dry run.

Both run in this process's machine in the same run, alternating, N times each; we print the median
wall times, their ratio, and how many modules each command imports (python -X importtime). For the
record, also hpc_train with its caches off (HPC_TRAIN_NO_CACHE=1): the first run after an install.
torchx lives only in the bench environment (.bench-venv), created here when missing.

With --instructions, each command also runs once under valgrind's callgrind, which counts the
instructions it executes: the same count whatever else the machine is doing (a loaded login node, or
make test beside it), where wall times on a busy machine say little.

    .venv/bin/python bench/cli_latency.py [--runs 15] [--instructions]
"""

from __future__ import annotations

import argparse
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
BENCH_VENV = REPO / ".bench-venv"
TARGET_WARM, TARGET_COLD = 0.45, 0.9  # of torchx's dry run (issue 32)


def ensure_torchx() -> Path:
    torchx = BENCH_VENV / "bin" / "torchx"
    if not torchx.exists():
        print("creating .bench-venv with torchx (bench only) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(BENCH_VENV / "bin" / "pip"), "install", "-q", "torchx"], check=True)
    return torchx


# As on a login node: Python keeps the bytecode of what it imports. (Sandboxes and CI images often
# set PYTHONDONTWRITEBYTECODE, which would make every run recompile an editable install's sources while
# the pip-installed competitor has its .pyc files: not a like-for-like comparison.)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], cwd: Path, env: dict[str, str] = ENV) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return elapsed


def modules_imported(python: str, argv: list[str], cwd: Path, env: dict[str, str] = ENV) -> int:
    out = subprocess.run([python, "-X", "importtime", *argv], cwd=cwd, capture_output=True, text=True, env=env)
    return sum(1 for line in out.stderr.splitlines() if line.startswith("import time:") and "imported package" not in line) - 1


def instructions(cmd: list[str], cwd: Path, env: dict[str, str] = ENV) -> int:
    """Instructions ``cmd`` executes, by callgrind (its children are not followed: none here)."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd], cwd=cwd, capture_output=True, text=True, env=env
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"valgrind {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--instructions", action="store_true", help="also count instructions (valgrind)")
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    torchx = ensure_torchx()
    work = Path(tempfile.mkdtemp(prefix="hpc_train-bench-"))
    (work / "train.py").write_text("print('train')\n")

    ours_argv = ["-m", "hpc_train", "render", "--site", "bluecloud", "--nodes", "4", "--gpus-per-node", "8", "train.py"]
    theirs_argv = [str(torchx), "run", "--dryrun", "-s", "slurm", "dist.ddp", "-j", "4x8", "--script", "train.py"]
    ours = [sys.executable, *ours_argv]
    theirs = [str(BENCH_VENV / "bin" / "python"), *theirs_argv]

    for cmd in (ours, theirs):  # warm the page cache and any bytecode caches
        timed(cmd, work)
    # hpc_train's own caches (validators, resolved sites, entry points) are warm after the first
    # command, as on a login node; with them off, every run is like the first after an install or edit
    cold_env = {**ENV, "HPC_TRAIN_NO_CACHE": "1"}
    t_ours, t_theirs, t_cold = [], [], []
    for _ in range(args.runs):
        t_ours.append(timed(ours, work))
        t_theirs.append(timed(theirs, work))
        t_cold.append(timed(ours, work, cold_env))
    m_ours, m_theirs, m_cold = statistics.median(t_ours), statistics.median(t_theirs), statistics.median(t_cold)
    n_ours = modules_imported(sys.executable, ours_argv, work)
    n_cold = modules_imported(sys.executable, ours_argv, work, cold_env)
    n_theirs = modules_imported(str(BENCH_VENV / "bin" / "python"), theirs_argv, work)
    ratio = m_ours / m_theirs

    print(f"{'command':<48} {'median s':>9} {'min s':>7} {'modules':>8}")
    print(f"{'hpc_train render (bluecloud, 4x8)':<48} {m_ours:>9.3f} {min(t_ours):>7.3f} {n_ours:>8}")
    print(f"{'torchx run --dryrun -s slurm dist.ddp -j 4x8':<48} {m_theirs:>9.3f} {min(t_theirs):>7.3f} {n_theirs:>8}")
    print(
        f"{'hpc_train render, its caches off (first run)':<48} {m_cold:>9.3f} {min(t_cold):>7.3f} {n_cold:>8}"
        f"   ({m_cold / m_theirs:.2f} of torchx)"
    )
    cold = m_cold / m_theirs
    print(f"warm: {ratio:.2f} of torchx (target <= {TARGET_WARM}) -> {'met' if ratio <= TARGET_WARM else 'NOT met'}")
    print(f"cold: {cold:.2f} of torchx (target <= {TARGET_COLD}) -> {'met' if cold <= TARGET_COLD else 'NOT met'}")
    if args.instructions:
        i_ours, i_theirs, i_cold = instructions(ours, work), instructions(theirs, work), instructions(ours, work, cold_env)
        print(
            f"instructions (callgrind): hpc_train {i_ours / 1e6:.0f} M, torchx {i_theirs / 1e6:.0f} M, hpc_train cold {i_cold / 1e6:.0f} M"
        )
        print(f"  warm {i_ours / i_theirs:.2f} of torchx, cold {i_cold / i_theirs:.2f}")


if __name__ == "__main__":
    main()
