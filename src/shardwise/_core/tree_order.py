"""A keyed order inside a group of batches sorted by cost: random at every scale, balanced at every power of two.

A group of ``s`` batches in cost order is split in two halves, each half in two again, down to
single batches: a binary tree whose every node is a run of cost-neighbours. The group's plan
order visits the tree depth first, and at every node a keyed coin says which half comes first.
A size that is not a power of two splits into its largest power of two, visited first, and the
rest (the coin says which takes the cheaper ranks). So:

- every aligned block of ``2**k`` plan positions is one node, a run of ``2**k`` cost-neighbours
  (but the last ones of a group whose size is not a multiple of ``2**k``): the ``W`` batches of a
  global step stay balanced for every power-of-two ``W``, whatever ``W`` the plan is dealt to;
- which end of the group comes first is a coin at every scale, so the cost no longer rises with
  the position through the group (ascending order, its former shape, repeated in every group).

O(log s) integer operations per position, vectorised, in either direction; nothing is held.
``first`` pins every coin on the path to one cost rank of the group, so that it comes first and
the runs holding it first at every scale (``longest_first``: the batch holding the longest
sample). Numpy only.
"""

from __future__ import annotations

import numpy as np

from .permutation import GOLDEN, mix64

_SIZE_SALT = np.uint64(0xD6E8FEB86659FD93)


def _coins(keys: np.ndarray, lo: np.ndarray, size: np.ndarray) -> np.ndarray:
    """One keyed bit per node ``(lo, size)`` of each element's group: swap the node's halves."""
    words = (lo.astype(np.uint64) + np.uint64(1)) * GOLDEN
    words ^= size.astype(np.uint64) * _SIZE_SALT
    words ^= keys
    coins: np.ndarray = (mix64(words) >> np.uint64(63)).astype(bool)
    return coins


def _children(
    keys: np.ndarray, lo: np.ndarray, size: np.ndarray, first: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(first_lo, first_size, second_lo, second_size)``: the cost ranges of a node's two children in visiting order.

    A node of a power-of-two size splits in halves, a coin choosing which is visited first. Any
    other size splits into its largest power of two ``P``, visited first (so that every block of
    a power of two stays aligned), and the rest, a coin choosing whether ``P`` takes the cheapest
    or the costliest ranks. On the path to ``first`` the coin makes its child the first.
    """
    power = (size & (size - 1)) == 0
    big = np.where(power, size // 2, _largest_power_of_two(size))
    on_path = (first >= lo) & (first < lo + size)
    coin = np.where(on_path, first >= lo + np.where(power, big, size - big), _coins(keys, lo, size)) & (size > 1)
    # power of two: halves (lo, big), (lo + big, big); otherwise (P, rest) with P low or high in cost
    first_lo = np.where(coin, np.where(power, lo + big, lo + size - big), lo)
    second_lo = np.where(coin, lo, lo + big)
    return first_lo, big, second_lo, size - big


def _largest_power_of_two(size: np.ndarray) -> np.ndarray:
    """The largest power of two ``<= size`` (1 for 0 and 1), elementwise."""
    bits = np.floor(np.log2(np.maximum(size, 1))).astype(np.int64)
    power = np.left_shift(np.int64(1), bits)
    power = np.where(power > size, power >> 1, power)  # log2's rounding, corrected both ways
    power = np.where(power * 2 <= size, power * 2, power)
    found: np.ndarray = np.maximum(power, 1)
    return found


def tree_rank(
    positions: np.ndarray, sizes: np.ndarray, keys: np.ndarray, first: np.ndarray | None = None
) -> np.ndarray:
    """The cost rank, within its group, of each position within its group.

    Args:
        positions: ``(m,)`` int64 plan positions within the group, each in ``[0, sizes[i])``.
        sizes: ``(m,)`` int64 group sizes (>= 1).
        keys: ``(m,)`` uint64 group keys (``groups.group_keys``).
        first: ``(m,)`` int64: the cost rank of the group visited first, -1 for none (``None``: none).

    Returns:
        ``(m,)`` int64 cost ranks, each in ``[0, sizes[i])``; a bijection within each group.
    """
    positions = np.asarray(positions, dtype=np.int64)
    size = np.asarray(sizes, dtype=np.int64).copy()
    first = np.full(positions.shape, -1, dtype=np.int64) if first is None else np.asarray(first, dtype=np.int64)
    lo = np.zeros_like(positions)
    offset = np.zeros_like(positions)  # where the current node starts in plan order
    while positions.size and int(size.max()) > 1:
        first_lo, first_size, second_lo, second_size = _children(keys, lo, size, first)
        in_first = positions - offset < first_size
        offset = np.where(in_first, offset, offset + first_size)
        lo = np.where(in_first, first_lo, second_lo)
        size = np.where(size > 1, np.where(in_first, first_size, second_size), size)
    return lo


def tree_position(
    ranks: np.ndarray, sizes: np.ndarray, keys: np.ndarray, first: np.ndarray | None = None
) -> np.ndarray:
    """The inverse of :func:`tree_rank`: the position within its group of each cost rank."""
    ranks = np.asarray(ranks, dtype=np.int64)
    size = np.asarray(sizes, dtype=np.int64).copy()
    first = np.full(ranks.shape, -1, dtype=np.int64) if first is None else np.asarray(first, dtype=np.int64)
    lo = np.zeros_like(ranks)
    offset = np.zeros_like(ranks)
    while ranks.size and int(size.max()) > 1:
        first_lo, first_size, second_lo, second_size = _children(keys, lo, size, first)
        in_first = (ranks >= first_lo) & (ranks < first_lo + first_size)
        offset = np.where(in_first, offset, offset + first_size)
        lo = np.where(in_first, first_lo, second_lo)
        size = np.where(size > 1, np.where(in_first, first_size, second_size), size)
    return offset
