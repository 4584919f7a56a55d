"""Packing one stratum's items into rows, and its rows into batches: the two steps of every stratum's layout.

:func:`pack_histogram` is best-fit decreasing into rows of ``max_len`` tokens computed on a
length histogram (a few numpy operations per length class, not per item); :func:`deal_rows`
deals rows into batches of about equal cost. :mod:`.layout` chains them over the
strata of an epoch's plan.
"""

from __future__ import annotations

import numpy as np


class _Rooms:
    """Rows grouped by the room they have left: ``take`` rows with a given room, ``put`` them back."""

    def __init__(self, max_len: int) -> None:
        self.stacks: list[list[np.ndarray]] = [[] for _ in range(max_len + 1)]  # room -> blocks of row ids
        self.count = np.zeros(max_len + 1, dtype=np.int64)  # room -> rows with that room

    def smallest_fitting(self, length: int) -> int:
        """The least room that holds ``length`` tokens, or -1."""
        found = np.flatnonzero(self.count[length:])
        return length + int(found[0]) if found.size else -1

    def take(self, room: int, count: int) -> np.ndarray:
        pieces, got = [], 0
        stack = self.stacks[room]
        while got < count:
            block = stack.pop()
            if block.size > count - got:
                stack.append(block[count - got :])
                block = block[: count - got]
            pieces.append(block)
            got += block.size
        self.count[room] -= count
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def put(self, room: int, rows: np.ndarray) -> None:
        if rows.size:
            self.stacks[room].append(rows)
            self.count[room] += rows.size


def pack_histogram(histogram: np.ndarray, max_len: int) -> tuple[np.ndarray, int]:
    """Best-fit decreasing into rows of ``max_len`` tokens, on a histogram of item lengths.

    Items are placed longest first, each into the fullest row it still fits (a new row if none):
    exactly what best-fit decreasing does item by item, computed per (length, row-room) pair:
    a row that is the best fit for an item of length ``l`` stays the best fit for the next ones
    until it has no room, so a whole run of equal items is placed in a few numpy operations.
    Items of length 0 go round the rows.

    Args:
        histogram: ``(max_len + 1,)`` items of each length.
        max_len: row capacity.

    Returns:
        ``item_rows`` ``(histogram.sum(),)`` int64, the row of each item, items ordered by length
        ascending (class by class, as :func:`stratum_slots` lists them), and the number of rows.
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    rooms = _Rooms(max_len)
    num_rows = 0
    placed: list[list[np.ndarray]] = [[] for _ in range(max_len + 1)]  # length -> row of each item, in order
    for length in range(max_len, 0, -1):
        need = int(histogram[length])
        while need:
            room = rooms.smallest_fitting(length)
            if room < 0:  # no row has room: open rows, each filled with as many as fit
                per_row = max_len // length
                opened = -(-need // per_row)
                rows = np.arange(num_rows, num_rows + opened, dtype=np.int64)
                num_rows += opened
                placed[length].append(np.repeat(rows, per_row)[:need])
                rooms.put(max_len - per_row * length, rows[:-1])
                rooms.put(max_len - (need - (opened - 1) * per_row) * length, rows[-1:])
                break
            per_row = room // length
            full = min(int(rooms.count[room]), need // per_row)
            if full:  # rows of this room that the run fills to the brim, one after another
                rows = rooms.take(room, full)
                placed[length].append(np.repeat(rows, per_row))
                rooms.put(room - per_row * length, rows)
                need -= full * per_row
            if need and rooms.count[room]:  # the rest of the run: fewer than fill one row
                row = rooms.take(room, 1)
                placed[length].append(np.repeat(row, need))
                rooms.put(room - need * length, row)
                need = 0
    zeros = int(histogram[0])
    if zeros:
        num_rows = max(num_rows, 1)
        placed[0].append(np.arange(zeros, dtype=np.int64) % num_rows)
    item_rows = [np.concatenate(p) for p in placed if p]
    flat = np.concatenate(item_rows) if item_rows else np.empty(0, dtype=np.int64)
    return flat.astype(np.int64, copy=False), num_rows


def row_loads(item_rows: np.ndarray, item_lengths: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(num_rows,)`` int64 tokens and ``(num_rows,)`` int64 sum of squared lengths of each row."""
    lengths = item_lengths.astype(np.int64)
    tokens = np.bincount(item_rows, weights=lengths, minlength=num_rows).astype(np.int64)
    squares = np.bincount(item_rows, weights=(lengths * lengths).astype(np.float64), minlength=num_rows)
    return tokens, np.rint(squares).astype(np.int64)


def _deal(costs_sorted: np.ndarray, num_batches: int) -> np.ndarray:
    """Batch of each row of a cost-descending list: round by round, the costliest go to the lightest batches.

    Round ``k`` deals rows ``k * B .. (k + 1) * B - 1`` one per batch, matching the costliest row
    of the round with the batch that is lightest so far (a longest-processing-time rule that
    keeps every batch's row count within one of the others). ``R`` numpy sorts, no loop per row.
    """
    rows = costs_sorted.size
    batch = np.empty(rows, dtype=np.int64)
    loads = np.zeros(num_batches, dtype=np.float64)
    for first in range(0, rows, num_batches):
        chunk = slice(first, min(first + num_batches, rows))
        size = chunk.stop - first
        lightest = np.argsort(loads, kind="stable")[:size]
        batch[chunk] = lightest
        loads[lightest] += costs_sorted[chunk]
    return batch


def deal_rows(
    tokens: np.ndarray,
    costs: np.ndarray,
    *,
    rows_per_batch: int | None,
    tokens_per_batch: int | None,
    drop_short: bool = False,
) -> tuple[np.ndarray, int]:
    """Deal the rows of one stratum into batches whose costs are about equal.

    Rows are sorted by cost (descending, stable) and dealt round by round, the costliest rows
    of a round to the lightest batches so far, so the costliest rows are spread one per batch
    and every batch ends with about the same cost. With
    ``rows_per_batch`` there are ``ceil(rows / rows_per_batch)`` batches (fewer than
    ``rows_per_batch`` of them hold one row less); with ``tokens_per_batch`` the fewest batches
    that this deal keeps under the budget (one more at a time from ``ceil(tokens / budget)``).
    Does not depend on any key: the count of batches is a function of the rows alone.

    Args:
        tokens: ``(r,)`` tokens per row.
        costs: ``(r,)`` the cost to balance per row (tokens, or squared lengths).
        drop_short: with ``rows_per_batch``, leave out the ``r % rows_per_batch`` rows with the
            fewest tokens (marked -1) so that every batch is full.

    Returns:
        ``batch_of_row`` ``(r,)`` int64 (-1: dropped) and the number of batches.
    """
    rows = tokens.size
    if rows == 0:
        return np.empty(0, dtype=np.int64), 0
    batch_of_row = np.full(rows, -1, dtype=np.int64)
    keep = np.arange(rows, dtype=np.int64)
    if rows_per_batch is not None:
        if drop_short:
            extra = rows % rows_per_batch
            if extra:
                fewest = np.argsort(tokens, kind="stable")[:extra]
                keep = np.setdiff1d(keep, fewest)
            if keep.size == 0:
                return batch_of_row, 0
        num_batches = -(-keep.size // rows_per_batch)
        by_cost = keep[np.argsort(-costs[keep], kind="stable")]
        batch_of_row[by_cost] = _deal(costs[by_cost], num_batches)
        return batch_of_row, num_batches
    if tokens_per_batch is None:
        raise ValueError("deal_rows needs rows_per_batch or tokens_per_batch")
    by_cost = np.argsort(-costs, kind="stable")
    num_batches = max(1, -(-int(tokens.sum()) // tokens_per_batch))
    while True:
        dealt = _deal(costs[by_cost], num_batches)
        loads = np.bincount(dealt, weights=tokens[by_cost], minlength=num_batches)
        if loads.max() <= tokens_per_batch or num_batches >= rows:
            break
        num_batches += 1
    batch_of_row[by_cost] = dealt
    return batch_of_row, num_batches
