"""Per-epoch randomness inside groups of a shared index: keyed permutations, O(1) memory per lookup.

An index built by :func:`~shardwise.index.builders.order_by_key` lists the samples of every
group (a length, a class) contiguously. An epoch shuffles the members of every group with its own
keyed bijection (a cycle-walking Feistel network, as ``_core.permutation``, here vectorised over
elements of different groups: each element carries its group's size and key), so that the
``t``-th member of group ``g`` in epoch ``e`` is found in O(1) time and memory, with no per-epoch
argsort and nothing per group held in memory.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._core.errors import check_int, check_integer_array
from .._core.permutation import ROUNDS, feistel_rounds, feistel_rounds_inverse, mix64
from .integrity import IndexCorruptError, read_checked

_GROUP_SALT = np.uint64(0x9E3779B97F4A7C15)
SMALL_GROUP = 16
"""Groups up to this size are permuted by ranking keyed hashes (exactly uniform, O(16) per lookup);
larger ones by a Feistel network (O(1), close to uniform)."""
_ROUND_SALTS = np.array([0x243F6A8885A308D3 * (r + 1) % 2**64 for r in range(ROUNDS)], dtype=np.uint64)


def group_keys(key: int, groups: np.ndarray) -> np.ndarray:
    """``(m,)`` uint64: one 64-bit key per group id, derived from ``key`` by hashing (not adding)."""
    key = check_int("key", key, maximum=2**64 - 1)
    groups = check_integer_array("groups", groups)
    mixed = mix64(np.asarray(groups, dtype=np.int64).astype(np.uint64) * _GROUP_SALT + np.uint64(1))
    mixed ^= np.uint64(key % 2**64)
    result: np.ndarray = mix64(mixed)
    return result


def permute_within(ranks: np.ndarray, sizes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Map each rank ``ranks[i]`` in ``[0, sizes[i])`` through the keyed bijection of its group.

    Elements with equal ``(sizes[i], keys[i])`` share one permutation of ``[0, sizes[i])``: up to
    ``SMALL_GROUP`` members, the order of keyed hashes of the members (exactly uniform, which
    matters where groups are tiny: a sparse tail of lengths); above, a Feistel network over the
    smallest power-of-two domain, with cycle walking (fewer than two evaluations per element on
    average). Integer arithmetic only: the same on every platform.

    Args:
        ranks: ``(m,)`` int64 positions, each in ``[0, sizes[i])``.
        sizes: ``(m,)`` int64 group sizes (>= 1).
        keys: ``(m,)`` uint64 group keys (:func:`group_keys`).

    Returns:
        ``(m,)`` int64 permuted positions.

    Example:
        >>> sizes = np.full(5, 5); keys = group_keys(7, np.zeros(5, dtype=np.int64))
        >>> sorted(permute_within(np.arange(5), sizes, keys).tolist())
        [0, 1, 2, 3, 4]
    """
    ranks = np.asarray(check_integer_array("ranks", ranks), dtype=np.int64)
    sizes = np.asarray(check_integer_array("sizes", sizes), dtype=np.int64)
    keys = np.asarray(check_integer_array("keys", keys), dtype=np.uint64)
    if not ranks.shape == sizes.shape == keys.shape:
        raise ValueError(
            f"ranks, sizes and keys should have one entry per element each, but got shapes {ranks.shape}, "
            f"{sizes.shape} and {keys.shape}"
        )
    out: np.ndarray = ranks.copy()
    small = np.flatnonzero((sizes > 1) & (sizes <= SMALL_GROUP))
    if small.size:
        out[small] = _rank_hashes(ranks[small], sizes[small], keys[small])
    live = np.flatnonzero(sizes > SMALL_GROUP)
    out[live] = _walk_groups(feistel_rounds, ranks[live], sizes[live], keys[live])
    return out


def unpermute_within(values: np.ndarray, sizes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The inverse of :func:`permute_within`: the rank ``t`` with ``permute_within(t) == values[i]``, O(1) each.

    Small groups rank the member's keyed hash among its group's (O(16)); larger ones run the
    Feistel rounds backwards, walking the cycle back into ``[0, size)``.

    Example:
        >>> sizes = np.full(40, 40); keys = group_keys(7, np.zeros(40, dtype=np.int64))
        >>> t = np.arange(40); bool((unpermute_within(permute_within(t, sizes, keys), sizes, keys) == t).all())
        True
    """
    values = np.asarray(check_integer_array("values", values), dtype=np.int64)
    sizes = np.asarray(check_integer_array("sizes", sizes), dtype=np.int64)
    keys = np.asarray(check_integer_array("keys", keys), dtype=np.uint64)
    out: np.ndarray = values.copy()
    small = np.flatnonzero((sizes > 1) & (sizes <= SMALL_GROUP))
    if small.size:
        members = np.arange(SMALL_GROUP, dtype=np.uint64)
        hashes = mix64((keys[small, None] ^ (members[None, :] * _GROUP_SALT)) + _GROUP_SALT)
        hashes[members[None, :] >= sizes[small, None].astype(np.uint64)] = np.uint64(2**64 - 1)
        order = np.argsort(hashes, axis=1, kind="stable")
        out[small] = np.argmax(order == values[small, None], axis=1)  # where the member sits in its group's order
    live = np.flatnonzero(sizes > SMALL_GROUP)
    out[live] = _walk_groups(feistel_rounds_inverse, values[live], sizes[live], keys[live])
    return out


def _walk_groups(
    rounds: Callable[..., np.ndarray], values: np.ndarray, sizes: np.ndarray, keys: np.ndarray
) -> np.ndarray:
    """``values`` through each group's keyed Feistel ``rounds`` (either way), cycle-walked into ``[0, size)``."""
    limit = sizes.astype(np.uint64)
    # bits: the smallest domain 2**bits >= size (exact for sizes below 2**53, via frexp)
    bits = np.frexp((sizes - 1).astype(np.float64))[1].astype(np.uint64)
    low = bits // np.uint64(2)
    low_mask = (np.uint64(1) << low) - np.uint64(1)
    high_mask = (np.uint64(1) << (bits - low)) - np.uint64(1)
    round_keys = [mix64(keys ^ salt) for salt in _ROUND_SALTS]
    x = values.astype(np.uint64)
    todo = np.arange(values.size)
    while todo.size:
        x[todo] = rounds(x[todo], low[todo], low_mask[todo], high_mask[todo], [k[todo] for k in round_keys])
        todo = todo[x[todo] >= limit[todo]]
    return x.astype(np.int64)


def _rank_hashes(ranks: np.ndarray, sizes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Small groups: the member at rank ``t`` is the one with the ``t``-th smallest keyed hash (exactly uniform)."""
    members = np.arange(SMALL_GROUP, dtype=np.uint64)
    # hashes: (m, SMALL_GROUP) -- one keyed word per possible member; absent members sort last
    hashes = mix64((keys[:, None] ^ (members[None, :] * _GROUP_SALT)) + _GROUP_SALT)
    hashes[members[None, :] >= sizes[:, None].astype(np.uint64)] = np.uint64(2**64 - 1)
    order = np.argsort(hashes, axis=1, kind="stable")
    picked: np.ndarray = order[np.arange(ranks.size), ranks]
    return picked.astype(np.int64)



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
