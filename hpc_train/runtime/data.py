"""Sharded data loading: each rank reads its own slice; a new epoch reshuffles the same way everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class DistributedLoader:
    """A DataLoader over a DistributedSampler that sets the sampler's epoch on every pass."""

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

    def __iter__(self) -> Iterator[Any]:
        yield from self.iter_from(0)

    def iter_from(self, batch: int) -> Iterator[Any]:
        """This epoch from its ``batch``-th batch on (resuming mid-epoch without reading what came before)."""
        import torch
        from torch.utils.data import DataLoader

        self.sampler.set_epoch(self.epoch)
        indices = list(self.sampler)[batch * (self.loader.batch_size or 1) :]
        # Starting an iterator draws a seed from the generator it is given, else from the global RNG;
        # a per-epoch generator keeps the training RNG stream identical whether or not we resumed.
        generator = torch.Generator().manual_seed(self._seed * 1_000_003 + self.epoch)
        yield from DataLoader(
            self.loader.dataset,
            batch_size=self.loader.batch_size,
            sampler=indices,
            drop_last=self.loader.drop_last,
            generator=generator,
            **self._loader_kwargs,
        )
        self.epoch += 1

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
