"""A keyed order inside a group of batches sorted by cost: random at every scale, balanced at every power of two.

A group of ``s`` batches in cost order is split in two halves (the first ``ceil(s / 2)``, the
rest), each half in two again, down to single batches: a binary tree whose every node is a run
of cost-neighbours. The group's plan order visits the tree depth first, and at every node a keyed
coin says which half comes first. So:

- every aligned block of ``2**k`` plan positions of a group of ``2**j >= 2**k`` batches is one
  node, a run of ``2**k`` cost-neighbours: the ``W`` batches of a global step stay balanced for
  every power-of-two ``W`` that divides the group, whatever ``W`` the plan is dealt to;
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


def _node_coins(keys: np.ndarray, lo: np.ndarray, size: np.ndarray, half: np.ndarray, first: np.ndarray) -> np.ndarray:
    coins = _coins(keys, lo, size)
    on_path = (first >= lo) & (first < lo + size)  # the node holding the rank to visit first
    return np.where(on_path, first >= lo + half, coins) & (size > 1)


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
        half = (size + 1) // 2
        swap = _node_coins(keys, lo, size, half, first)
        visited = np.where(swap, size - half, half)  # size of the half visited first
        in_first = positions - offset < visited
        left = in_first != swap  # the first half is the left one unless swapped
        offset = np.where(in_first, offset, offset + visited)
        lo = np.where(left, lo, lo + half)
        size = np.where(left, half, size - half)
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
        half = (size + 1) // 2
        swap = _node_coins(keys, lo, size, half, first)
        left = ranks < lo + half
        visited_first = left != swap
        offset = np.where(visited_first, offset, offset + np.where(swap, size - half, half))
        lo = np.where(left, lo, lo + half)
        size = np.where(left, half, size - half)
    return offset
