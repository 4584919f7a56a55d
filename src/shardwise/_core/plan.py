"""Plan arithmetic: how a global plan of units is dealt out to ranks by position.

Rank ``r`` of ``W`` takes the units at plan positions ``start + r, start + r + W, ...`` where
``start`` is how many units the job has already handed out this epoch (0 at an epoch's start,
anything after a resume). Every rank takes the same number of units:

- ``Even.PAD`` completes the last step by wrapping to the start of the plan (position ``p >= total``
  is position ``p % total``), repeating at most ``W - 1`` units, as ``DistributedSampler`` does;
- ``Even.DROP`` cuts the last partial step, leaving out at most ``W - 1`` units.
"""

from __future__ import annotations

import enum

import numpy as np


class Even(str, enum.Enum):
    """How every rank is given the same number of units when the plan does not divide evenly."""

    PAD = "pad"
    DROP = "drop"


def rank_count(total: int, start: int, world_size: int, even: Even) -> int:
    """Units each rank yields from plan position ``start`` to the end of a plan of ``total`` units."""
    remaining = max(total - start, 0)
    if even is Even.PAD:
        return -(-remaining // world_size)
    return remaining // world_size


def pass_end(total: int, start: int, world_size: int, even: Even) -> int:
    """The ``consumed`` value once a pass from ``start`` completes: ``total`` or past it (padding)."""
    return max(start + rank_count(total, start, world_size, even) * world_size, total)


def rank_positions(start: int, rank: int, world_size: int, first: int, stop: int, total: int) -> np.ndarray:
    """Plan positions of this rank's local steps ``first..stop-1``, wrapped into ``[0, total)``.

    Returns:
        positions: ``(stop - first,)`` int64.
    """
    positions = start + rank + world_size * np.arange(first, stop, dtype=np.int64)
    if total and positions.size and positions[-1] >= total:
        positions %= total
    return positions
