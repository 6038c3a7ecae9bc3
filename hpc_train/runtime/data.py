"""Sharded data loading: each rank reads its own slice; a new epoch reshuffles the same way everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class DistributedLoader:
    """A DataLoader over a DistributedSampler that sets the sampler's epoch on every pass."""

    def __init__(self, dataset: Any, batch_size: int, rank: int, world_size: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, **loader_kwargs: Any) -> None:
        from torch.utils.data import DataLoader, DistributedSampler

        self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                          seed=seed, drop_last=drop_last)
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self.sampler, drop_last=drop_last,
                                 **loader_kwargs)
        self.epoch = 0

    def __iter__(self) -> Iterator[Any]:
        self.sampler.set_epoch(self.epoch)
        yield from self.loader
        self.epoch += 1

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
