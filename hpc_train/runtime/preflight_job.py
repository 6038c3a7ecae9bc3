"""The job side of ``preflight``: all-reduce bus bandwidth across the allocation, then node pair by pair.

Run by the torchrun backend on every node (one process per GPU, or one per CPU node). Bus bandwidth
follows nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n, so figures compare with
published ones whatever the number of ranks. Each timing is the slowest rank's. Rank 0 writes
``preflight.json`` into the job folder; the login side (hpc_train.fabric.preflight) judges it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpc_train import contract

FABRIC_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "FI_", "UCX_")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def sizes_up_to(largest: int, start: int = 1 << 20) -> list[int]:
    """1 MiB, 4 MiB, 16 MiB ... up to (and including) the largest."""
    sizes, size = [], start
    while size < largest:
        sizes.append(size)
        size *= 4
    return sizes + [largest]


def timed_allreduce(
    tensor: torch.Tensor, iters: int, warmup: int, group: dist.ProcessGroup | None, device: torch.device
) -> float:
    """Seconds per all-reduce, the slowest rank's (a collective is as fast as its slowest member)."""
    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed.item())


def bandwidth(size: int, seconds: float, ranks: int) -> tuple[float, float]:
    algbw = size / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def tournament(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint node pairs covering every pair once (circle method), so pairs run side by side."""
    ring: list[str | None] = [*nodes, *([None] if len(nodes) % 2 else [])]  # None: this round's bye
    rounds: list[list[tuple[str, str]]] = []
    for _ in range(len(ring) - 1):
        pairs = [(ring[i], ring[-1 - i]) for i in range(len(ring) // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-size", default="64M")
    parser.add_argument("--pair-size", default=None, help="message size of the pair check (default: the largest)")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    use_cuda = torch.cuda.is_available()  # NCCL where there are GPUs, gloo on CPU partitions
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(FABRIC_PREFIXES)}
    everyone: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(everyone, {"rank": rank, "host": socket.gethostname(), "env": env})
    nodes = sorted({r["host"] for r in everyone})
    sizes = sizes_up_to(parse_size(args.max_size))
    rows = _all_ranks(sizes, args, device, rank, world)
    pairs = _node_pairs(nodes, everyone, parse_size(args.pair_size) if args.pair_size else sizes[-1], args, device, rank)
    gathered: list[list] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, pairs)
    if rank == 0:
        unique = {tuple(p["nodes"]): p for per_rank in gathered for p in per_rank}
        result = {
            "backend": backend,
            "world_size": world,
            "nodes": nodes,
            "device": torch.cuda.get_device_name(device) if use_cuda else "cpu",
            "torch": torch.__version__,
            "iters": args.iters,
            "sizes": rows,
            "pairs": [unique[k] for k in sorted(unique)],
            "ranks": everyone,  # each rank's host and fabric environment: proof the profile arrived
        }
        out = Path(args.out or Path(os.environ.get(contract.ENV_JOB_FOLDER, ".")) / "preflight.json")
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
        print(f"preflight: results in {out}", flush=True)
    dist.destroy_process_group()
    return 0


def _all_ranks(sizes: list[int], args: argparse.Namespace, device: Any, rank: int, world: int) -> list[dict]:
    """An all-reduce over every rank at each message size."""
    rows = []
    for size in sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        seconds = timed_allreduce(tensor, args.iters, args.warmup, None, device)
        algbw, busbw = bandwidth(size, seconds, world)
        rows.append({"bytes": size, "time_us": seconds * 1e6, "algbw_gbs": algbw, "busbw_gbs": busbw})
        if rank == 0:
            print(
                f"preflight: {size:>12} B  {seconds * 1e6:10.1f} us  algbw {algbw:8.3f} GB/s  busbw {busbw:8.3f} GB/s", flush=True
            )
    return rows


def _node_pairs(
    nodes: list[str], everyone: list[dict], pair_size: int, args: argparse.Namespace, device: Any, rank: int
) -> list[dict]:
    """Every pair of nodes on its own, disjoint pairs side by side; the pairs this rank took part in."""
    pairs = []
    for round_ in tournament(nodes) if len(nodes) > 1 else []:
        mine = None
        for a, b in round_:  # every rank joins every new_group call (c10d requires it), then runs only its pair
            members = [r["rank"] for r in everyone if r["host"] in (a, b)]
            group = dist.new_group(members)
            if rank in members:
                mine = (a, b, group, len(members))
        if mine is not None:
            a, b, group, n = mine
            tensor = torch.ones(pair_size // 4, dtype=torch.float32, device=device)
            seconds = timed_allreduce(tensor, args.iters, args.warmup, group, device)
            pairs.append(
                {
                    "nodes": [a, b],
                    "ranks": n,
                    "bytes": pair_size,
                    "time_us": seconds * 1e6,
                    "busbw_gbs": bandwidth(pair_size, seconds, n)[1],
                }
            )
        dist.barrier()
    return pairs


if __name__ == "__main__":
    raise SystemExit(main())
