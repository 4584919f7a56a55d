"""Keyed random draws as pure functions of ``(keys, position)``: 64 random bits, exact uniform integers.

Nothing is drawn from a generator's state: the value at a position is the same whichever rank,
worker or resumed process computes it, and computing it costs O(1).
"""

from __future__ import annotations

import numpy as np

from .permutation import GOLDEN, mix64

_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)


def counter_hash(positions: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """64 random bits per position: a pure function of ``(keys, position)`` (uint64 array)."""
    x = positions.astype(np.uint64) * GOLDEN
    x ^= keys[0]
    x = mix64(x)
    x ^= keys[1]
    return mix64(x)


def mul_wide(a: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 64 bits of ``a * b`` for a uint64 array ``a`` and ``0 <= b < 2**64``."""
    b_low, b_high = np.uint64(b & 0xFFFFFFFF), np.uint64(b >> 32)
    a_low, a_high = a & _LOW32, a >> _S32
    low_low, low_high, high_low = a_low * b_low, a_low * b_high, a_high * b_low
    middle = (low_low >> _S32) + (low_high & _LOW32) + (high_low & _LOW32)
    high = a_high * b_high + (low_high >> _S32) + (high_low >> _S32) + (middle >> _S32)
    return high, a * np.uint64(b)


def uniform_below(bound: int, positions: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Exactly uniform integers in ``[0, bound)``, one per position, a pure function of ``(keys, position)``.

    Lemire's method: the high word of ``hash * bound``, redrawn (from a hash of the previous
    hash) when the low word falls below ``2**64 mod bound``, which happens with probability
    below ``bound / 2**64``.
    """
    words = counter_hash(positions, keys)
    high, low = mul_wide(words, bound)
    threshold = np.uint64((2**64 - bound) % bound)
    redraw = np.flatnonzero(low < threshold)
    while redraw.size:
        words[redraw] = mix64(words[redraw] + GOLDEN)
        again_high, again_low = mul_wide(words[redraw], bound)
        high[redraw] = again_high
        redraw = redraw[again_low < threshold]
    return high.astype(np.int64)
