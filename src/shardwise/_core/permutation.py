"""A keyed permutation of ``[0, n)`` that maps a position to an index in O(1) time and memory.

Large ``n`` uses a Feistel network over the smallest power-of-two domain that holds ``n``,
with cycle walking: an output outside ``[0, n)`` is fed back in until it lands inside, which
stays a bijection on ``[0, n)`` and, because the domain is less than ``2n``, costs fewer than
two evaluations per position on average. The halves may differ by a bit (an odd number of
bits): each round XORs one half with a keyed hash of the other, a bijection whatever the
widths, so no domain has to be rounded up to an even number of bits.

Small ``n`` materialises the permutation once (argsort of raw PCG64 words), which is faster and
exactly uniform; both paths use integer arithmetic only and are bit-identical everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

# Imported here, not on first use: numpy loads numpy.random lazily, which would otherwise add
# several milliseconds to the first batch of the first epoch.
from numpy.random import PCG64, SeedSequence

from .errors import check_int

MAX_SIZE = 2**62
"""Largest supported ``n``: positions and indices must fit int64 with room for one shift."""

TABLE_MAX = 1 << 16
"""Up to this ``n`` the permutation is materialised (512 KiB at most)."""

ROUNDS = 6

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
"""2**64 / golden ratio: the odd constant that spreads consecutive integers before :func:`mix64`."""


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, in place on a uint64 array: a bijective 64-bit hash."""
    x ^= x >> _S30
    x *= _C1
    x ^= x >> _S27
    x *= _C2
    x ^= x >> _S31
    return x


def domain_bits(n: int) -> int:
    """Bits of the Feistel domain for ``n`` positions: the smallest power of two holding ``[0, n)`` (at least 2)."""
    return max(1, (n - 1).bit_length())


def feistel(x: np.ndarray, bits: int, keys: np.ndarray) -> np.ndarray:
    """One pass of the keyed Feistel bijection on ``[0, 2**bits)``; ``x`` is a uint64 array."""
    low = bits // 2  # width of the right half; the left half has bits - low >= low bits
    low_mask = np.uint64((1 << low) - 1)
    high_mask = np.uint64((1 << (bits - low)) - 1)
    return feistel_rounds(x, np.uint64(low), low_mask, high_mask, keys)


def feistel_rounds(x: np.ndarray, shift: Any, low_mask: Any, high_mask: Any, keys: Iterable[Any]) -> np.ndarray:
    """The Feistel rounds on ``x`` split at ``shift`` bits: one round per key, halves alternating.

    ``shift``, the masks and each key are uint64 scalars or arrays shaped like ``x`` (per-element
    domains and keys, as the per-group shuffles of ``index.grouped`` and ``_core.classes`` use).
    """
    left = x >> shift
    right = x & low_mask
    for i, key in enumerate(keys):
        if i % 2 == 0:
            left ^= mix64(right ^ key) & high_mask
        else:
            right ^= mix64(left ^ key) & low_mask
    merged: np.ndarray = (left << shift) | right
    return merged


def cycle_walk(
    rounds: Callable[[np.ndarray, int, np.ndarray], np.ndarray], values: np.ndarray, n: int, keys: np.ndarray
) -> np.ndarray:
    """Map ``values`` (each in ``[0, n)``) through ``rounds`` with cycle walking, as int64.

    ``rounds`` (:func:`feistel` or :func:`feistel_inverse`) is a bijection of the smallest
    power-of-two domain that holds ``n``; an output outside ``[0, n)`` is fed back in until it
    lands inside. ``keys`` is ``(ROUNDS,)`` uint64, one key for all values, or ``(ROUNDS,
    len(values))``, one key per round and value (every value walks the bijection of its own key).
    """
    bits = domain_bits(n)
    limit = np.uint64(n)
    out = rounds(np.asarray(values, dtype=np.uint64), bits, keys)
    outside = np.flatnonzero(out >= limit)
    while outside.size:
        # Walk only the values still outside [0, n); each pass keeps about half of them.
        walked = rounds(out[outside], bits, keys[:, outside] if keys.ndim == 2 else keys)
        out[outside] = walked
        outside = outside[walked >= limit]
    return out.astype(np.int64)


def feistel_permute(positions: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """Map ``positions`` (each in ``[0, n)``) through the cycle-walking Feistel permutation (see :func:`cycle_walk`)."""
    return cycle_walk(feistel, positions, n, keys)


def inverse_permutation(order: np.ndarray) -> np.ndarray:
    """The inverse of a permutation array: ``inverse[order[i]] == i`` (int64), e.g. slot of each shard."""
    inverse = np.empty(order.size, dtype=np.int64)
    inverse[order] = np.arange(order.size, dtype=np.int64)
    return inverse


def table_permutation(n: int, key: int) -> np.ndarray:
    """The materialised permutation for small ``n``: a stable argsort of ``n`` raw PCG64 words."""
    words = PCG64(key).random_raw(n)
    return np.argsort(words, kind="stable").astype(np.int64)


class Permutation:
    """A keyed bijection on ``[0, n)``: ``perm(positions)`` gives the index at each position.

    Args:
        n: size of the domain, ``0 <= n <= 2**62``.
        key: a 64-bit key; derive it with :func:`shardwise._core.seeds.derive_seed`.
        table_max: up to this ``n`` the permutation is materialised (faster, exactly uniform).

    Example:
        >>> perm = Permutation(10, key=1234)
        >>> sorted(perm(np.arange(10)).tolist()) == list(range(10))
        True
    """

    __slots__ = ("_keys", "_n", "_table")

    def __init__(self, n: int, key: int, *, table_max: int = TABLE_MAX) -> None:
        self._n = check_int("n", n, minimum=0, maximum=MAX_SIZE)
        key = check_int("key", key, minimum=0, maximum=2**64 - 1)
        self._table: np.ndarray | None = None
        self._keys: np.ndarray = np.empty(0, dtype=np.uint64)
        if self._n <= table_max:
            self._table = table_permutation(self._n, key)
        else:
            self._keys = SeedSequence(key).generate_state(ROUNDS, dtype=np.uint64)

    def __len__(self) -> int:
        return self._n

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Indices at ``positions`` (int array, each in ``[0, n)``), as int64 of the same shape."""
        positions = np.asarray(positions, dtype=np.int64)
        if self._table is not None:
            indices: np.ndarray = self._table[positions]
            return indices
        # The cycle walk indexes a flat array; positions of any shape map element by element.
        return feistel_permute(positions.ravel(), self._n, self._keys).reshape(positions.shape)

    def __repr__(self) -> str:
        method = "table" if self._table is not None else "feistel"
        return f"Permutation(n={self._n}, method={method!r})"


# -- the inverse: which position holds an index (provenance) ----------------------------------------
def feistel_inverse(x: np.ndarray, bits: int, keys: np.ndarray) -> np.ndarray:
    """The inverse of :func:`feistel`: the same rounds undone last to first (each XOR undoes itself)."""
    low = bits // 2
    return feistel_rounds_inverse(
        x, np.uint64(low), np.uint64((1 << low) - 1), np.uint64((1 << (bits - low)) - 1), keys
    )


def feistel_rounds_inverse(x: np.ndarray, shift: Any, low_mask: Any, high_mask: Any, keys: Iterable[Any]) -> np.ndarray:
    """:func:`feistel_rounds` undone, last round first (each XOR undoes itself); scalars or per-element arrays."""
    keys = list(keys)
    left = x >> shift
    right = x & low_mask
    for i in reversed(range(len(keys))):
        if i % 2 == 0:
            left ^= mix64(right ^ keys[i]) & high_mask
        else:
            right ^= mix64(left ^ keys[i]) & low_mask
    merged: np.ndarray = (left << shift) | right
    return merged


def feistel_unpermute(indices: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """The positions :func:`feistel_permute` maps to ``indices``: the cycle walked backwards."""
    return cycle_walk(feistel_inverse, indices, n, keys)


def positions_of(permutation: Permutation, indices: np.ndarray) -> np.ndarray:
    """The positions at which ``permutation`` puts ``indices``: O(1) each (O(n) once for a table).

    Args:
        permutation: the keyed permutation of one epoch.
        indices: int array, each in ``[0, n)``.

    Returns:
        positions: int64, shaped like ``indices``, with ``permutation(positions) == indices``.
    """
    indices = np.asarray(indices, dtype=np.int64)
    table = permutation._table
    if table is not None:
        found: np.ndarray = inverse_permutation(table)[indices]
        return found
    return feistel_unpermute(indices.ravel(), len(permutation), permutation._keys).reshape(indices.shape)
