"""Plain, single-process samplers as users write them: what shard()/shard_batches() must wrap."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np
from torch.utils.data import Sampler

T = TypeVar("T")


def iterate_once(indices: np.ndarray) -> np.ndarray:
    return np.random.permutation(indices)


def iterate_eternally(indices: np.ndarray) -> Iterator[int]:
    def infinite_shuffles() -> Iterator[int]:
        while True:
            yield from np.random.permutation(indices)

    return itertools.chain.from_iterable(infinite_shuffles() for _ in itertools.repeat(None))


def grouper(iterable: Iterable[T], n: int) -> Iterator[tuple[T, ...]]:
    args = [iter(iterable)] * n
    return zip(*args, strict=False)  # drop the incomplete last group, as the original does


class TwoStreamBatchSampler(Sampler[list[int]]):
    """The classic semi-supervised sampler (mean-teacher style), single process, global np.random."""

    def __init__(self, primary_indices, secondary_indices, batch_size, secondary_batch_size):
        self.primary_indices = primary_indices
        self.secondary_indices = secondary_indices
        self.secondary_batch_size = secondary_batch_size
        self.primary_batch_size = batch_size - secondary_batch_size

    def __iter__(self):
        primary_iter = iterate_once(self.primary_indices)
        secondary_iter = iterate_eternally(self.secondary_indices)
        return (
            [int(i) for i in primary_batch + secondary_batch]
            for (primary_batch, secondary_batch) in zip(  # noqa: B905 (the secondary stream is endless)
                grouper(primary_iter, self.primary_batch_size), grouper(secondary_iter, self.secondary_batch_size)
            )
        )

    def __len__(self):
        return len(self.primary_indices) // self.primary_batch_size
