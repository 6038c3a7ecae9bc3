"""A rank's start-up in a job's Python: torch imported with the collector paused and frozen after
(runtime/boot/hpc_train_gc.py) against the same Python with HPC_TRAIN_FREEZE_TORCH=0.

Each run is a fresh ``python`` with the boot folder first on PYTHONPATH, as every Python of a job starts,
that imports torch and steps a first optimizer (which imports torch._dynamo, as DDP does). The two kinds
alternate, N of each, and the CPU each took (user + system, from the kernel's accounting of the child) is
compared: CPU, not wall time, because on a shared 2-core machine wall time counts the waits for a core.
Printed: the median CPU seconds of each, their ratio, and the lowest and highest ratio of one pair.

    .venv/bin/python bench/rank_start.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hpc_train import contract
from hpc_train.runtime.boot import FOLDER

TARGET = 0.8  # the frozen start-up's CPU, of the collector's
RANK = "import torch\ntorch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1).step()\n"


def start_cpu(freeze: bool) -> float:
    """CPU seconds of one fresh Python of a job that imports torch and steps an optimizer."""
    env = {**os.environ, "PYTHONPATH": FOLDER, "OMP_NUM_THREADS": "1", contract.ENV_FREEZE_TORCH: "1" if freeze else "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a job's Python keeps its bytecode
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", RANK], env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    start_cpu(True)  # the page cache warmed for both
    frozen, collected = [], []
    for i in range(args.runs):
        pair = [(True, frozen), (False, collected)]
        for freeze, into in pair if i % 2 == 0 else pair[::-1]:
            into.append(start_cpu(freeze))
    ratios = [f / c for f, c in zip(frozen, collected)]
    ratio = statistics.median(frozen) / statistics.median(collected)
    print(f"rank start-up, CPU s (median of {args.runs}): frozen {statistics.median(frozen):.2f}, "
          f"collector running {statistics.median(collected):.2f}")  # fmt: skip
    print(
        f"ratio {ratio:.2f} (pairs {min(ratios):.2f}-{max(ratios):.2f}); target <= {TARGET}: {'ok' if ratio <= TARGET else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
