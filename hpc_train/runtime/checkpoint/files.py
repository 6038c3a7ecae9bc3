"""The files of one checkpoint: digested, fsynced, checked against COMMIT, shared out among the ranks.

What the Checkpointer (checkpoint/manager.py) does with a checkpoint's bytes, apart from deciding when a
checkpoint is complete; the node-local tier reuses the same rules.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any

from hpc_train.resume_shape import SHAPE
from hpc_train.runtime.checkpoint.commit import DIGEST, fsync_tree_dirs

STATE_FILE = "hpc_train.pt"  # the payload: step, RNG, tracked objects, the runtime's replicated state
ENGINE_DIR = "engine"  # what a backend writes itself (DeepSpeed's engine, sharded layouts)
_CHUNK = 8 << 20


def digest_of(file: Any, algorithm: str = DIGEST) -> str:
    h = hashlib.new(algorithm)
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    while n := file.readinto(buffer):
        h.update(view[:n])
    return h.hexdigest()


def fsync_tree(path: Path, digests: dict[str, str]) -> dict[str, int]:
    """fsync everything under ``path``; each file's size, and its digest added to ``digests``.

    Files we did not write ourselves (DeepSpeed's engine/, torch.distributed.checkpoint shards) are
    hashed here, reading back what was just written: usually from the page cache, but files other
    nodes wrote come over the network on a shared filesystem, and a fault between the writer's
    memory and the page cache is not caught. The reading costs about size / (1 GB/s).
    """
    sizes = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        name = str(file.relative_to(path))
        with open(file, "rb") as f:
            if name not in digests:
                digests[name] = digest_of(f)
            os.fsync(f.fileno())
        sizes[name] = file.stat().st_size
    fsync_tree_dirs(path)
    return sizes


def engine_files(tmp: Path, digests: dict[str, str]) -> dict[str, int]:
    """The folder writer's pass over what the backend wrote into ``engine/`` (every rank's part is written: before
    the shares start, or, in the background, before rank 0's own engine write returns, as DCP's does):
    fsynced, sizes returned and digests added, named as in the COMMIT marker."""
    engine = tmp / ENGINE_DIR
    if not engine.is_dir():
        return {}
    found: dict[str, str] = {}
    sizes = fsync_tree(engine, found)
    digests.update({f"{ENGINE_DIR}/{name}": digest for name, digest in found.items()})
    return {f"{ENGINE_DIR}/{name}": size for name, size in sizes.items()}


def small_files(tmp: Path, digests: dict[str, str]) -> dict[str, int]:
    """Rank 0's plain files written before the shares (shape.json: what --resume-from reads): fsynced and
    listed in COMMIT with their digests, so a damaged one is found like any other file."""
    path = tmp / SHAPE
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        digests[SHAPE] = digest_of(f)
        os.fsync(f.fileno())
    return {SHAPE: path.stat().st_size}


def folder_files(tmp: Path, digests: dict[str, str], main: bool) -> dict[str, int]:
    """What the folder's writer hashes besides its own share: the engine's files written beside it,
    and on rank 0 shape.json."""
    return {**engine_files(tmp, digests), **(small_files(tmp, digests) if main else {})}


def check_file(path: Path, name: str, size: int, digest: str | None, algorithm: str) -> str | None:
    """What is wrong with one file of a committed checkpoint, or None."""
    file = path / name
    try:
        actual = file.stat().st_size
    except FileNotFoundError:
        return f"{name} is missing"
    if actual != size:
        return f"{name} has {actual} bytes, the commit recorded {size}"
    if digest is not None:
        if algorithm not in hashlib.algorithms_available:
            return f"{name} cannot be checked: its digest is {algorithm}, which this Python's hashlib lacks"
        with open(file, "rb") as f:
            found = digest_of(f, algorithm)
        if found != digest:
            return f"{name} digest mismatch ({algorithm} {found[:12]}..., the commit recorded {digest[:12]}...)"
    return None


def shares(sizes: dict[str, int], ranks: int) -> list[list[str]]:
    """The files split into ``ranks`` shares of about equal bytes: each is read once, by one rank."""
    split: list[list[str]] = [[] for _ in range(ranks)]
    load = [0] * ranks
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        lightest = load.index(min(load))
        split[lightest].append(name)
        load[lightest] += sizes[name]
    return split


def manifest(reports: list[Any]) -> tuple[dict[str, int], dict[str, str]]:
    """Every rank's sizes and digests as one checkpoint's (raises for ranks whose states disagree)."""
    if len({structure for _, _, structure in reports}) > 1:
        raise RuntimeError("the ranks' states differ in shapes or dtypes: they are not replicas of one state")
    sizes: dict[str, int] = {}
    digests: dict[str, str] = {}
    for rank_sizes, rank_digests, _ in reports:
        twice = [name for name in rank_digests if digests.get(name, rank_digests[name]) != rank_digests[name]]
        if twice:
            raise RuntimeError(f"{twice[0]} was written twice, with different contents (by ranks on two nodes)")
        sizes.update(rank_sizes)
        digests.update(rank_digests)
    return sizes, digests


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors (and raw bytes) in a payload: about what its file will need."""
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it came from) is a full disk or an exhausted quota."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
