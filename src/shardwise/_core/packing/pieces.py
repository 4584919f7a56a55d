"""The item index of a packing plan: every sample, or every piece of a long one, grouped by length.

An **item** is what a row holds: a whole sample, or (``too_long="split"``) one piece of a sample
longer than ``max_len`` (piece ``k`` holds its tokens ``[k * max_len, (k + 1) * max_len)``, the
last piece the rest). :func:`piece_index` groups the items by length once: a counting sort, the
O(n) work of the plan, independent of the epoch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..offsets import offsets_from_counts, span_positions


class TooLong(str, enum.Enum):
    """What ``PackedBatchSampler`` does with a sample longer than ``max_len``."""

    SPLIT = "split"
    """Cut it into pieces of ``max_len`` tokens (the last piece holds the rest); each piece is packed alone."""
    SKIP = "skip"
    """Leave it out of every epoch; its index is in ``sampler.skipped``."""
    ERROR = "error"
    """Refuse at construction, naming the first such sample."""


@dataclass(frozen=True, eq=False)
class PieceIndex:
    """Every item (a sample, or a piece of one) grouped by length: class ``l`` is ``offsets[l]:offsets[l + 1]``.

    Attributes:
        sample: ``(m,)`` int64 sample index of each item, grouped by item length (ascending).
        start: ``(m,)`` int64 first token of each item in its sample (0 unless split), or
            ``None`` when no sample is split.
        offsets: ``(max_len + 2,)`` int64 class boundaries.
        skipped: int64 indices of samples left out (``too_long="skip"``).
    """

    sample: np.ndarray
    start: np.ndarray | None
    offsets: np.ndarray
    skipped: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """``(max_len + 1,)`` int64: items of each length."""
        return np.diff(self.offsets)

    @property
    def num_items(self) -> int:
        return int(self.offsets[-1])

    @property
    def max_len(self) -> int:
        return int(self.offsets.size - 2)


def group_by_key(keys: np.ndarray, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``keys`` grouped by key (stable) and the group offsets: a counting sort.

    Returns:
        ``order`` ``(keys.size,)`` int64 and ``offsets`` ``(num_keys + 1,)`` int64, group ``k``
        being ``order[offsets[k]:offsets[k + 1]]``. (The switch point to the shared node index.)
    """
    offsets = offsets_from_counts(np.bincount(keys, minlength=num_keys))
    small = keys.astype(np.uint16) if num_keys <= 2**16 else keys
    order = np.argsort(small, kind="stable").astype(np.int64)  # a radix sort for 16-bit keys
    return order, offsets


def long_samples(lengths: np.ndarray, max_len: int, too_long: TooLong) -> np.ndarray:
    """Indices of samples longer than ``max_len``, or raise as ``too_long`` asks.

    Raises:
        ValueError: ``too_long="error"`` and a sample is longer than ``max_len``, or
            ``too_long="skip"`` and every sample is.
    """
    long = np.flatnonzero(lengths > max_len)
    if long.size and too_long is TooLong.ERROR:
        first = int(long[0])
        raise ValueError(
            f"lengths[{first}]={int(lengths[first])} is longer than max_len={max_len} ({long.size} "
            f"sample{'s are' if long.size > 1 else ' is'}); pass too_long='split' to cut such samples into "
            "pieces of max_len, too_long='skip' to leave them out, or a larger max_len"
        )
    if too_long is TooLong.SKIP and long.size == lengths.size:
        raise ValueError(f"every sample is longer than max_len={max_len}, so too_long='skip' would leave nothing")
    return long


def piece_index(lengths: np.ndarray, max_len: int, too_long: TooLong) -> PieceIndex:
    """Group every item by length (see the module docstring); lengths over ``max_len`` per ``too_long``.

    Raises:
        ValueError: ``too_long="error"`` and a sample is longer than ``max_len``, or nothing is left.
    """
    lengths = np.asarray(lengths)
    long = long_samples(lengths, max_len, too_long)
    skipped = np.empty(0, dtype=np.int64)
    if not long.size:
        order, offsets = group_by_key(lengths.astype(np.int64, copy=False), max_len + 1)
        return PieceIndex(order, None, offsets, skipped)
    if too_long is TooLong.SKIP:
        keep = np.flatnonzero(lengths <= max_len)
        order, offsets = group_by_key(lengths[keep].astype(np.int64), max_len + 1)
        return PieceIndex(keep[order], None, offsets, long.astype(np.int64))
    # split: every long sample becomes its full pieces plus (if any) the rest.
    long_lengths = lengths[long].astype(np.int64)
    pieces: np.ndarray = -(-long_lengths // max_len)  # (k,) pieces per long sample
    owner = np.repeat(long, pieces)
    piece = span_positions(np.zeros_like(pieces), pieces)  # each long sample's pieces 0, 1, ...
    starts = piece * max_len
    piece_len = np.minimum(np.repeat(long_lengths, pieces) - starts, max_len)
    short = np.flatnonzero(lengths <= max_len)
    sample = np.concatenate([short.astype(np.int64), owner])
    start = np.concatenate([np.zeros(short.size, dtype=np.int64), starts])
    keys = np.concatenate([lengths[short].astype(np.int64), piece_len])
    order, offsets = group_by_key(keys, max_len + 1)
    return PieceIndex(sample[order], start[order], offsets, skipped)
