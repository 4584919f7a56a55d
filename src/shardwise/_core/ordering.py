"""Orders for a batch plan: a keyed shuffle, sorting by length in windows, balancing batches by cost.

:func:`shuffled` (a keyed random order of the samples), :func:`sort_in_windows` (sort by length
within windows of the stream, ties in incoming order) and :func:`balanced_batch_order` (batches
sorted by cost, then shuffled in groups, so that neighbouring batches, hence the ranks of one
global step, have similar cost).
"""

from __future__ import annotations

import numpy as np

from .groups import group_keys, permute_within, unpermute_within
from .permutation import Permutation, positions_of, table_permutation
from .seeds import derive_seed
from .tree_order import tree_position, tree_rank


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


NEIGHBOURS = 1
"""Mixed fixed-size batches: samples are shuffled within windows of this many batches of the sorted stream
(at a keyed offset, so a batch takes from two windows). WikiText-2 at batch 16: 1 pads 1.45% and 2 pads
2.2% (1 sorted whole: 0.92%), both with 0% of the batches repeated between epochs (bench/bench_bucket.py)."""


def neighbour_shuffle(positions: np.ndarray, n: int, window: int, key: int, *, inverse: bool = False) -> np.ndarray:
    """Positions of a stream of ``n`` shuffled within windows of ``window`` consecutive positions.

    The first window starts at a keyed offset (so that window edges move from key to key) and
    each window's positions are permuted by a keyed bijection (``groups.permute_within``): a
    position moves less than ``window`` places, O(1) each, nothing held. ``inverse`` undoes it.

    Args:
        positions: ``(m,)`` int64 positions in ``[0, n)``.
        n: the stream's length.
        window: positions shuffled together (>= 1).
        key: a 64-bit key.
        inverse: map shuffled positions back.

    Returns:
        ``(m,)`` int64: the position read at each of ``positions`` (or, ``inverse``, where it is read).
    """
    positions = np.asarray(positions, dtype=np.int64)
    offset = derive_seed(key, "neighbour-offset") % window
    which = (positions + offset) // window
    lo = np.maximum(which * window - offset, 0)
    size = np.minimum((which + 1) * window - offset, n) - lo
    keys = group_keys(derive_seed(key, "neighbours"), which)
    moved = unpermute_within(positions - lo, size, keys) if inverse else permute_within(positions - lo, size, keys)
    found: np.ndarray = lo + moved
    return found


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

    With ``within``, the batches of each group are ordered too, by the keyed tree of
    :mod:`~shardwise._core.tree_order` (random at every scale, every aligned power-of-two block a
    run of cost-neighbours); without it they keep their cost order (ascending in every group).
    ``first`` (a cost rank, with ``within``) deals the group of that batch first and that batch
    first within it, the runs of its cost-neighbours around it at every scale: plan position 0,
    and at every power-of-two world size dividing ``group`` step 0 holds its neighbours (the
    batch holding the longest sample: running out of memory shows at the first step).

    Args:
        count: batches in the plan.
        group: batches per shuffled group.
        key: a 64-bit key (``None``: the identity, cost order).
        within: order the batches within each group by the keyed tree.
        first: the cost rank of the batch dealt first (needs ``within``); ``None``: no such batch.

    Example:
        >>> ranks = GroupShuffle(10, 4, key=7).cost_rank(np.arange(10))
        >>> sorted(ranks.tolist()) == list(range(10))
        True
    """

    __slots__ = ("_first", "_first_group", "_first_within", "_full", "_group", "_groups", "_rest", "_short", "_top",
                 "_within")

    def __init__(self, count: int, group: int, key: int | None, *, within: bool = False,
                 first: int | None = None) -> None:  # fmt: skip
        if first is not None and not within:
            raise ValueError("first orders batches within groups: it needs within=True")
        self._group = group
        self._full, self._rest = divmod(count, group)
        self._groups: Permutation | None = None
        self._short = self._full
        self._within: int | None = None
        self._first = -1 if first is None or key is None else first  # a cost rank
        self._first_group, self._first_within = -2, -1  # its cost group and rank in it (-2: no group)
        self._top = 0  # the plan group swapped with plan group 0 (first); 0: none
        if key is None or count == 0:
            return
        if self._rest:
            self._short = derive_seed(key, "short-group") % (self._full + 1)
            if self._first >= 0 and self._full and self._cost_group_of(self._first) == self._full:
                # the first batch in a full group, which can go first without moving the others
                self._short = (self._short + 1) % (self._full + 1)
        self._groups = Permutation(self._full, derive_seed(key, "groups"))
        if within:
            self._within = derive_seed(key, "within")
            if self._first >= 0:
                self._first_group = self._cost_group_of(self._first)
                in_short = self._first_group == self._full
                start = self._short * group if in_short else int(self._group_starts(np.asarray(self._first_group)))
                self._first_within = self._first - start
                if self._full and not in_short:
                    found = positions_of(self._groups, np.asarray([self._first_group], dtype=np.int64))
                    self._top = int(found[0])

    def cost_rank(self, positions: np.ndarray) -> np.ndarray:
        """The cost-order position of each plan position (int64, the shape of ``positions``)."""
        if self._within is not None:
            return self._tree_cost_rank(np.asarray(positions, dtype=np.int64))
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
        if self._groups is None or (self._full == 0 and self._within is None):
            return ranks
        group, rest, short = self._group, self._rest, self._short
        in_short = (ranks >= short * group) & (ranks < short * group + rest)
        cost_group = np.where(ranks < short * group, ranks // group, (ranks - rest) // group)
        cost_group = np.where(in_short, 0, cost_group)
        within = np.where(in_short, ranks - short * group, ranks - self._group_starts(cost_group))
        if self._within is not None:
            within = tree_position(within, *self._tree_keys(in_short, cost_group))
        shuffled = self._plan_groups_of(cost_group) if self._full else cost_group
        found: np.ndarray = np.where(in_short, self._full * group + within, shuffled * group + within)
        return found

    def all_ranks(self) -> np.ndarray:
        """``cost_rank`` of every plan position ``0 .. count - 1``, one permutation call per group."""
        group, count = self._group, self._full * self._group + self._rest
        if self._within is not None:
            return self.cost_rank(np.arange(count, dtype=np.int64))
        if self._groups is None or self._full == 0:
            return np.arange(count, dtype=np.int64)
        starts = self._group_starts(self._groups(np.arange(self._full, dtype=np.int64)))
        # picks: (full * group,) -- each group's start repeated, plus the rank within the group.
        picks = (starts[:, None] + np.arange(group, dtype=np.int64)[None, :]).ravel()
        tail = np.arange(self._short * group, self._short * group + self._rest, dtype=np.int64)
        return np.concatenate([picks, tail])

    def _cost_group_of(self, rank: int) -> int:
        """The cost-order group of a full group's cost rank (``_full``: the short group)."""
        group, short, rest = self._group, self._short, self._rest
        if short * group <= rank < short * group + rest:
            return self._full
        return rank // group if rank < short * group else (rank - rest) // group

    def _group_starts(self, shuffled: np.ndarray) -> np.ndarray:
        """Where cost-order groups ``shuffled`` start: ``g * group``, or ``rest`` later past the short group."""
        starts: np.ndarray = shuffled * self._group + np.where(shuffled >= self._short, self._rest, 0)
        return starts

    # -- within groups: the keyed tree ----------------------------------------------------------
    def _cost_groups(self, plan_groups: np.ndarray) -> np.ndarray:
        """The cost-order group of each plan group (full groups; the group of ``first`` dealt first)."""
        top = self._top
        swapped = np.where(plan_groups == 0, top, np.where(plan_groups == top, 0, plan_groups))
        if self._groups is None:
            return swapped
        cost: np.ndarray = self._groups(swapped)
        return cost

    def _plan_groups_of(self, cost_groups: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`_cost_groups`."""
        if self._groups is None:
            return cost_groups
        plan = positions_of(self._groups, cost_groups)
        top = self._top
        swapped: np.ndarray = np.where(plan == 0, top, np.where(plan == top, 0, plan))
        return swapped

    def _tree_keys(self, in_short: np.ndarray, cost_group: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(sizes, keys, firsts)`` of each element's group, for :mod:`tree_order`."""
        if self._within is None:
            raise RuntimeError("_tree_keys is for within-group orders")
        ids = np.where(in_short, self._full, cost_group)  # the short group is keyed after the full ones
        sizes = np.where(in_short, self._rest, self._group)
        firsts = np.where(ids == self._first_group, self._first_within, -1)
        return sizes, group_keys(self._within, ids), firsts

    def _tree_cost_rank(self, positions: np.ndarray) -> np.ndarray:
        group, full = self._group, self._full * self._group
        in_short = positions >= full
        cost_group = self._cost_groups(np.where(in_short, 0, positions // group)) if self._full else positions * 0
        within = np.where(in_short, positions - full, positions % group)
        within = tree_rank(within, *self._tree_keys(in_short, cost_group))
        starts = np.where(in_short, self._short * group, self._group_starts(cost_group))
        ranks: np.ndarray = starts + within
        return ranks


def balanced_batch_order(
    costs: np.ndarray, group: int, key: int | None, *, within: bool = False, first: int | None = None
) -> np.ndarray:
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
        within: batches within each group in the keyed tree order (:class:`GroupShuffle`).
        first: the batch (an index into ``costs``) dealt first (with ``within``).

    Returns:
        ``(num_batches,)`` int64 batch indices in plan order.
    """
    by_cost = np.argsort(costs, kind="stable").astype(np.int64)
    rank = None if first is None else int(np.flatnonzero(by_cost == first)[0])
    shuffle = GroupShuffle(by_cost.size, group, key, within=within, first=rank)
    result: np.ndarray = by_cost[shuffle.all_ranks()]
    return result
