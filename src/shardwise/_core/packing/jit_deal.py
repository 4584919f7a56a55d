"""The compiled chain of a layouts build (numba, the ``fast`` extra): strata's rows dealt into batches.

:func:`deal_strata` makes what :func:`~.layout.stratum_layouts` makes after the packing (the row
loads, the rows handed on, :func:`~.rows.deal_rows`, the batch keys), value for value: float
sums are made in the order of numpy's ``bincount`` so that every comparison sees the same
numbers, and every sort is stable as numpy's. Like :mod:`.jit` (which re-exports it), this module
imports numba at its top and is loaded only by :mod:`.compiled`; it calls no kernel of another
file (numba's on-disk cache of a function does not notice a change in another file's callee).
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _deal(costs_sorted: np.ndarray, num_batches: int, batch: np.ndarray) -> None:  # pragma: no cover - compiled
    """:func:`~.rows._deal` into ``batch``: round by round, the costliest rows to the lightest batches so far."""
    loads = np.zeros(num_batches, dtype=np.float64)
    rows = costs_sorted.size
    for first in range(0, rows, num_batches):
        size = min(num_batches, rows - first)
        lightest = np.argsort(loads, kind="mergesort")[:size]
        for k in range(size):
            batch[first + k] = lightest[k]
            loads[lightest[k]] += costs_sorted[first + k]


@_jit
def _descending(values: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """``np.argsort(-values, kind="stable")`` of non-negative integers: a counting sort when their range is small."""
    size = values.size
    if size == 0:
        return np.empty(0, dtype=np.int64)
    high = values.max()
    if high > 4 * size + 8192:
        return np.argsort(-values, kind="mergesort")
    starts = np.zeros(high + 2, dtype=np.int64)  # value v's first position: after every larger value
    for i in range(size):
        starts[high - values[i] + 1] += 1
    for v in range(1, high + 2):
        starts[v] += starts[v - 1]
    order = np.empty(size, dtype=np.int64)
    for i in range(size):
        at = high - values[i]
        order[starts[at]] = i
        starts[at] += 1
    return order


@_jit
def _fewest(values: np.ndarray, count: int) -> np.ndarray:  # pragma: no cover - compiled
    """``np.sort(np.argsort(values, kind="stable")[:count])``: the ``count`` least values (ties: first), by position."""
    chosen = np.zeros(values.size, dtype=np.bool_)
    for _ in range(count):
        best = -1
        for i in range(values.size):
            if not chosen[i] and (best < 0 or values[i] < values[best]):
                best = i
        chosen[best] = True
    return np.flatnonzero(chosen)


@_jit
def _deal_rows(  # pragma: no cover - compiled
    tokens: np.ndarray, costs: np.ndarray, rows_per_batch: int, tokens_per_batch: int, drop_short: bool,
    batch_of_row: np.ndarray,
) -> int:  # fmt: skip
    """:func:`~.rows.deal_rows` into ``batch_of_row`` (``rows_per_batch`` 0: by ``tokens_per_batch``); the batches."""
    rows = tokens.size
    batch_of_row[:] = -1
    if rows == 0:
        return 0
    if rows_per_batch > 0:
        keep = np.arange(rows)
        if drop_short:
            extra = rows % rows_per_batch
            if extra:
                kept = np.ones(rows, dtype=np.bool_)
                kept[np.argsort(tokens, kind="mergesort")[:extra]] = False
                keep = np.flatnonzero(kept)
            if keep.size == 0:
                return 0
        num_batches = (keep.size + rows_per_batch - 1) // rows_per_batch
        by_cost = keep[_descending(costs[keep])]
        dealt = np.empty(by_cost.size, dtype=np.int64)
        _deal(costs[by_cost].astype(np.float64), num_batches, dealt)
        batch_of_row[by_cost] = dealt
        return num_batches
    by_cost = _descending(costs)
    sorted_costs = costs[by_cost].astype(np.float64)
    num_batches = max(1, (tokens.sum() + tokens_per_batch - 1) // tokens_per_batch)
    dealt = np.empty(rows, dtype=np.int64)
    while True:
        _deal(sorted_costs, num_batches, dealt)
        loads = np.zeros(num_batches, dtype=np.float64)
        for k in range(rows):
            loads[dealt[k]] += tokens[by_cost[k]]
        if loads.max() <= tokens_per_batch or num_batches >= rows:
            break
        num_batches += 1
    batch_of_row[by_cost] = dealt
    return int(num_batches)


@_jit
def deal_strata(  # noqa: PLR0912, PLR0915  # pragma: no cover - compiled
    counts: np.ndarray, phase: np.ndarray, num_strata: int, max_len: int, first: int, last: int,
    slot_rows: np.ndarray, slot_starts: np.ndarray, num_rows: np.ndarray, rows_per_batch: int,
    tokens_per_batch: int, attention: bool, drop_short: bool, carry: np.ndarray, carried: int,
    batch_of_row: np.ndarray, row_at: int, batch_keys: np.ndarray, sizes: np.ndarray,
) -> tuple[int, int]:  # fmt: skip
    """The chain of :func:`~.layout.stratum_layouts` over strata ``first .. last - 1`` (of ``num_strata``).

    Reads each stratum's packed rows from ``slot_rows`` (from ``slot_starts[s]``, ``num_rows[s]``
    rows, both indexed by stratum); writes its ``batch_of_row`` from ``batch_of_row[row_at]`` on
    and its batch keys into ``batch_keys`` (from 0), and ``(slots, rows, batches, carried)``
    into ``sizes[:, s - first]``. ``carry[:2, :carried]``: tokens and squares of the rows the
    stratum before ``first`` handed on; updated for the next call.

    Returns:
        ``(carried, batch keys written)``.
    """
    histogram = np.empty(counts.size, dtype=np.int64)
    keys_at = 0
    for stratum in range(first, last):
        for c in range(counts.size):  # stratum_histogram (as jit._histogram: no call across files)
            offset = phase[c] // num_strata
            lo = (counts[c] * stratum + phase[c]) // num_strata - offset
            histogram[c] = (counts[c] * (stratum + 1) + phase[c]) // num_strata - offset - lo
        own = num_rows[stratum]
        slots = histogram.sum()
        base = slot_starts[stratum]
        token_sums = np.zeros(own, dtype=np.float64)  # np.bincount's sums, item by item in slot order
        square_sums = np.zeros(own, dtype=np.float64)
        at = base
        for length in range(histogram.size):
            for _ in range(histogram[length]):
                row = slot_rows[at]
                token_sums[row] += length
                square_sums[row] += length * length
                at += 1
        total = own + carried
        tokens = np.empty(total, dtype=np.int64)
        squares = np.empty(total, dtype=np.int64)
        for r in range(own):
            tokens[r] = np.int64(token_sums[r])
            squares[r] = np.int64(np.rint(square_sums[r]))
        for r in range(carried):
            tokens[own + r] = carry[0, r]
            squares[own + r] = carry[1, r]
        costs = squares if attention else tokens
        extra = 0
        if stratum != num_strata - 1 and rows_per_batch > 0:
            extra = min(total % rows_per_batch, own)
        handed = _fewest(tokens[:own], extra)
        not_handed = np.ones(total, dtype=np.bool_)
        not_handed[handed] = False
        dealt = np.flatnonzero(not_handed)
        dealt_batches = np.empty(dealt.size, dtype=np.int64)
        num_batches = _deal_rows(tokens[dealt], costs[dealt], rows_per_batch, tokens_per_batch, drop_short,
                                 dealt_batches)  # fmt: skip
        rows = np.full(total, -2, dtype=np.int64)  # CARRIED
        rows[dealt] = dealt_batches
        batch_costs = np.zeros(num_batches, dtype=np.float64)
        batch_token_sums = np.zeros(num_batches, dtype=np.float64)
        for r in range(total):
            if rows[r] >= 0:
                batch_costs[rows[r]] += costs[r]
                batch_token_sums[rows[r]] += tokens[r]
        capacity = rows_per_batch * max_len if rows_per_batch > 0 else tokens_per_batch
        half = max(1, max_len // 2)
        minus_short = np.empty(num_batches, dtype=np.int64)
        rounded = np.empty(num_batches, dtype=np.float64)
        for b in range(num_batches):
            minus_short[b] = -((capacity - np.int64(batch_token_sums[b])) // half)
            rounded[b] = np.rint(batch_costs[b])
        by_cost = np.argsort(rounded, kind="mergesort")  # np.lexsort((rounded, minus_short)): two stable sorts
        order = by_cost[np.argsort(minus_short[by_cost], kind="mergesort")]
        for k in range(num_batches):
            batch_keys[keys_at + order[k]] = k
        keys_at += num_batches
        for r in range(total):
            batch_of_row[row_at + r] = rows[r]
        row_at += total
        column = stratum - first
        sizes[0, column] = slots
        sizes[1, column] = total
        sizes[2, column] = num_batches
        sizes[3, column] = carried
        for k in range(handed.size):
            carry[0, k] = tokens[handed[k]]
            carry[1, k] = squares[handed[k]]
        carried = handed.size
    return carried, keys_at
