"""Keyed permutations inside groups, vectorised over elements of different groups, O(1) memory each.

Each element carries its group's size and 64-bit key; the ``t``-th member of a group is found in
O(1) time and memory (a cycle-walking Feistel network, as :mod:`permutation`, with per-element
domains and keys; tiny groups rank keyed hashes, exactly uniform), with no argsort and nothing per
group held in memory. The shared index (``shardwise.index.grouped``) shuffles the members of every
length or class with them; the staggered-streams plan (``streams``) shuffles its blocks and shards.
Numpy only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .errors import check_int, check_integer_array
from .permutation import ROUNDS, feistel_rounds, feistel_rounds_inverse, mix64

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
    # The first pass over every element as they are; only the walkers left outside their group (fewer
    # than half) are gathered for the next passes: a gather of each per-element array costs about as
    # much as a round, so gathering everything for the first pass as well made a walk ~1.6x slower.
    x = rounds(values.astype(np.uint64), low, low_mask, high_mask, round_keys)
    todo = np.flatnonzero(x >= limit)
    while todo.size:
        walked = rounds(x[todo], low[todo], low_mask[todo], high_mask[todo], [k[todo] for k in round_keys])
        x[todo] = walked
        todo = todo[walked >= limit[todo]]
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
