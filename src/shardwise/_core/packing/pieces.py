"""The item index of a packing plan: every sample, or every piece of a long one, grouped by length.

An **item** is what a row holds: a whole sample, or (``too_long="split"``) one piece of a sample
longer than ``max_len`` (piece ``k`` holds its tokens ``[k * max_len, (k + 1) * max_len)``, the
last piece the rest). :func:`piece_index` groups the items by length once: a counting sort, the
O(n) work of the plan, independent of the epoch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..offsets import offsets_from_counts, span_positions
from ..public import public


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
    counts = piece_counts(lengths, max_len)
    sample = np.empty(int(counts.sum()), dtype=np.int64)
    start = np.zeros_like(sample)
    fill_pieces(lengths, max_len, counts, sample, start)
    return PieceIndex(sample, start, offsets_from_counts(counts.sum(axis=0)), skipped)


CHUNK = 1 << 20
"""Samples per step of :func:`piece_counts` and :func:`fill_pieces` (tens of MB of private memory)."""


def _pieces(first: int, part: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of the samples of ``part`` longer than ``max_len`` (sample ``first + i``), sample by sample.

    Returns:
        ``owner``, ``start`` and ``length`` ``(k,)`` int64 of every piece: piece ``j`` of a sample
        of length ``L`` holds its tokens ``[j * max_len, min((j + 1) * max_len, L))``.
    """
    long = np.flatnonzero(part > max_len)
    long_lengths = part[long].astype(np.int64)
    pieces: np.ndarray = -(-long_lengths // max_len)  # (k,) pieces per long sample
    starts = span_positions(np.zeros_like(pieces), pieces) * max_len
    piece_len = np.minimum(np.repeat(long_lengths, pieces) - starts, max_len)
    return np.repeat(long + first, pieces), starts, piece_len


def piece_counts(lengths: np.ndarray, max_len: int, *, chunk: int = CHUNK, on_chunk: Any = None) -> np.ndarray:
    """``(2, max_len + 1)`` int64: samples of each length up to ``max_len``, and pieces of each length of longer ones.

    Reads ``lengths`` ``chunk`` at a time: O(chunk) private memory whatever its size.
    ``on_chunk(size)`` is told of every chunk counted.
    """
    counts = np.zeros((2, max_len + 1), dtype=np.int64)
    for first in range(0, lengths.size, chunk):
        part = np.asarray(lengths[first : first + chunk])
        short = part <= max_len
        counts[0] += np.bincount(part[short], minlength=max_len + 1)
        long = part[~short].astype(np.int64)
        counts[1, max_len] += int((long // max_len).sum())
        rest = long % max_len
        counts[1] += np.bincount(rest[rest > 0], minlength=max_len + 1)
        if on_chunk is not None:
            on_chunk(part.size)
    return counts


def _grouped(keys: np.ndarray, cursor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stable order of ``keys`` by key and the slot of each in that order (key ``k``'s from ``cursor[k]`` on).

    ``cursor`` is advanced past the slots taken. A radix sort for 16-bit keys.
    """
    keys = keys.astype(np.uint16 if cursor.size <= 2**16 else np.int64, copy=False)
    order = np.argsort(keys, kind="stable")
    here = np.bincount(keys, minlength=cursor.size)
    slots = np.arange(order.size, dtype=np.int64)
    slots += np.repeat(cursor - (np.cumsum(here) - here), here)  # the key's cursor + the rank among equal keys here
    cursor += here
    return order, slots


def fill_pieces(
    lengths: np.ndarray,
    max_len: int,
    counts: np.ndarray,
    sample: np.ndarray,
    start: np.ndarray,
    *,
    chunk: int = CHUNK,
    on_chunk: Any = None,
) -> None:
    """Write every item's sample and first token into ``sample`` and ``start``, grouped by item length.

    Class ``l`` (``offsets_from_counts(counts.sum(axis=0))``) holds the samples of length ``l``
    in index order, then the pieces of length ``l`` of longer samples in (sample, piece) order:
    a stable counting sort of the samples followed by the pieces, one pass over ``lengths``,
    ``chunk`` at a time (O(chunk) private memory; ``sample`` and ``start`` may be file maps).

    Args:
        counts: :func:`piece_counts` of ``lengths``.
        sample: ``(counts.sum(),)`` integers, written.
        start: ``(counts.sum(),)`` integers, zeroed (a new file map is): only pieces are written.
    """
    offsets = offsets_from_counts(counts.sum(axis=0))
    short_cursor, piece_cursor = offsets[:-1].copy(), offsets[:-1] + counts[0]  # (max_len + 1,) next free slots
    for first in range(0, lengths.size, chunk):
        part = np.asarray(lengths[first : first + chunk])
        short = np.flatnonzero(part <= max_len)
        order, slots = _grouped(part[short], short_cursor)
        short += first
        sample[slots] = short[order]  # start stays 0: the caller hands it in zeroed
        owner, starts, piece_len = _pieces(first, part, max_len)
        order, slots = _grouped(piece_len, piece_cursor)
        sample[slots] = owner[order]
        start[slots] = starts[order]
        if on_chunk is not None:
            on_chunk(part.size)


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(TooLong)
