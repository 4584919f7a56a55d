"""Per-epoch randomness inside groups of a shared index: keyed permutations, O(1) memory per lookup.

An index built by :func:`~shardwise.index.builders.order_by_key` lists the samples of every
group (a length, a class) contiguously. An epoch shuffles the members of every group with its own
keyed bijection (``shardwise._core.groups``: a cycle-walking Feistel network vectorised over
elements of different groups, each element carrying its group's size and key), so that the
``t``-th member of group ``g`` in epoch ``e`` is found in O(1) time and memory, with no per-epoch
argsort and nothing per group held in memory.
"""

from __future__ import annotations

import numpy as np

from .._core.errors import check_integer_array
from .._core.groups import SMALL_GROUP, group_keys, permute_within, unpermute_within
from .integrity import IndexCorruptError, read_checked

__all__ = ["SMALL_GROUP", "GroupedIndex", "group_keys", "permute_within", "unpermute_within"]

class GroupedIndex:
    """Samples grouped by key (a shared index), with keyed per-epoch shuffles inside every group.

    Args:
        order: ``(n,)`` sample indices, grouped: group ``g`` is ``order[offsets[g]:offsets[g + 1]]``
            (a read-only memory map from the cache, typically).
        offsets: ``(K + 1,)`` int64 group boundaries.

    Example:
        >>> index = GroupedIndex(np.array([1, 3, 0, 2]), np.array([0, 1, 2, 4]))
        >>> index.members(np.array([2, 2]), np.array([0, 1]), key=None).tolist()
        [0, 2]
        >>> sorted(index.members(np.array([2, 2]), np.array([0, 1]), key=5).tolist())
        [0, 2]
    """

    __slots__ = ("offsets", "order")

    def __init__(self, order: np.ndarray, offsets: np.ndarray) -> None:
        self.order = check_integer_array("order", order)
        offsets = check_integer_array("offsets", offsets)
        self.offsets = np.asarray(read_checked(offsets, offsets), dtype=np.int64)
        # O(groups): the offsets bound every position members() reads, so they must be boundaries of order
        if self.offsets.ndim != 1 or self.offsets.size == 0 or self.offsets[0] != 0 or \
                self.offsets[-1] != order.shape[0] or bool((np.diff(self.offsets) < 0).any()):
            raise IndexCorruptError(
                f"the group offsets of an index (of {order.shape[0]} samples) are not increasing from 0 to "
                f"{order.shape[0]}: a damaged index; remove its cache entry (it is rebuilt on the next start)"
            )

    def __len__(self) -> int:
        return int(self.order.shape[0])

    @property
    def num_groups(self) -> int:
        """``K``: group ids run over ``[0, K)`` (some may be empty)."""
        return int(self.offsets.size - 1)

    def sizes(self, groups: np.ndarray | None = None) -> np.ndarray:
        """Members of each group in ``groups`` (default: of every group), int64."""
        if groups is None:
            return np.diff(self.offsets)
        groups = np.asarray(groups, dtype=np.int64)
        result: np.ndarray = self.offsets[groups + 1] - self.offsets[groups]
        return result

    def members(self, groups: np.ndarray, ranks: np.ndarray, *, key: int | None) -> np.ndarray:
        """``(m,)`` int64: the ``ranks[i]``-th member of group ``groups[i]`` in the order of ``key``.

        ``key=None`` keeps the index order (increasing sample index within a group); any other
        key shuffles each group with its own keyed permutation (:func:`permute_within`).
        """
        groups = np.asarray(groups, dtype=np.int64)
        ranks = np.asarray(ranks, dtype=np.int64)
        if key is not None:
            ranks = permute_within(ranks, self.sizes(groups), group_keys(key, groups))
        return np.asarray(read_checked(self.order, self.order[self.offsets[groups] + ranks]), dtype=np.int64)

    def __repr__(self) -> str:
        return f"GroupedIndex(n={len(self)}, groups={self.num_groups})"
