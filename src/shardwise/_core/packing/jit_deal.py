"""The compiled chain of a layouts build (numba, the ``fast`` extra): strata's rows dealt into batches.

:func:`deal_strata` makes what :func:`~.layout.stratum_layouts` makes after the packing (the row
loads, the rows handed on, :func:`~.rows.deal_rows`, the batch keys), value for value: float
sums are made in the order of numpy's ``bincount`` so that every comparison sees the same
numbers, and every sort is stable as numpy's (:func:`_stable_order`, a merge sort written out,
and plain loops instead of numpy's sorts and fancy indexing: ~8 s of first compilation instead
of ~15). Like :mod:`.jit` (which re-exports it), this module imports numba at its top and is
loaded only by :mod:`.compiled`; it calls no kernel of another file (numba's on-disk cache of a
function does not notice a change in another file's callee).
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _stable_order(keys: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """``np.argsort(keys, kind="stable")``: runs of 16 by insertion, then merged bottom up (ties keep their order)."""
    size = keys.size
    order = np.arange(size)
    run = 16
    for lo in range(0, size, run):
        for i in range(lo + 1, min(lo + run, size)):
            item = order[i]
            j = i - 1
            while j >= lo and keys[order[j]] > keys[item]:
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = item
    other = np.empty(size, dtype=np.int64)
    width = run
    while width < size:
        for lo in range(0, size, 2 * width):
            mid, hi = min(lo + width, size), min(lo + 2 * width, size)
            i, j = lo, mid
            for k in range(lo, hi):
                if j < hi and (i >= mid or keys[order[j]] < keys[order[i]]):
                    other[k] = order[j]
                    j += 1
                else:
                    other[k] = order[i]
                    i += 1
        order, other = other, order
        width *= 2
    return order


@_jit
def _deal(costs_sorted: np.ndarray, num_batches: int, batch: np.ndarray) -> None:  # pragma: no cover - compiled
    """:func:`~.rows._deal` into ``batch``: round by round, the costliest rows to the lightest batches so far.

    The batches by ``(load, batch)`` (numpy's stable sort of the loads) are kept from round to
    round and sorted again by insertion: a round changes the order little.
    """
    loads = np.zeros(num_batches, dtype=np.float64)
    lightest = np.arange(num_batches)
    rows = costs_sorted.size
    for first in range(0, rows, num_batches):
        for i in range(1, num_batches):
            item = lightest[i]
            j = i - 1
            while j >= 0 and (loads[lightest[j]] > loads[item] or (loads[lightest[j]] == loads[item]
                                                                    and lightest[j] > item)):  # fmt: skip
                lightest[j + 1] = lightest[j]
                j -= 1
            lightest[j + 1] = item
        for k in range(min(num_batches, rows - first)):
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
        return _stable_order(-values)
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
    out = np.empty(count, dtype=np.int64)
    at = 0
    for i in range(values.size):
        if chosen[i]:
            out[at] = i
            at += 1
    return out


@_jit
def _deal_sorted(tokens: np.ndarray, costs: np.ndarray, rows: np.ndarray, num_batches: int, tokens_per_batch: int,
                 batch_of_row: np.ndarray) -> int:  # fmt: skip  # pragma: no cover - compiled
    """Deal ``rows`` (by cost, descending) into ``num_batches`` batches, or (``tokens_per_batch``) the fewest
    from there on that keep every batch within the budget; the batches."""
    order = np.empty(rows.size, dtype=np.int64)
    kept_costs = np.empty(rows.size, dtype=np.int64)
    for k in range(rows.size):
        kept_costs[k] = costs[rows[k]]
    by_cost = _descending(kept_costs)
    sorted_costs = np.empty(rows.size, dtype=np.float64)
    for k in range(rows.size):
        order[k] = rows[by_cost[k]]
        sorted_costs[k] = costs[order[k]]
    dealt = np.empty(rows.size, dtype=np.int64)
    while True:
        _deal(sorted_costs, num_batches, dealt)
        if tokens_per_batch <= 0:
            break
        loads = np.zeros(num_batches, dtype=np.float64)
        for k in range(rows.size):
            loads[dealt[k]] += tokens[order[k]]
        if loads.max() <= tokens_per_batch or num_batches >= rows.size:
            break
        num_batches += 1
    for k in range(rows.size):
        batch_of_row[order[k]] = dealt[k]
    return num_batches


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
        kept = np.ones(rows, dtype=np.bool_)
        size = rows
        if drop_short and rows % rows_per_batch:
            dropped = _fewest(tokens, rows % rows_per_batch)  # the fewest tokens
            for k in range(dropped.size):
                kept[dropped[k]] = False
            size -= dropped.size
            if size == 0:
                return 0
        keep = np.empty(size, dtype=np.int64)
        at = 0
        for r in range(rows):
            if kept[r]:
                keep[at] = r
                at += 1
        return _deal_sorted(tokens, costs, keep, (size + rows_per_batch - 1) // rows_per_batch, 0, batch_of_row)
    first = max(1, (tokens.sum() + tokens_per_batch - 1) // tokens_per_batch)
    return _deal_sorted(tokens, costs, np.arange(rows), first, tokens_per_batch, batch_of_row)


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
        is_handed = np.zeros(total, dtype=np.bool_)
        for k in range(handed.size):
            is_handed[handed[k]] = True
        dealt = np.empty(total - handed.size, dtype=np.int64)  # the rows not handed on, and their loads
        dealt_tokens = np.empty(dealt.size, dtype=np.int64)
        dealt_costs = np.empty(dealt.size, dtype=np.int64)
        at = 0
        for r in range(total):
            if not is_handed[r]:
                dealt[at] = r
                dealt_tokens[at] = tokens[r]
                dealt_costs[at] = costs[r]
                at += 1
        dealt_batches = np.empty(dealt.size, dtype=np.int64)
        num_batches = _deal_rows(dealt_tokens, dealt_costs, rows_per_batch, tokens_per_batch, drop_short,
                                 dealt_batches)  # fmt: skip
        rows = np.empty(total, dtype=np.int64)
        rows[:] = -2  # CARRIED
        for k in range(dealt.size):
            rows[dealt[k]] = dealt_batches[k]
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
        by_cost = _stable_order(rounded)  # np.lexsort((rounded, minus_short)): two stable sorts
        shorts = np.empty(num_batches, dtype=np.int64)
        for k in range(num_batches):
            shorts[k] = minus_short[by_cost[k]]
        by_short = _stable_order(shorts)
        for k in range(num_batches):
            batch_keys[keys_at + by_cost[by_short[k]]] = k
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
