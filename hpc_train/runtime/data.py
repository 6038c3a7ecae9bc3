"""Sharded data loading: each rank reads its own slice; a new epoch reshuffles the same way everywhere."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hpc_train.runtime.log import topic_log

_log = topic_log("data")


class DistributedLoader:
    """A DataLoader over a DistributedSampler that sets the sampler's epoch on every pass."""

    #: set by ``ctx.loader`` under --micro-batch: iterating yields each batch in micro-batches
    split: Callable[[Iterator[Any]], Iterator[Any]] | None = None

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        **loader_kwargs: Any,
    ) -> None:
        from torch.utils.data import DataLoader, DistributedSampler

        self.sampler: Any = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self._loader_kwargs = loader_kwargs
        self._seed = seed
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self.sampler, drop_last=drop_last, **loader_kwargs)
        self.epoch = 0
        self.rank = rank
        # how the dataset divides among the ranks (every rank's numbers), and the samples this rank read per epoch
        self.balance = Balance.of(len(dataset), world_size, batch_size, drop_last)
        self.samples_per_epoch: dict[int, int] = {}
        warning = self.balance.warning()
        if warning and rank == 0:  # once, from one rank: every rank computes the same numbers
            _log(f"warning: {warning}")

    def __iter__(self) -> Iterator[Any]:
        found = self.iter_from(0)
        yield from self.split(found) if self.split is not None else found

    def iter_from(self, batch: int) -> Iterator[Any]:
        """This epoch from its ``batch``-th batch on (resuming mid-epoch without reading what came before)."""
        import torch
        from torch.utils.data import DataLoader

        self.sampler.set_epoch(self.epoch)
        indices = list(self.sampler)[batch * (self.loader.batch_size or 1) :]
        # Starting an iterator draws a seed from the generator it is given, else from the global RNG;
        # a per-epoch generator keeps the training RNG stream identical whether or not we resumed.
        generator = torch.Generator().manual_seed(self._seed * 1_000_003 + self.epoch)
        counts, epoch = self.samples_per_epoch, self.epoch
        before, size, available = counts.setdefault(epoch, 0), self.loader.batch_size or 1, len(indices)
        for n, item in enumerate(
            DataLoader(
                self.loader.dataset,
                batch_size=self.loader.batch_size,
                sampler=indices,
                drop_last=self.loader.drop_last,
                generator=generator,
                **self._loader_kwargs,
            ),
            1,
        ):
            # samples, counted from the batches read (only an epoch's last batch can be short): cheaper
            # per step than measuring each batch, and a collate_fn that reshapes cannot miscount it
            counts[epoch] = before + min(n * size, available)
            yield item
        self.epoch += 1

    def rebatch(self, batch_size: int) -> None:
        """Read ``batch_size`` samples per batch from now on (a resume that keeps another shape's global batch)."""
        from torch.utils.data import DataLoader

        loader = self.loader
        self.loader = DataLoader(
            loader.dataset, batch_size=batch_size, sampler=self.sampler, drop_last=loader.drop_last, **self._loader_kwargs
        )
        self.balance = Balance.of(len(loader.dataset), self.sampler.num_replicas, batch_size, loader.drop_last)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def batches(loader: DistributedLoader, start: int = 0, total: int | None = None) -> Iterator[Any]:
    """Batches epoch after epoch, beginning at overall batch ``start`` (a restored step); without end,
    or until ``total`` batches have been yielded counting from batch 0 (so ``start >= total`` yields
    none: a job restored at its last step finishes instead of training on)."""
    per_epoch = len(loader)
    if per_epoch == 0:
        raise ValueError("the loader yields no batches (dataset smaller than one batch per rank?)")
    if start < 0 or (total is not None and total < 0):
        raise ValueError(f"batches(start={start}, total={total}): both count batches from 0 and cannot be negative")
    epoch, offset = divmod(start, per_epoch)
    loader.set_epoch(epoch)
    left = None if total is None else total - start
    while left is None or left > 0:
        for batch in loader.iter_from(offset):
            yield batch
            if left is not None:
                left -= 1
                if left == 0:
                    return
        offset = 0


@dataclass(frozen=True)
class Balance:
    """How one epoch of a dataset divides among the ranks (DistributedSampler's rules: the same on every rank).

    The sampler gives every rank the same number of samples, so no rank runs out of batches first and
    leaves the others waiting in a collective; a dataset that does not divide by the world size is
    padded with duplicates (``drop_last=False``) or cut (``drop_last=True``) to get there.
    """

    dataset: int  # samples in the dataset
    world_size: int
    batch_size: int
    drop_last: bool
    per_rank: int  # samples each rank's shard holds per epoch, padded duplicates included
    padded: int  # duplicates added so every shard holds ``per_rank`` (drop_last=False)
    padded_ranks: tuple[int, ...]  # the ranks reading one duplicate each
    dropped: int  # samples no rank trains on in an epoch: the sampler's cut and every rank's incomplete last batch
    batches: int  # per rank per epoch
    last_batch: int  # samples in each rank's last batch of an epoch

    @classmethod
    def of(cls, dataset: int, world_size: int, batch_size: int, drop_last: bool) -> Balance:
        if drop_last and dataset % world_size:
            per_rank, padded = dataset // world_size, 0
        else:
            per_rank = math.ceil(dataset / world_size)
            padded = per_rank * world_size - dataset
        # the sampler repeats the first indices at the end; position i of the list goes to rank i % world_size
        padded_ranks = tuple(sorted({i % world_size for i in range(dataset, dataset + padded)}))
        cut = dataset - per_rank * world_size if padded == 0 else 0
        tail = per_rank % batch_size
        if drop_last:
            batches, last, dropped = per_rank // batch_size, batch_size, cut + tail * world_size
        else:
            batches, last, dropped = math.ceil(per_rank / batch_size), tail or batch_size, cut
        return cls(dataset, world_size, batch_size, drop_last, per_rank, padded, padded_ranks, dropped, batches, last)

    @property
    def even(self) -> bool:
        """Every sample trained on exactly once per epoch."""
        return self.padded == 0 and self.dropped == 0

    @property
    def samples(self) -> list[int]:
        """Samples each rank trains on per epoch, in rank order (equal: the sampler makes them so)."""
        used = self.batches * self.batch_size if self.drop_last else self.per_rank
        return [used] * self.world_size

    def warning(self) -> str | None:
        """The start-of-run warning for an uneven split, with its numbers; None when even."""
        if self.even:
            return None
        parts = []
        if self.padded:
            plural = "s" if len(self.padded_ranks) > 1 else ""
            parts.append(
                f"rank{plural} {_ranges(self.padded_ranks)} each read 1 padded duplicate "
                f"({self.padded} sample{'s' if self.padded > 1 else ''} trained on twice per epoch)"
            )
        if self.dropped:
            parts.append(f"{self.dropped} sample{'s' if self.dropped > 1 else ''} per epoch never read (drop_last)")
        last = f", the last of {self.last_batch}" if self.last_batch != self.batch_size else ""
        return (
            f"{self.dataset} samples do not divide evenly among {self.world_size} ranks in batches of {self.batch_size}: "
            f"{'; '.join(parts)}; every rank trains on {self.samples[0]} samples per epoch in {self.batches} batches{last}. "
            f"A dataset size divisible by {self.world_size * self.batch_size} (ranks x batch size) reads every sample once"
        )


def _ranges(ranks: tuple[int, ...]) -> str:
    """(1, 2, 3, 7) -> "1-3, 7"."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and spans[-1][1] == rank - 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)
