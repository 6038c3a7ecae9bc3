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

Then the sharded saves, in one run of --ranks gloo processes (torchrun) on one model (--sharded-mb of
parameters, as much again of SGD momentum): a sync save by rank 0 alone (the old way: the baseline),
a sync save split across all ranks, and an async one split across all ranks. Printed: the time
training is blocked per save (the slowest rank's), and the time until the save is committed.
Targets: async sharded blocks for <= 0.1x the sync rank-0 save; the sharded save's total time is
<= 1.5 / ranks x rank 0 alone's.

Then DeepSpeed (ZeRO-2, Adam) on the same ranks and model: its engine's save, sync and async (the state
dicts copied into kept buffers, written by the checkpoint writer thread); target: async blocks <= 0.1x.

    .venv/bin/python bench/checkpoint.py [--sizes 200,1000] [--repeats 3] [--folder /tmp/x]
                                         [--ranks 4] [--sharded-mb 200] [--only sharded|deepspeed|local|single]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from hpc_train.runtime.context import Context
from hpc_train.runtime.engine.backend import BackendRuntime
from hpc_train.runtime.launch.environment import detect
from hpc_train.runtime.options import RuntimeOptions

TARGET = 0.10
SHARDED_TARGET = 1.5  # x 1/ranks


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


def one_save(ctx: Any, ckpt: Any, step: int) -> tuple[float, float]:
    """The slowest rank's time blocked in save(), and its time until the save is committed."""
    ctx.barrier()
    start = time.perf_counter()
    ckpt.save(step)
    stopped = time.perf_counter() - start
    ckpt.wait()
    finished = time.perf_counter() - start
    slowest = ctx.runtime.gather_object((stopped, finished))
    return max(s for s, _ in slowest), max(f for _, f in slowest)


def disk_time(megabytes: float, root: Path) -> float:
    """Seconds one process takes to write and fsync ``megabytes`` of raw bytes: the one disk's floor."""
    data = memoryview(os.urandom(8 << 20))
    path = root / "disk-floor.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, round(megabytes / 8))):
            f.write(data)
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


def sharded_worker(megabytes: int, repeats: int, root: Path) -> None:
    """One rank of the sharded benchmark (started by torchrun); rank 0 prints."""
    from hpc_train.runtime.checkpoint.manager import Checkpointer
    from hpc_train.runtime.context import init

    ctx = init("torchrun", metrics=False)
    torch.manual_seed(0)
    model = model_of(megabytes)
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    ctx.backward(model(torch.randn(2, 2048)).pow(2).mean())  # momentum buffers: the optimizer's half
    ctx.step()
    state = sum(p.numel() * p.element_size() for p in model.parameters()) * 2 / 2**20
    modes = {
        "sync, rank 0 alone": dict(writers=1, async_save=False),
        "async, rank 0 alone": dict(writers=1, async_save=True),
        "sync, sharded": dict(writers=None, async_save=False),
        "async, sharded": dict(writers=None, async_save=True),
    }
    ckpts = {name: Checkpointer(ctx, root / f"mode-{i}", keep=1, **kw) for i, (name, kw) in enumerate(modes.items())}
    samples = interleaved(ctx, ckpts, repeats)
    if ctx.is_main:
        print_sharded(samples, state, ctx.world_size, disk_time(state, root))
    ctx.shutdown()


def interleaved(ctx: Any, ckpts: dict[str, Any], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Each checkpointer's saves, blocked and committed times, the modes interleaved in a rotating order
    (a shared 2-core machine drifts more than they differ); the first round only warms up (staging
    buffers, files, page cache). The checkpointers are closed after."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ckpts}
    names = list(ckpts)
    for i in range(repeats + 1):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            sample = one_save(ctx, ckpts[name], i + 1)
            if i:
                samples[name].append(sample)
    for ckpt in ckpts.values():
        ckpt.close()
    return samples


def deepspeed_worker(megabytes: int, repeats: int, root: Path) -> None:
    """One rank of the DeepSpeed benchmark (ZeRO-2, Adam): the engine's own save, sync and async, interleaved."""
    from hpc_train.runtime.checkpoint.manager import COMMIT, Checkpointer
    from hpc_train.runtime.context import init

    ctx = init("deepspeed", metrics=False)
    torch.manual_seed(0)
    model = model_of(megabytes)
    model, _ = ctx.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    ctx.backward(model(torch.randn(2, 2048)).pow(2).mean())
    ctx.step()
    modes = {"sync": False, "async": True}
    ckpts = {name: Checkpointer(ctx, root / f"deepspeed-{name}", keep=1, async_save=on) for name, on in modes.items()}
    samples = interleaved(ctx, ckpts, repeats)
    if ctx.is_main:
        newest = next((root / "deepspeed-sync").glob("step-*"))
        files = json.loads((newest / COMMIT).read_text())["files"]
        print(f"\nDeepSpeed ZeRO-2 over {ctx.world_size} gloo ranks, {sum(files.values()) / 2**20:.0f} MiB of engine files:")
        times = {name: tuple(statistics.median(x[k] for x in pairs) for k in (0, 1)) for name, pairs in samples.items()}
        for name, (blocked, done) in times.items():
            print(f"{name:>22} {blocked:>15.3f}s {done:>15.3f}s")
        ratio = times["async"][0] / times["sync"][0]
        print(f"blocking, async / sync engine save: {ratio:.3f}x  {'met' if ratio <= TARGET else 'NOT met'} (target <= {TARGET})")
    ctx.shutdown()


def local_worker(megabytes: int, repeats: int, root: Path) -> None:
    """One rank of the node-local tier's benchmark (2 torchrun "nodes", each with its own local folder):
    saves with and without the tier, interleaved; then restores from the nodes' copies and from shared."""
    from hpc_train import contract
    from hpc_train.runtime.checkpoint.manager import Checkpointer
    from hpc_train.runtime.context import init

    ctx = init("torchrun", metrics=False)
    torch.manual_seed(0)
    model = model_of(megabytes)
    model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    ctx.backward(model(torch.randn(2, 2048)).pow(2).mean())
    ctx.step()
    local = os.environ.pop(contract.ENV_LOCAL_CHECKPOINT_DIR)  # the Checkpointer reads it when it starts
    plain = Checkpointer(ctx, root / "shared-only", keep=1)
    os.environ[contract.ENV_LOCAL_CHECKPOINT_DIR] = local
    tiered = Checkpointer(ctx, root / "tiered", keep=1)
    samples = interleaved(ctx, {"shared storage": plain, "node-local tier": tiered}, repeats)
    restores = {}
    for name, folder, tier in (("node-local copies", "tiered", True), ("shared storage", "shared-only", False)):
        if not tier:
            os.environ.pop(contract.ENV_LOCAL_CHECKPOINT_DIR)
        again = Checkpointer(ctx, root / folder, keep=1)
        ctx.barrier()
        start = time.perf_counter()
        step = again.restore()
        restores[name] = (max(ctx.runtime.gather_object(time.perf_counter() - start)), step)
        again.close()
    if ctx.is_main:
        state = sum(p.numel() * p.element_size() for p in model.parameters()) * 2 / 2**20
        print(f"\n{ctx.world_size} gloo ranks as {ctx.num_nodes} nodes, {state:.0f} MiB of state:")
        print(f"{'save to':>22} {'blocks training':>16} {'on shared after':>16}")
        for name, pairs in samples.items():
            blocked, done = statistics.median(b for b, _ in pairs), statistics.median(d for _, d in pairs)
            print(f"{name:>22} {blocked:>15.3f}s {done:>15.3f}s")
        print(f"{'restore from':>22} {'seconds':>16}")
        for name, (seconds, step) in restores.items():
            print(f"{name:>22} {seconds:>15.3f}s   (step {step})")
        print(
            "here the nodes' folders and the shared one are the same disk (and page cache): the two restores "
            "differ by the tier's own work, not by the storage a cluster's nodes would read"
        )
    ctx.shutdown()


def local_tier(megabytes: int, repeats: int, root: Path) -> None:
    """Two torchrun agents as two nodes of 2 ranks, each with its own node-local folder."""
    worker = [__file__, "--local-worker", "--sharded-mb", str(megabytes), "--repeats", str(repeats), "--folder", str(root)]
    started = []
    for node, name in enumerate(("a", "b")):
        (root / "local" / name).mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "NODE_NAME": name,
            "HPC_TRAIN_LOCAL_CHECKPOINT_DIR": f"{root}/local/$NODE_NAME",
        }
        launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
        launch += ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", "29534"]
        started.append(subprocess.Popen([*launch, *worker], env=env))
    if any(p.wait() != 0 for p in started):
        raise SystemExit("the node-local tier benchmark failed")


def print_sharded(samples: dict[str, list[tuple[float, float]]], state_mib: float, ranks: int, disk: float) -> None:
    print(f"\n{ranks} gloo ranks on {os.cpu_count()} cores, {state_mib:.0f} MiB of state (parameters + momentum):")
    print(f"{'save':>22} {'blocks training':>16} {'committed after':>16} {'(lowest-highest)':>17}")
    times = {}
    for name, pairs in samples.items():
        blocked, done = statistics.median(b for b, _ in pairs), statistics.median(d for _, d in pairs)
        times[name] = blocked, done
        spread = f"{min(d for _, d in pairs):.2f}-{max(d for _, d in pairs):.2f}s"
        print(f"{name:>22} {blocked:>15.3f}s {done:>15.3f}s {spread:>17}")
    blocking = times["async, sharded"][0] / times["sync, rank 0 alone"][0]
    total = times["sync, sharded"][1] / times["sync, rank 0 alone"][1]
    limit = SHARDED_TARGET / ranks
    print(
        f"blocking, async sharded / sync rank 0: {blocking:.3f}x  {'met' if blocking <= TARGET else 'NOT met'}"
        f" (target <= {TARGET})"
    )
    print(
        f"total save, sharded over {ranks} / rank 0 alone: {total:.3f}x  {'met' if total <= limit else 'NOT met'}"
        f" (target <= {limit:.3f} = {SHARDED_TARGET}/{ranks})"
    )
    # what no split can beat here: the ranks share one disk, and serializing and hashing run on the cores
    floor = disk / times["sync, rank 0 alone"][1]
    cores = min(1.0, (os.cpu_count() or 1) / ranks)
    print(
        f"limits on this machine: one disk ({state_mib:.0f} MiB written + fsynced by one process in {disk:.3f}s ="
        f" {floor:.3f}x of rank 0 alone's save, whatever the split); {os.cpu_count()} cores for {ranks} ranks"
        f" (the CPU part runs at most {1 / cores:.0f}x parallel, not {ranks}x)"
    )


def sharded(ranks: int, megabytes: int, repeats: int, root: Path, worker_kind: str = "--worker") -> None:
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", "29533"]
    worker = [__file__, worker_kind, "--sharded-mb", str(megabytes), "--repeats", str(repeats), "--folder", str(root)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([*launch, *worker], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="200,1000", help="model sizes in MB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", help="where to write (default: a temporary folder)")
    parser.add_argument("--ranks", type=int, default=4, help="processes of the sharded benchmark")
    parser.add_argument("--sharded-mb", type=int, default=200, help="parameters of the sharded benchmark's model")
    parser.add_argument("--only", choices=("single", "sharded", "deepspeed", "local"), help="run one part")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deepspeed-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--local-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.local_worker:
        local_worker(args.sharded_mb, args.repeats, Path(args.folder))
        return
    if args.worker:
        sharded_worker(args.sharded_mb, args.repeats, Path(args.folder))
        return
    if args.deepspeed_worker:
        deepspeed_worker(args.sharded_mb, args.repeats, Path(args.folder))
        return
    root = Path(args.folder or tempfile.mkdtemp(prefix="hpc_train-ckpt-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        if args.only in (None, "sharded"):
            sharded(args.ranks, args.sharded_mb, args.repeats, root)
        if args.only in (None, "deepspeed"):
            sharded(args.ranks, args.sharded_mb, args.repeats, root, "--deepspeed-worker")
        if args.only in (None, "local"):
            local_tier(args.sharded_mb, args.repeats, root)
        if args.only in ("sharded", "deepspeed", "local"):
            return
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
