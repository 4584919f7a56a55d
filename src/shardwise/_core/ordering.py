"""Orders for a batch plan: a keyed shuffle, sorting by length in windows, balancing batches by cost.

:func:`shuffled` (a keyed random order of the samples), :func:`sort_in_windows` (sort by length
within windows of the stream, ties in incoming order) and :func:`balanced_batch_order` (batches
sorted by cost, then shuffled in groups, so that neighbouring batches, hence the ranks of one
global step, have similar cost).
"""

from __future__ import annotations

import numpy as np

from .permutation import Permutation, table_permutation
from .seeds import derive_seed


def shuffled(n: int, key: int | None) -> np.ndarray:
    """``(n,)`` int64: ``[0, n)`` in the keyed random order of ``key`` (``None``: identity).

    Materialised (a plan holds every index anyway): the stable argsort of ``n`` raw PCG64 words
    (``table_permutation``), the same on every platform, and much faster than evaluating a
    Feistel network at every position. Distinct words have one sorted order whatever the sort
    algorithm, so the fast unstable sort is used unless two words collide.
    """
    if key is None:
        return np.arange(n, dtype=np.int64)
    words = np.random.PCG64(key).random_raw(n)
    order = np.argsort(words)
    ranked = words[order]
    if n > 1 and np.any(ranked[1:] == ranked[:-1]):
        return table_permutation(n, key)
    return order.astype(np.int64, copy=False)


def sort_in_windows(order: np.ndarray, lengths: np.ndarray, window: int, *, descending: bool = False) -> np.ndarray:
    """``order`` sorted by length within consecutive windows of ``window`` samples (stable).

    Equal lengths keep their order in ``order``, so a shuffled ``order`` breaks ties at random.
    A window at least as long as the stream sorts it whole. ``descending`` puts the longest
    first in each window (what :func:`token_offsets` cuts).
    """
    n = order.size
    if n == 0:
        return order
    keyed = lengths[order].astype(np.int64)
    longest = int(keyed.max()) + 1
    if descending:
        keyed = longest - 1 - keyed
    if window < n:
        windows = (n - 1) // window + 1
        if windows * longest < 2**62:
            keyed += (np.arange(n, dtype=np.int64) // window) * longest
        else:  # keys would overflow int64: sort by (window, length) pairs instead
            return order[np.lexsort((keyed, np.arange(n, dtype=np.int64) // window))]
    if int(keyed.max()) < 2**16:
        keyed = keyed.astype(np.uint16)  # numpy's stable sort of 16-bit keys is a radix sort
    return order[np.argsort(keyed, kind="stable")]


def window_starts(n: int, window: int) -> np.ndarray:
    """``(ceil(n / window),)`` int64 stream positions where each window starts."""
    return np.arange(0, n, max(window, 1), dtype=np.int64)


def balanced_batch_order(costs: np.ndarray, group: int, key: int | None) -> np.ndarray:
    """A batch order in which neighbours have similar cost, yet which changes with ``key``.

    Batches are sorted by cost (stable: equal costs keep their incoming order), cut into groups
    of ``group`` consecutive batches, and the groups are shuffled as units. The W batches of
    one global step then come from one group whenever ``W`` divides ``group``, whatever the
    world size the plan is dealt to. When ``group`` does not divide the number of batches, one
    group is short: which one is drawn from ``key``, and it goes last, so that every full group
    starts at a multiple of ``group``.

    Args:
        costs: ``(num_batches,)`` cost of each batch (e.g. :meth:`BatchPlan.costs`).
        group: batches per shuffled group.
        key: a 64-bit key; ``None`` keeps the cost order (no shuffle).

    Returns:
        ``(num_batches,)`` int64 batch indices in plan order.
    """
    by_cost = np.argsort(costs, kind="stable").astype(np.int64)
    count = by_cost.size
    if key is None or count == 0:
        return by_cost
    full, rest = divmod(count, group)
    short = derive_seed(key, "short-group") % (full + 1) if rest else full
    # Full group g starts at g * group, or, past the short group, rest later.
    group_starts = np.arange(full, dtype=np.int64) * group
    group_starts[short:] += rest
    shuffled_starts = group_starts[Permutation(full, derive_seed(key, "groups"))(np.arange(full))]
    # picks: (full * group,) -- each group's start repeated, plus the rank within the group.
    picks = (shuffled_starts[:, None] + np.arange(group, dtype=np.int64)[None, :]).ravel()
    tail = np.arange(short * group, short * group + rest, dtype=np.int64)
    result: np.ndarray = by_cost[np.concatenate([picks, tail])]
    return result
