"""Orders for a batch plan: a keyed shuffle, sorting by length in windows, balancing batches by cost.

:func:`shuffled` (a keyed random order of the samples), :func:`sort_in_windows` (sort by length
within windows of the stream, ties in incoming order) and :func:`balanced_batch_order` (batches
sorted by cost, then shuffled in groups, so that neighbouring batches, hence the ranks of one
global step, have similar cost).
"""

from __future__ import annotations

import numpy as np

from .permutation import Permutation, positions_of, table_permutation
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


class GroupShuffle:
    """The balancing reorder as a map: the cost-order position of each plan position, in O(1) each.

    Batches in cost order are cut into groups of ``group`` consecutive batches and the groups are
    shuffled as units; when ``group`` does not divide ``count``, the short group (drawn from
    ``key``) goes last, so that every full group starts at a multiple of ``group``. Holds a few
    integers and a keyed :class:`~shardwise._core.permutation.Permutation` of the groups, so a
    plan of 1e9 batches costs nothing to reorder until positions are asked for.

    Args:
        count: batches in the plan.
        group: batches per shuffled group.
        key: a 64-bit key (``None``: the identity, cost order).

    Example:
        >>> ranks = GroupShuffle(10, 4, key=7).cost_rank(np.arange(10))
        >>> sorted(ranks.tolist()) == list(range(10))
        True
    """

    __slots__ = ("_full", "_group", "_groups", "_rest", "_short")

    def __init__(self, count: int, group: int, key: int | None) -> None:
        self._group = group
        self._full, self._rest = divmod(count, group)
        self._groups: Permutation | None = None
        self._short = self._full
        if key is None or count == 0:
            return
        if self._rest:
            self._short = derive_seed(key, "short-group") % (self._full + 1)
        self._groups = Permutation(self._full, derive_seed(key, "groups"))

    def cost_rank(self, positions: np.ndarray) -> np.ndarray:
        """The cost-order position of each plan position (int64, the shape of ``positions``)."""
        if self._groups is None or self._full == 0:
            return positions
        group = self._group
        full = self._full * group
        in_full = positions < full
        # Full group g of the shuffled order is cost-order group perm(g), which starts at
        # perm(g) * group, or rest later when it comes after the short group.
        starts = self._group_starts(self._groups(np.where(in_full, positions // group, 0)))
        tail = self._short * group + (positions - full)
        ranks: np.ndarray = np.where(in_full, starts + positions % group, tail)
        return ranks

    def plan_position(self, ranks: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`cost_rank`: the plan position of each cost-order position, O(1) each."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if self._groups is None or self._full == 0:
            return ranks
        group, rest, short = self._group, self._rest, self._short
        in_short = (ranks >= short * group) & (ranks < short * group + rest)
        cost_group = np.where(ranks < short * group, ranks // group, (ranks - rest) // group)
        cost_group = np.where(in_short, 0, cost_group)
        within = ranks - self._group_starts(cost_group)
        shuffled = positions_of(self._groups, cost_group)
        found: np.ndarray = np.where(in_short, self._full * group + (ranks - short * group), shuffled * group + within)
        return found

    def all_ranks(self) -> np.ndarray:
        """``cost_rank`` of every plan position ``0 .. count - 1``, one permutation call per group."""
        group, count = self._group, self._full * self._group + self._rest
        if self._groups is None or self._full == 0:
            return np.arange(count, dtype=np.int64)
        starts = self._group_starts(self._groups(np.arange(self._full, dtype=np.int64)))
        # picks: (full * group,) -- each group's start repeated, plus the rank within the group.
        picks = (starts[:, None] + np.arange(group, dtype=np.int64)[None, :]).ravel()
        tail = np.arange(self._short * group, self._short * group + self._rest, dtype=np.int64)
        return np.concatenate([picks, tail])

    def _group_starts(self, shuffled: np.ndarray) -> np.ndarray:
        """Where cost-order groups ``shuffled`` start: ``g * group``, or ``rest`` later past the short group."""
        starts: np.ndarray = shuffled * self._group + np.where(shuffled >= self._short, self._rest, 0)
        return starts


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
    result: np.ndarray = by_cost[GroupShuffle(by_cost.size, group, key).all_ranks()]
    return result
