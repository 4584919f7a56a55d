"""A packed mixture's batch cut into rows: its pieces in a keyed order, concatenated, cut every ``max_len``.

A batch's pieces add up to exactly ``rows * max_len`` tokens (the quotas say so), so every row is
full: the concatenation is cut at every multiple of ``max_len``, and a piece that crosses a cut
becomes two (its head ends one row, its tail starts the next), each its own document for attention
and positions. So a row mixes sources, and at most ``rows - 1`` pieces of a batch are cut by rows.
"""

from __future__ import annotations

import numpy as np

from ..permutation import Permutation


def cut_rows(
    ids: np.ndarray, starts: np.ndarray, stops: np.ndarray, *, max_len: int, key: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``max_len`` from pieces (``key``: their keyed order; ``None``: as given).

    Returns ``(ids, rows, starts, stops)``, one entry per piece of a row, rows in order.

    Example:
        >>> out = cut_rows(np.array([7, 8]), np.array([0, 2]), np.array([5, 5]), max_len=4, key=None)
        >>> [a.tolist() for a in out]
        [[7, 7, 8], [0, 1, 1], [0, 4, 2], [4, 5, 5]]
    """
    if key is not None and ids.size > 1:
        order = Permutation(ids.size, key)(np.arange(ids.size))
        ids, starts, stops = ids[order], starts[order], stops[order]
    sizes = stops - starts
    ends = np.cumsum(sizes)
    begins = ends - sizes
    first_row = begins // max_len
    last_row = (ends - 1) // max_len
    parts = last_row - first_row + 1  # rows each piece touches
    owner = np.repeat(np.arange(ids.size), parts)
    step = np.arange(owner.size) - np.repeat(np.cumsum(parts) - parts, parts)
    rows = first_row[owner] + step
    low = np.maximum(begins[owner], rows * max_len)
    high = np.minimum(ends[owner], (rows + 1) * max_len)
    piece_starts = starts[owner] + (low - begins[owner])
    return ids[owner], rows, piece_starts, piece_starts + (high - low)
