"""How long a checkpoint blocks training: sync save, async save, and a plain torch.save, same run.

For a ~200 MB and a ~1 GB model (fp32 Linear stacks), in one process, each measured --repeats times
(medians): the time the training loop is blocked, and for async also when the write is committed.
Each mode uses one checkpointer that saves repeatedly, as a training run does; the first async save,
which also allocates the staging buffers, is shown on its own ("1st async").
Target: async blocks training for at most 10 % of the sync save's time.

Then the digests: how fast sha256 and blake2b hash in memory (GB/s; the COMMIT marker's digest is
chosen by this), and what checking a checkpoint's digests costs on restore, per GiB and as a share
of the whole restore (read from the page cache, as right after a requeue on the same node; from a
cold parallel filesystem the read dominates both).

    .venv/bin/python bench/checkpoint.py [--sizes 200,1000] [--repeats 3] [--folder /tmp/x]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hpc_train.runtime.base import BackendRuntime
from hpc_train.runtime.context import Context
from hpc_train.runtime.environment import detect
from hpc_train.runtime.options import RuntimeOptions

TARGET = 0.10


def model_of(megabytes: int) -> torch.nn.Module:
    width = 2048  # one layer = 2048 x 2048 fp32 = 16 MiB
    layers = max(1, round(megabytes * 2**20 / (width * width * 4)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])


def measure(megabytes: int, repeats: int, root: Path) -> dict[str, float]:
    env = detect({})
    ctx = Context(env, "torchrun", BackendRuntime(env, RuntimeOptions()))
    model = model_of(megabytes)
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    plain, sync, blocked, committed = [], [], [], []
    for i in range(repeats):
        path = root / f"plain-{i}.pt"
        start = time.perf_counter()
        torch.save(model.state_dict(), path)
        plain.append(time.perf_counter() - start)
        path.unlink()

    # One checkpointer per mode saving again and again, as in training: the first async save also
    # allocates its staging buffers (page faults); it is reported apart from the steady state.
    ckpt = ctx.checkpointer(root / "sync", keep=1, async_save=False)
    for i in range(repeats):
        start = time.perf_counter()
        ckpt.save(i + 1)
        sync.append(time.perf_counter() - start)
    ckpt.close()

    ckpt = ctx.checkpointer(root / "async", keep=1, async_save=True)
    for i in range(repeats + 1):
        start = time.perf_counter()
        ckpt.save(i + 1)
        blocked.append(time.perf_counter() - start)
        ckpt.wait()
        committed.append(time.perf_counter() - start)
    ckpt.close()
    first = blocked.pop(0)
    committed.pop(0)
    verify, restore = [], []
    for _ in range(repeats):
        ckpt = ctx.checkpointer(root / "sync", keep=1)
        path = ckpt.complete()[0][1]
        start = time.perf_counter()
        assert ckpt.verify(path) is None
        verify.append(time.perf_counter() - start)
        start = time.perf_counter()
        ckpt.restore()  # verifies too: the share is of everything restore() does
        restore.append(time.perf_counter() - start)
        ckpt.close()
    on_disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30
    return {
        "MiB": size,
        "plain": statistics.median(plain),
        "sync": statistics.median(sync),
        "async_blocked": statistics.median(blocked),
        "async_committed": statistics.median(committed),
        "async_first": first,
        "verify": statistics.median(verify),
        "restore": statistics.median(restore),
        "GiB": on_disk,
    }


def hash_rates(megabytes: int = 256, repeats: int = 3) -> dict[str, float]:
    """GB/s of each candidate digest over an in-memory buffer, in the 8 MiB chunks restore() reads."""
    data = memoryview(os.urandom(megabytes * 2**20))
    rates = {}
    for name in ("sha256", "blake2b"):
        times = []
        for _ in range(repeats):
            h = hashlib.new(name)
            start = time.perf_counter()
            for i in range(0, len(data), 8 << 20):
                h.update(data[i : i + (8 << 20)])
            times.append(time.perf_counter() - start)
        rates[name] = len(data) / min(times) / 1e9
    return rates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="200,1000", help="model sizes in MB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.folder or tempfile.mkdtemp(prefix="hpc_train-ckpt-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        print(
            f"{'model':>9} {'torch.save':>11} {'sync save':>10} {'async blocks':>13} {'async done':>11} "
            f"{'1st async':>10} {'async/sync':>11} {'sync/plain':>11}"
        )
        results = []
        for megabytes in (int(s) for s in args.sizes.split(",")):
            r = measure(megabytes, args.repeats, root)
            results.append(r)
            ratio = r["async_blocked"] / r["sync"]
            print(
                f"{r['MiB']:>6.0f}MiB {r['plain']:>10.3f}s {r['sync']:>9.3f}s {r['async_blocked']:>12.3f}s "
                f"{r['async_committed']:>10.3f}s {r['async_first']:>9.3f}s {ratio:>11.3f} {r['sync'] / r['plain']:>11.2f}"
                f"  {'met' if ratio <= TARGET else 'NOT met'} (target async/sync <= {TARGET})"
            )
        rates = hash_rates()
        print("\ndigest in memory: " + ", ".join(f"{name} {rate:.2f} GB/s" for name, rate in rates.items()))
        print(f"{'model':>9} {'on disk':>9} {'verify':>9} {'per GiB':>9} {'restore':>9} {'verify/restore':>15}")
        for r in results:
            print(
                f"{r['MiB']:>6.0f}MiB {r['GiB'] * 1024:>6.0f}MiB {r['verify']:>8.3f}s {r['verify'] / r['GiB']:>8.3f}s "
                f"{r['restore']:>8.3f}s {r['verify'] / r['restore']:>15.2f}"
            )
    finally:
        if not args.folder:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
