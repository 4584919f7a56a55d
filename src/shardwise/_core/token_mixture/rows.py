"""A packed mixture's batch into rows of ``max_len``: filled longest piece first, or cut in order.

A batch's pieces add up to exactly ``rows * max_len`` tokens (the quotas say so), so every row is
full. Shuffled plans fill the rows longest piece first into the roomiest row (:func:`fill_rows`), so
that row ends cut the shortest pieces; unshuffled ones concatenate the pieces in stream order and cut
every ``max_len`` (:func:`cut_rows`). A piece a row end cuts becomes two (its head ends one row, its
tail starts the next), each its own document for attention and positions; a row mixes sources.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..permutation import Permutation
from ..seeds import derive_seed


def cut_rows(
    ids: np.ndarray, starts: np.ndarray, stops: np.ndarray, *, max_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``max_len`` from pieces in the order given, concatenated and cut every ``max_len``.

    Returns ``(ids, rows, starts, stops)``, one entry per piece of a row, rows in order.

    Example:
        >>> out = cut_rows(np.array([7, 8]), np.array([0, 2]), np.array([5, 5]), max_len=4)
        >>> [a.tolist() for a in out]
        [[7, 7, 8], [0, 1, 1], [0, 4, 2], [4, 5, 5]]
    """
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


def fill_rows(
    ids: np.ndarray, starts: np.ndarray, stops: np.ndarray, *, max_len: int, key: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``max_len`` from pieces adding up to whole rows, cutting as few long pieces as it can.

    Pieces go longest first (ties in a keyed order), each to the row with the most room; one
    longer than every row's room fills the roomiest and its rest goes on. So a row cut falls on
    the shortest pieces it can, and a long piece keeps its attention cost (cutting it would make a
    batch's cost depend on where the cut falls). Each row's pieces are then in a keyed order.
    Returns ``(ids, rows, starts, stops)`` as :func:`cut_rows`.

    Example:
        >>> out = fill_rows(np.array([7, 8, 9]), np.array([0, 0, 0]), np.array([5, 2, 1]), max_len=4, key=3)
        >>> sorted(zip(*(a.tolist() for a in out)))
        [(7, 0, 0, 4), (7, 1, 4, 5), (8, 1, 0, 2), (9, 1, 0, 1)]
    """
    total = int((stops - starts).sum())
    rows = total // max_len
    if rows * max_len != total:
        raise ValueError(f"pieces of {total} tokens do not make whole rows of max_len={max_len}")
    tie = Permutation(ids.size, key)(np.arange(ids.size))
    order = np.lexsort((tie, -(stops - starts)))  # longest first, ties keyed
    heap = [(-max_len, row) for row in range(rows)]  # (minus the room, row): the roomiest first
    out: list[tuple[int, int, int, int]] = []
    for piece in order.tolist():
        identity, start, stop = int(ids[piece]), int(starts[piece]), int(stops[piece])
        while start < stop:
            room, row = heapq.heappop(heap)
            take = min(stop - start, -room)
            out.append((identity, row, start, start + take))
            start += take
            if take < -room:
                heapq.heappush(heap, (room + take, row))
    array = np.asarray(out, dtype=np.int64).reshape(-1, 4)
    within = Permutation(len(array), derive_seed(key, "within"))(np.arange(len(array)))
    array = array[np.lexsort((within, array[:, 1]))]  # rows in order, each row's pieces keyed
    return array[:, 0], array[:, 1], array[:, 2], array[:, 3]
