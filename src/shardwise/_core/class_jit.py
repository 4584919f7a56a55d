"""The compiled steps of the class index (numba, the ``fast`` extra): imported by :mod:`.class_index` only.

This module imports numba at its top; :mod:`.class_index` imports it lazily, once a build has
chosen the compiled path (``SHARDWISE_NUMBA``), so ``import shardwise`` never loads numba. Every
kernel calls only kernels of its own file (numba's on-disk cache keys a function by its file
alone) and releases the GIL. Each makes exactly what the numpy step it replaces makes, value for
value (tests/core/test_class_index.py compares them):

- :func:`value_range`, :func:`add_counts`: a chunk's smallest and largest label, and its labels
  counted into a dense table (``part.min()``, ``part.max()`` and ``np.bincount``);
- :func:`partition_chunk`: pass 1 of :func:`~.class_buckets.group_by_class` on a chunk, its codes
  grouped by bucket;
- :func:`order_bucket`: pass 2, a bucket's codes decoded and ordered by class (stable).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["add_counts", "order_bucket", "partition_chunk", "value_range"]

_jit = numba.njit(cache=True, nogil=True)


@_jit
def value_range(values: np.ndarray) -> tuple[int, int]:  # pragma: no cover - compiled
    """``(values.min(), values.max())`` of a non-empty integer array, in one pass."""
    low = values[0]
    high = values[0]
    for i in range(1, values.size):
        value = values[i]
        if value < low:
            low = value
        elif value > high:
            high = value
    return low, high


@_jit
def add_counts(values: np.ndarray, low: int, counts: np.ndarray) -> None:  # pragma: no cover - compiled
    """``counts[v - low] += 1`` for every ``v`` of ``values`` (all within ``counts``)."""
    for i in range(values.size):
        counts[np.int64(values[i]) - low] += 1


@_jit
def partition_chunk(  # pragma: no cover - compiled
    values: np.ndarray, low: int, table: np.ndarray, mask: int, position: int, here: np.ndarray,
    which: np.ndarray, into: np.ndarray,
) -> None:  # fmt: skip
    """Pass 1 on a chunk, grouped by bucket (in order within a bucket) into ``into``: item ``i``'s code
    ``(t - b) | (position + i)``, where ``t = table[values[i] - low]`` is its class's code and
    ``b = t & mask`` its bucket. ``here`` (zeros) gets each bucket's count; ``which`` is scratch."""
    for i in range(values.size):
        bucket = table[np.int64(values[i]) - low] & mask
        which[i] = bucket
        here[bucket] += 1
    cursor = np.empty(here.size, dtype=np.int64)
    total = 0
    for b in range(here.size):
        cursor[b] = total
        total += here[b]
    for i in range(values.size):
        bucket = which[i]
        at = cursor[bucket]
        into[at] = (table[np.int64(values[i]) - low] - bucket) | (position + i)
        cursor[bucket] = at + 1


@_jit
def order_bucket(  # pragma: no cover - compiled
    codes: np.ndarray, ends: np.ndarray, block_bits: int, skip: int, cursor: np.ndarray, into: np.ndarray
) -> None:
    """Pass 2 on codes ``[skip, skip + codes.size)`` of one bucket's run: each decoded into its sample index
    at ``cursor[class]`` of ``into``, advancing it (a stable counting sort by class).

    A code is ``class << block_bits | position in its block``; the run's first ``ends[0]`` codes
    come from block 0, the next up to ``ends[1]`` from block 1, and so on. With one class
    (``cursor == [0]``) the order is kept and ``into`` may be ``codes`` itself.
    """
    mask = (np.int64(1) << block_bits) - 1
    block = 0
    for j in range(codes.size):
        while ends[block] <= skip + j:
            block += 1
        code = np.int64(codes[j])
        klass = code >> block_bits
        at = cursor[klass]
        into[at] = (code & mask) + (np.int64(block) << block_bits)
        cursor[klass] = at + 1
