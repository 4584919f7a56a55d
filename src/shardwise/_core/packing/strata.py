"""Strata: which items of every length class each stratum takes, and the keyed orders of one epoch.

The items are dealt into ``S`` **strata** of about ``window`` items each: stratum ``s`` takes a
fixed share of every length class (:func:`stratum_histogram`, a function of the class sizes
alone), so every stratum has about the same length distribution as the whole data set. *Which*
items of a class a stratum takes changes every epoch (a keyed permutation per class, keyed by
:func:`class_shuffle_key`), and so does the order in which strata are visited
(:func:`stratum_order_key`).
"""

from __future__ import annotations

import numpy as np

from ..offsets import span_positions
from ..permutation import mix64
from ..seeds import derive_seed


def class_phases(num_classes: int) -> np.ndarray:
    """``(num_classes,)`` fixed phases, so that classes of one or two items spread over the strata."""
    return mix64(np.arange(1, num_classes + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))


def stratum_bounds(counts: np.ndarray, num_strata: int, stratum: int, phases: np.ndarray) -> np.ndarray:
    """``(2, classes)`` int64: the class positions ``[lo, hi)`` that ``stratum`` takes from each class.

    Position boundaries are ``floor((count * s + phase) / S)``: every stratum takes ``floor`` or
    ``ceil`` of ``count / S`` items of each class, and over all strata each item exactly once.
    """
    counts = counts.astype(np.int64)
    phase = (phases % np.uint64(num_strata)).astype(np.int64)
    if num_strata == 1:
        return np.stack([np.zeros_like(counts), counts])
    # (count * s + phase) fits int64 for count < 2**62 / S; use Python ints where it would not.
    bounds = np.empty((2, counts.size), dtype=np.int64)
    for row, s in enumerate((stratum, stratum + 1)):
        if int(counts.max(initial=0)) * (s + 1) < 2**62:
            bounds[row] = (counts * s + phase) // num_strata - phase // num_strata
        else:  # pragma: no cover - beyond 2**62 / S items of one length
            bounds[row] = [(int(c) * s + int(p)) // num_strata for c, p in zip(counts, phase, strict=True)]
    return bounds


def strata_starts(counts: np.ndarray, num_strata: int, phases: np.ndarray, *, chunk: int = 256) -> np.ndarray:
    """``(num_strata + 1,)`` int64: where each stratum's slots start, strata one after another (a cumulative sum
    of the strata's sizes, :func:`stratum_bounds` summed over classes), ``chunk`` strata at a time."""
    counts = counts.astype(np.int64)
    if num_strata == 1 or int(counts.max(initial=0)) * (num_strata + 1) >= 2**62:  # pragma: no cover - huge classes
        sizes = [int(np.diff(stratum_bounds(counts, num_strata, s, phases), axis=0).sum()) for s in range(num_strata)]
        return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    phase = (phases % np.uint64(num_strata)).astype(np.int64)
    starts = np.empty(num_strata + 1, dtype=np.int64)
    for first in range(0, num_strata + 1, chunk):
        strata = np.arange(first, min(first + chunk, num_strata + 1), dtype=np.int64)[:, None]
        starts[strata[:, 0]] = ((counts * strata + phase) // num_strata).sum(axis=1)  # lo of every class, summed
    starts -= starts[0]
    return starts


def stratum_histogram(counts: np.ndarray, num_strata: int, stratum: int, phases: np.ndarray) -> np.ndarray:
    """``(classes,)`` int64 items of each length in ``stratum`` (see :func:`stratum_bounds`)."""
    lo, hi = stratum_bounds(counts, num_strata, stratum, phases)
    histogram: np.ndarray = hi - lo
    return histogram


def stratum_slots(
    counts: np.ndarray, num_strata: int, stratum: int, phases: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The class and class-local position of every item slot of ``stratum``, by class ascending.

    Returns:
        ``classes`` and ``ranks``, ``(k,)`` int64 each: slot ``i`` is position ``ranks[i]`` of
        length class ``classes[i]`` (before the epoch's permutation within the class; a caller
        maps it through its keyed per-class permutation to an item). Slots are listed in the
        order :func:`pack_histogram` assigns rows to.
    """
    lo, hi = stratum_bounds(counts, num_strata, stratum, phases)
    taken = hi - lo
    classes = np.flatnonzero(taken)
    per = taken[classes]
    ranks = span_positions(lo[classes], per)  # (k,) class-local positions lo..hi-1 of every class, in turn
    return np.repeat(classes, per).astype(np.int64), ranks


def sorted_by(major: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Positions sorted by ``(major, noise)`` (non-negative ints, uint64 words): one stable sort of packed keys.

    ``major`` takes the high bits it needs, ``noise`` the rest of a 64-bit key (ties of the
    truncated noise keep position order: still one order on every platform).
    """
    if major.size == 0:
        return np.empty(0, dtype=np.int64)
    bits = max(int(major.max()).bit_length(), 1)
    keys = (major.astype(np.uint64) << np.uint64(64 - bits)) | (noise >> np.uint64(bits))
    order: np.ndarray = np.argsort(keys, kind="stable").astype(np.int64)
    return order


def shuffle_within_classes(offsets: np.ndarray, key: int) -> np.ndarray:
    """``(m,)`` int64: a keyed random order of every class's items, materialised (for small indexes).

    Item at class-position ``p`` of class ``c`` is ``result[offsets[c] + p]``: the items of each
    class sorted by raw PCG64 words (what large indexes do per item with a Feistel permutation).
    """
    total = int(offsets[-1])
    classes = np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(offsets))
    return sorted_by(classes, np.random.PCG64(key).random_raw(total))


def class_shuffle_key(seed: int, epoch: int) -> int:
    """The key of one epoch's permutations within length classes."""
    return derive_seed(seed, epoch, "pack-classes")


def stratum_order_key(seed: int, epoch: int) -> int:
    """The key of one epoch's order of strata."""
    return derive_seed(seed, epoch, "pack-strata")
