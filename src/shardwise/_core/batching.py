"""The batch plan: one epoch's batches as two compact arrays.

A :class:`BatchPlan` is ``order`` (int64 sample indices in plan order) and ``offsets`` (int64
batch boundaries): batch ``j`` is ``order[offsets[j]:offsets[j + 1]]``, so any batch is found
by its position in O(1), and a plan of ten million samples costs two arrays, not ten million
Python lists. Batch samplers build a plan per epoch from the pure functions of
:mod:`~shardwise._core.cutting` (batch boundaries), :mod:`~shardwise._core.ordering` (sample and
batch orders) and :mod:`~shardwise._core.bucketing` (the length-bucketing recipe), and deal it
out by position (docs/design.md, "The global plan, dealt by position").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .offsets import offsets_from_counts, span_positions

__all__ = ["BatchPlan"]


@dataclass(frozen=True, eq=False)
class BatchPlan:
    """One epoch's batches: batch ``j`` is ``order[offsets[j]:offsets[j + 1]]``.

    Attributes:
        order: ``(num_samples,)`` int64 sample indices in plan order.
        offsets: ``(len(plan) + 1,)`` int64, ``offsets[0] == 0``, strictly increasing,
            ``offsets[-1] == len(order)`` (no batch is empty).

    Example:
        >>> plan = BatchPlan(np.arange(5, dtype=np.int64), np.array([0, 2, 5], dtype=np.int64))
        >>> len(plan), plan.batches(np.array([1, 0]))
        (2, [[2, 3, 4], [0, 1]])
    """

    order: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        order, offsets = self.order, self.offsets
        if order.dtype != np.int64 or order.ndim != 1:
            raise ValueError(f"order should be a 1-D int64 array, but got dtype {order.dtype}, shape {order.shape}")
        if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.size == 0:
            raise ValueError(f"offsets should be a non-empty 1-D int64 array, but got shape {offsets.shape}")
        if offsets[0] != 0 or offsets[-1] != order.size:
            raise ValueError(
                f"offsets should run from 0 to len(order)={order.size}, but got {offsets[0]}..{offsets[-1]}"
            )
        if offsets.size > 1 and np.any(offsets[1:] <= offsets[:-1]):
            raise ValueError("offsets should be strictly increasing: a batch plan holds no empty batch")

    @classmethod
    def empty(cls) -> BatchPlan:
        """A plan with no batches."""
        return cls(np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64))

    @classmethod
    def concat(cls, plans: Sequence[BatchPlan]) -> BatchPlan:
        """The batches of ``plans`` one after another (e.g. pieces of constant batch size)."""
        if not plans:
            return cls.empty()
        order = np.concatenate([plan.order for plan in plans])
        shifts = offsets_from_counts([plan.num_samples for plan in plans])[:-1]
        offsets = np.concatenate(
            [np.zeros(1, dtype=np.int64)] + [p.offsets[1:] + s for p, s in zip(plans, shifts, strict=True)]
        )
        return cls(order, offsets.astype(np.int64))

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def num_samples(self) -> int:
        """Samples in the plan (each batch's samples counted once)."""
        return int(self.order.size)

    def sizes(self) -> np.ndarray:
        """``(len(plan),)`` int64 batch sizes."""
        return np.diff(self.offsets)

    def batch(self, j: int) -> np.ndarray:
        """Batch ``j``'s sample indices (a view)."""
        return self.order[self.offsets[j] : self.offsets[j + 1]]

    def flat_positions(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions in ``order`` of the batches at ``positions``, concatenated, and their sizes."""
        positions = np.asarray(positions, dtype=np.int64)
        starts = self.offsets[positions]
        sizes = self.offsets[positions + 1] - starts
        return span_positions(starts, sizes), sizes

    def batches(self, positions: np.ndarray) -> list[list[int]]:
        """The batches at plan ``positions`` as lists of ints (what a batch sampler yields)."""
        flat, sizes = self.flat_positions(positions)
        values = self.order[flat].tolist()
        out = []
        first = 0
        for size in sizes.tolist():
            out.append(values[first : first + size])
            first += size
        return out

    def take(self, batch_indices: np.ndarray) -> BatchPlan:
        """A plan of the batches ``batch_indices`` (a reordering, or a subset), in that order."""
        flat, sizes = self.flat_positions(batch_indices)
        return BatchPlan(self.order[flat], offsets_from_counts(sizes))

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """``(len(plan),)`` int64 padded cost of each batch: ``len(batch) * max(length in batch)``."""
        if len(self) == 0:
            return np.empty(0, dtype=np.int64)
        longest = np.maximum.reduceat(lengths[self.order].astype(np.int64), self.offsets[:-1])
        costs: np.ndarray = longest * self.sizes()
        return costs
