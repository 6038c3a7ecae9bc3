"""Replicated state written by every rank, each its share, in the foreground or in a thread.

DDP, Horovod and MPI replicas hold the same model and optimizer state, so no rank needs to write all
of it: the tensors are split into shares of about equal bytes (the same split on every rank, from the
same shapes) and rank ``r`` writes ``shard-r.pt``. A tensor larger than one rank's share (an embedding
table) is cut into pieces of its flat elements, so no rank writes much more than the others. Rank 0
also writes ``hpc_train.pt`` with the rest (step, RNG, tracked objects) and the state's structure, each
tensor replaced by a placeholder naming its index, and the shape of each cut tensor. Restore reads
every shard back into that structure, so any world size can load it.

A :class:`Share` is what one rank writes of one checkpoint. Its files are fsynced and digested as they
are written (no read-back); the Checkpointer (checkpoint/manager.py) commits only after every rank's share is
durable, so this module never decides that a checkpoint is complete.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLACEHOLDER = "__hpc_train_shard__"
SHARDS = "shards"  # the key in hpc_train.pt that lists the shard files
PIECES = "pieces"  # ... and the one that gives each cut tensor's shape and number of pieces


def shard_name(rank: int) -> str:
    return f"shard-{rank:05d}.pt"


def _is_tensor(obj: Any) -> bool:
    return hasattr(obj, "element_size") and hasattr(obj, "numel") and hasattr(obj, "untyped_storage")


def tensors(obj: Any) -> list[Any]:
    """The tensors in ``obj`` (dicts, lists, tuples), in traversal order: the order placeholders number them."""
    if _is_tensor(obj):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def nbytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())


def assign(sizes: list[int], ranks: int) -> list[int]:
    """Which rank writes each tensor: the largest first, each to the rank with the fewest bytes so far."""
    owners = [0] * len(sizes)
    load = [0] * ranks
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        lightest = load.index(min(load))
        owners[index] = lightest
        load[lightest] += sizes[index]
    return owners


def fingerprint(found: list[Any]) -> str:
    """The shapes and dtypes in order: equal on every rank, or the split would not be the same split."""
    text = ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in found)
    return hashlib.sha256(text.encode()).hexdigest()


def skeleton(obj: Any, counter: list[int] | None = None) -> Any:
    """``obj`` with every tensor replaced by ``{PLACEHOLDER: index}`` (plain data: loads with weights_only)."""
    counter = [0] if counter is None else counter
    if _is_tensor(obj):
        counter[0] += 1
        return {PLACEHOLDER: counter[0] - 1}
    if isinstance(obj, dict):
        return {k: skeleton(v, counter) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(skeleton(v, counter) for v in obj)
    return obj


def fill(obj: Any, found: dict[int, Any]) -> Any:
    """The inverse of :func:`skeleton`: placeholders replaced by the tensors read from the shards."""
    if isinstance(obj, dict):
        if len(obj) == 1 and PLACEHOLDER in obj:
            return found[obj[PLACEHOLDER]]
        return {k: fill(v, found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(fill(v, found) for v in obj)
    return obj


@dataclass(frozen=True)
class Split:
    """One rank's part of a state's split: what it writes, which ranks write anything, and how to read it back."""

    mine: dict[Any, Any]  # shard key -> tensor: a tensor's index, or "index.piece" for a piece of a cut one
    writers: list[int]  # the ranks that write a shard, in order
    fingerprint: str
    pieces: dict[int, tuple[list[int], int]]  # a cut tensor's index -> its shape and number of pieces


def split(state: Any, rank: int, ranks: int, own: bool = True) -> Split:
    """This rank's tensors (and pieces) of ``state``. ``own``: copies where a tensor is a view of more
    than itself (torch.save writes a view's whole storage); False for a caller that copies them anyway."""
    found = tensors(state)
    sizes = [nbytes(t) for t in found]
    share = -(-sum(sizes) // ranks)  # a rank's bytes, rounded up
    whole = [i for i, size in enumerate(sizes) if size <= share or ranks == 1 or found[i].numel() < 2]
    load = [0] * ranks
    owners = dict(zip(whole, assign([sizes[i] for i in whole], ranks)))
    for index, owner in owners.items():
        load[owner] += sizes[index]
    mine: dict[Any, Any] = {i: found[i] for i, owner in owners.items() if owner == rank}
    cuts = {i: cut(found[i], load, share) for i in range(len(found)) if i not in owners}
    for index, slices in cuts.items():
        ours = [(p, start, stop) for p, (owner, start, stop) in enumerate(slices) if owner == rank]
        if ours:  # reshape copies a tensor that is not contiguous: only where this rank writes some of it
            flat = found[index].reshape(-1)
            mine.update({f"{index}.{p}": flat[start:stop] for p, start, stop in ours})
    if own:
        mine = {key: _own_storage(t) for key, t in mine.items()}
    writers = sorted({*owners.values(), *(owner for slices in cuts.values() for owner, _, _ in slices)})
    pieces = {i: (list(found[i].shape), len(slices)) for i, slices in cuts.items()}
    return Split(mine, writers, fingerprint(found), pieces)


def cut(tensor: Any, load: list[int], share: int) -> list[tuple[int, int, int]]:
    """A tensor too large for one share, as (rank, first element, end) slices that fill each rank up to
    ``share`` bytes in rank order (``load`` is updated); what rounding leaves goes to the lightest rank."""
    numel, width = int(tensor.numel()), int(tensor.element_size())
    slices, start = [], 0
    for rank in range(len(load)):
        take = min(numel - start, max(0, share - load[rank]) // width)
        if take > 0:
            slices.append((rank, start, start + take))
            load[rank] += take * width
            start += take
    if start < numel:
        rank = load.index(min(load))
        slices.append((rank, start, numel))
        load[rank] += (numel - start) * width
    return slices


def _own_storage(tensor: Any) -> Any:
    # torch.save writes a view's whole storage: a slice of a big buffer would write the buffer
    if tensor.untyped_storage().nbytes() > nbytes(tensor):
        return tensor.detach().clone()
    return tensor


def assemble(payload: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A loaded hpc_train.pt with its runtime state read back from the shards (unchanged without shards)."""
    names = payload.get(SHARDS)
    if not names:
        return payload
    import torch

    found: dict[Any, Any] = {}
    for name in names:
        found.update(torch.load(folder / name, map_location="cpu", weights_only=True))
    for index, (shape, parts) in (payload.get(PIECES) or {}).items():
        found[int(index)] = torch.cat([found.pop(f"{index}.{p}") for p in range(parts)]).view(shape)
    return {**payload, "runtime": fill(payload["runtime"], found)}


def snapshot(obj: Any, staging: dict[tuple[Any, ...], Any]) -> Any:
    """A copy detached from training, into buffers kept from the previous save (pinned for GPU tensors).

    Writing into memory that is already mapped is several times faster than allocating (page faults),
    and this copy is the only part of an async save that blocks training. GPU copies are issued without
    waiting and synchronized once at the end.
    """
    import torch

    copied = _copy(obj, staging, ())
    if torch.cuda.is_available() and any(t.is_cuda for t in tensors(obj)):
        torch.cuda.synchronize()
    return copied


def _copy(obj: Any, staging: dict[tuple[Any, ...], Any], path: tuple[Any, ...]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        buffer = staging.get(path)
        if buffer is None or buffer.shape != obj.shape or buffer.dtype != obj.dtype:
            buffer = staging[path] = torch.empty(obj.shape, dtype=obj.dtype, device="cpu", pin_memory=obj.is_cuda)
        return buffer.copy_(obj.detach(), non_blocking=obj.is_cuda)
    if isinstance(obj, dict):
        return {k: _copy(v, staging, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(v, staging, path + (i,)) for i, v in enumerate(obj))
    return obj


class _HashingWriter:
    """What torch.save writes into: each chunk is digested on its way to the file, so a file's digest
    costs no read-back. torch.save needs only write() and flush()."""

    def __init__(self, file: Any, algorithm: str) -> None:
        self.file = file
        self.hash = hashlib.new(algorithm)

    def write(self, data: Any) -> int:
        self.hash.update(data)  # releases the GIL for large chunks: training goes on meanwhile
        return int(self.file.write(data))

    def flush(self) -> None:
        self.file.flush()


def write_file(path: Path, obj: Any, algorithm: str) -> tuple[int, str]:
    """torch.save ``obj`` to ``path`` and fsync it: its size and digest."""
    import torch

    with open(path, "wb") as f:
        writer = _HashingWriter(f, algorithm)
        torch.save(obj, writer)  # type: ignore[arg-type]  # torch calls only write() and flush()
        f.flush()
        os.fsync(f.fileno())
        return f.tell(), writer.hash.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Share:
    """One rank's files of one checkpoint; after :meth:`join`, their sizes and digests, or the error."""

    step: int
    tmp: Path
    final: Path
    files: dict[str, Any]  # file name in ``tmp`` -> what torch.save writes there
    algorithm: str
    fingerprint: str = ""
    needed: int = 0  # about how many bytes the whole checkpoint takes (for a full disk's message)
    more: Callable[[dict[str, str]], dict[str, int]] | None = None  # rank 0: hash and fsync what others wrote
    before: Callable[[], None] | None = None  # waits for this rank's engine state, written in the background
    sizes: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    error: Exception | None = None
    thread: threading.Thread | None = None

    def write(self) -> None:
        try:
            if self.before is not None:
                self.before()
            for name, obj in self.files.items():
                self.sizes[name], self.digests[name] = write_file(self.tmp / name, obj, self.algorithm)
            if self.more is not None:
                self.sizes.update(self.more(self.digests))
            fsync_dir(self.tmp)  # this rank's new names are durable too
        except Exception as exc:  # a bug as much as a full disk must reach the training loop, not die here
            self.error = exc
        finally:
            self.files = {}  # the snapshot's buffers stay in the staging dict for the next save

    def start(self, background: bool) -> None:
        if background:
            self.thread = threading.Thread(target=self.write, name="hpc_train-checkpoint-writer")
            self.thread.start()
        else:
            self.write()

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
