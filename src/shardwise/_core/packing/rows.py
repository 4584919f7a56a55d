"""Packing one stratum's items into rows, and its rows into batches: the two steps of every stratum's layout.

:func:`pack_histogram` is best-fit decreasing into rows of ``max_len`` tokens computed on a
length histogram (a few numpy operations per length class, not per item); :func:`deal_rows`
deals rows into batches of about equal cost. :mod:`.layout` chains them over the
strata of an epoch's plan.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from ..offsets import span_positions
from .compiled import placements


class _Rooms:
    """Rows grouped by the room they have left, as runs of consecutive row ids (plain Python: a step is a few µs).

    The rows of one room are a queue: :meth:`take` serves from its front, :meth:`put` puts a
    block of rows in front of it (the block's own order kept). ``open`` lists the rooms that
    hold rows, ascending, for :meth:`smallest_fitting`.
    """

    __slots__ = ("count", "open", "queues")

    def __init__(self, max_len: int) -> None:
        self.queues: list[list[tuple[int, int]]] = [[] for _ in range(max_len + 1)]  # runs (first, size), front last
        self.count = [0] * (max_len + 1)  # room -> rows with that room
        self.open: list[int] = []

    def smallest_fitting(self, length: int) -> int:
        """The least room that holds ``length`` tokens, or -1."""
        at = bisect_left(self.open, length)
        return self.open[at] if at < len(self.open) else -1

    def take(self, room: int, count: int) -> list[tuple[int, int]]:
        """The first ``count`` rows of ``room``, as runs ``(first, size)`` in queue order."""
        queue, got = self.queues[room], []
        self.count[room] -= count
        if not self.count[room]:
            del self.open[bisect_left(self.open, room)]
        while count:
            first, size = queue[-1]
            if size > count:
                queue[-1] = (first + count, size - count)
                got.append((first, count))
                break
            queue.pop()
            got.append((first, size))
            count -= size
        return got

    def put(self, room: int, runs: list[tuple[int, int]], rows: int) -> None:
        """Put ``rows`` rows (the ``runs``, in order) in front of ``room``'s queue."""
        if not self.count[room]:
            insort(self.open, room)
        self.count[room] += rows
        self.queues[room].extend(reversed(runs))


_Ints = list[int] | np.ndarray  # the placements, as lists (plain Python) or arrays (compiled)


def _item_rows(firsts: _Ints, sizes: _Ints, repeats: _Ints, starts: _Ints) -> np.ndarray:
    """The row of every item, lengths ascending, from the placements ``pack_histogram`` made longest first.

    Placement ``i`` put ``repeats[i]`` items in each of rows ``firsts[i] .. firsts[i] + sizes[i] - 1``;
    length ``l``'s placements are ``starts[l] .. starts[l - 1] - 1``, kept in the order they were made.
    """
    bounds = np.asarray(starts, dtype=np.int64)
    longest = bounds.size - 2
    order = span_positions(bounds[1 : longest + 1], bounds[:longest] - bounds[1 : longest + 1])
    size = np.asarray(sizes, dtype=np.int64)[order]
    rows = span_positions(np.asarray(firsts, dtype=np.int64)[order], size)
    item_rows: np.ndarray = np.repeat(rows, np.repeat(np.asarray(repeats, dtype=np.int64)[order], size))
    return item_rows


def _placements(histogram: np.ndarray, max_len: int) -> tuple[list[int], list[int], list[int], list[int], int]:
    """The placements ``(firsts, sizes, repeats, starts)`` and the number of rows, in plain Python (:class:`_Rooms`)."""
    needs = histogram.tolist()
    rooms = _Rooms(max_len)
    num_rows = 0
    firsts: list[int] = []  # placements: rows firsts[i] .. firsts[i] + sizes[i] - 1 take repeats[i] items each
    sizes: list[int] = []
    repeats: list[int] = []
    starts = [0] * (max_len + 2)  # length -> its first placement (placements run from the longest length down)

    def place(runs: list[tuple[int, int]], items_per_row: int) -> None:
        for first, size in runs:
            firsts.append(first)
            sizes.append(size)
            repeats.append(items_per_row)

    for length in range(max_len, 0, -1):
        starts[length] = len(firsts)
        need = needs[length]
        while need:
            room = rooms.smallest_fitting(length)
            if room < 0:  # no row has room: open rows, each filled with as many as fit
                per_row = max_len // length
                opened = -(-need // per_row)
                rest = need - (opened - 1) * per_row  # items in the last row opened
                if opened > 1:
                    place([(num_rows, opened - 1)], per_row)
                    rooms.put(max_len - per_row * length, [(num_rows, opened - 1)], opened - 1)
                last = [(num_rows + opened - 1, 1)]
                place(last, rest)
                rooms.put(max_len - rest * length, last, 1)
                num_rows += opened
                break
            per_row = room // length
            full = min(rooms.count[room], need // per_row)
            if full:  # rows of this room that the run fills to the brim, one after another
                runs = rooms.take(room, full)
                place(runs, per_row)
                rooms.put(room - per_row * length, runs, full)
                need -= full * per_row
            if need and rooms.count[room]:  # the rest of the run: fewer than fill one row
                row = rooms.take(room, 1)
                place(row, need)
                rooms.put(room - need * length, row, 1)
                need = 0
    starts[0] = len(firsts)
    return firsts, sizes, repeats, starts, num_rows


def pack_histogram(histogram: np.ndarray, max_len: int) -> tuple[np.ndarray, int]:
    """Best-fit decreasing into rows of ``max_len`` tokens, on a histogram of item lengths.

    Items are placed longest first, each into the fullest row it still fits (a new row if none):
    exactly what best-fit decreasing does item by item, computed per (length, row-room) pair:
    a row that is the best fit for an item of length ``l`` stays the best fit for the next ones
    until it has no room, so a whole run of equal items is placed in one step. Items of length 0
    go round the rows. A step works on runs of row ids: compiled by numba where it is installed
    (:mod:`.compiled`, ``SHARDWISE_NUMBA``), else plain Python (:class:`_Rooms`), the same
    placements either way; the rows of every item are expanded from those runs by numpy at the end.

    Rows of equal room are served newest block first (a block: the rows one step filled or
    opened), in row order within a block: the order the plan of version 2 was made with.

    Args:
        histogram: ``(max_len + 1,)`` items of each length.
        max_len: row capacity.

    Returns:
        ``item_rows`` ``(histogram.sum(),)`` int64, the row of each item, items ordered by length
        ascending (class by class, as :func:`stratum_slots` lists them), and the number of rows.
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    compiled = placements(histogram, max_len)
    if compiled is None:
        firsts, sizes, repeats, starts, num_rows = _placements(histogram, max_len)
        flat = _item_rows(firsts, sizes, repeats, starts)
    else:
        flat = _item_rows(*compiled[:4])
        num_rows = compiled[4]
    zeros = int(histogram[0])
    if zeros:
        num_rows = max(num_rows, 1)
        flat = np.concatenate([np.arange(zeros, dtype=np.int64) % num_rows, flat])
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
                kept = np.ones(rows, dtype=bool)
                kept[np.argsort(tokens, kind="stable")[:extra]] = False  # the fewest tokens
                keep = np.flatnonzero(kept)
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
