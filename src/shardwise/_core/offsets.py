"""Ragged layouts as flat arrays: offsets from counts, and the positions that spans cover.

Many things here are runs laid end to end (the batches of a plan, the runs of equal length of a
sorted stream, the sources of a mixture): run ``i`` of ``counts[i]`` items occupies
``[offsets[i], offsets[i + 1])`` of one flat array. Both functions are one numpy pass, O(runs) and
O(items) memory respectively.
"""

from __future__ import annotations

import numpy as np

from .arrays import as_lookup_indices


def offsets_from_counts(counts: np.ndarray | list[int]) -> np.ndarray:
    """``(len(counts) + 1,)`` int64: ``0`` then the running total, so run ``i`` is ``[offsets[i], offsets[i + 1])``.

    Example:
        >>> offsets_from_counts(np.array([2, 3, 1])).tolist()
        [0, 2, 5, 6]
    """
    counts = np.asarray(counts)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def span_positions(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``(sizes.sum(),)`` int64: the positions ``[starts[i], starts[i] + sizes[i])`` of every span, concatenated.

    Example:
        >>> span_positions(np.array([5, 0]), np.array([2, 3])).tolist()
        [5, 6, 0, 1, 2]
    """
    # each span's start repeated, minus where the span begins in the output, plus the output position
    firsts = offsets_from_counts(sizes)[:-1]
    return np.repeat(starts - firsts, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)


def runs_of(sizes: np.ndarray, indices: object, *, noun: str) -> np.ndarray:
    """The run (a mixture's source) of each index of the concatenation (int64), ``indices`` checked.

    Raises:
        TypeError: ``indices`` are not integers.
        IndexError: an index is negative or ``>= sum(sizes)``.

    Example:
        >>> runs_of(np.array([2, 3]), [0, 1, 2, 4], noun="samples").tolist()
        [0, 0, 1, 1]
    """
    total = int(sizes.sum())
    checked = as_lookup_indices("indices", indices, size=total, of=f"{len(sizes)} sources of {total} {noun}")
    found: np.ndarray = np.searchsorted(offsets_from_counts(sizes)[1:], checked, side="right").astype(np.int64)
    return found
