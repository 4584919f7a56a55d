"""Index lists as samplers hold them, never copied, and how much two of them overlap, in O(n) time.

An index list is either a numpy integer array used as it is (a ``np.memmap`` stays on disk and
in the page cache, shared by every process of the node) or an :class:`Arange` standing for a
``range`` (no array at all). Both are read by position with :func:`take` and scanned in bounded
chunks with :func:`chunks`.

:func:`shared_indices` counts the values two lists have in common without a hash table or a sort
of either list: two ranges by arithmetic; otherwise values outside the overlap of the two value
ranges are skipped, and the overlap is covered by windows of at most ``WINDOW_BITS`` values, each
a bitmap marked from one list and probed by the other, chunk by chunk. Private memory is one
window's bitmap (at most 32 MiB) plus a chunk, whatever ``n``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .arrays import check_non_negative_integers, one_dimensional

CHUNK = 1 << 20
"""Values read per step by the scans here: bounds their private memory (8 MiB of int64)."""

WINDOW_BITS = 1 << 28
"""Values one overlap bitmap covers (32 MiB); a wider overlap takes several passes."""

_BIT = np.left_shift(np.uint8(1), np.arange(8, dtype=np.uint8))


@dataclass(frozen=True)
class Arange:
    """A ``range`` of non-negative indices held as three integers: ``start + step * position``."""

    start: int
    stop: int
    step: int

    def __len__(self) -> int:
        return len(range(self.start, self.stop, self.step))

    @property
    def size(self) -> int:
        return len(self)

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The values as an array, only when asked for (``np.asarray(sampler.primary_indices)``)."""
        values = np.arange(self.start, self.stop, self.step, dtype=np.int64)
        return values if dtype is None else values.astype(dtype)

    def bounds(self) -> tuple[int, int]:
        """Smallest and largest value (the list must not be empty)."""
        values = range(self.start, self.stop, self.step)
        return min(values[0], values[-1]), max(values[0], values[-1])


IndexList = np.ndarray | Arange


def index_list(name: str, values: object, *, allow_empty: bool = False) -> IndexList:
    """``values`` as an index list, without copying it, or raise naming ``name``.

    A ``range`` becomes an :class:`Arange`; a numpy array (memmaps included) or a CPU tensor is
    used as it is, in its own integer dtype; any other sequence becomes an array. Only the dtype
    is checked here: call :func:`check_values` for the values (an O(n) scan).

    Raises:
        ValueError: not 1-D, or empty without ``allow_empty``, or a range with a negative value.
        TypeError: a dtype other than integers (floats, bools).
    """
    if isinstance(values, range):
        if len(values) == 0 and not allow_empty:
            raise ValueError(f"{name} should hold at least one index, but got an empty {name}")
        if len(values) and min(values[0], values[-1]) < 0:
            raise ValueError(f"{name} should hold non-negative indices, but got {name}={values!r}")
        return Arange(values.start, values.stop, values.step)
    array = one_dimensional(name, values, sequence_of="indices", one="index", allow_empty=allow_empty)
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} should hold integer indices, but got {name} of dtype {array.dtype}")
    return array


def check_values(name: str, values: IndexList) -> tuple[int, int]:
    """Raise unless every index is in ``[0, 2**62)``; return the smallest and largest (O(n) streaming scan)."""
    if isinstance(values, Arange):
        return values.bounds()
    return check_non_negative_integers(name, values, holds="integer indices", noun="indices")


def take(values: IndexList, positions: np.ndarray) -> np.ndarray:
    """The indices at ``positions`` (any shape), as int64."""
    if isinstance(values, Arange):
        return values.start + values.step * np.asarray(positions, dtype=np.int64)
    return np.asarray(values[positions], dtype=np.int64)


def chunks(values: IndexList, size: int = CHUNK) -> Iterator[np.ndarray]:
    """The list in order, ``size`` values at a time (int64; a memmap is read a chunk at a time)."""
    for start in range(0, len(values), size):
        stop = min(start + size, len(values))
        if isinstance(values, Arange):
            yield values.start + values.step * np.arange(start, stop, dtype=np.int64)
        else:
            yield np.asarray(values[start:stop], dtype=np.int64)


def has_bits(bitmap: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Whether the bit at each offset is set (a bool array): bit ``k`` is ``bitmap[k >> 3] >> (k & 7) & 1``."""
    found: np.ndarray = (bitmap[offsets >> 3] & _BIT[offsets & 7]) != 0
    return found


def mark_bits(bitmap: np.ndarray, offsets: np.ndarray) -> None:
    """Set the bits at ``offsets`` (duplicates allowed); sorting first keeps the writes local and exact."""
    offsets = np.sort(offsets)
    byte = offsets >> 3
    bits = _BIT[offsets & 7]
    firsts = np.flatnonzero(np.concatenate([[True], byte[1:] != byte[:-1]]))
    bitmap[byte[firsts]] |= np.bitwise_or.reduceat(bits, firsts)


def _clear(bitmap: np.ndarray, offsets: np.ndarray) -> None:
    """Clear the bits at ``offsets`` (sorted, distinct)."""
    byte = offsets >> 3
    bits = _BIT[offsets & 7]
    firsts = np.flatnonzero(np.concatenate([[True], byte[1:] != byte[:-1]]))
    bitmap[byte[firsts]] &= ~np.bitwise_or.reduceat(bits, firsts)


def _ranges_shared(a: Arange, b: Arange) -> tuple[int, int] | None:
    """Shared count and smallest shared value of two unit-step ranges, else ``None`` (not handled)."""
    if a.step != 1 or b.step != 1:
        return None
    low, high = max(a.start, b.start), min(a.stop, b.stop)
    return (high - low, low) if high > low else (0, -1)


def shared_indices(
    a: IndexList, a_bounds: tuple[int, int], b: IndexList, b_bounds: tuple[int, int], *, window: int = WINDOW_BITS
) -> tuple[int, int]:
    """How many distinct values ``a`` and ``b`` share, and the smallest of them (``-1`` when none).

    Args:
        a, b: non-empty index lists.
        a_bounds, b_bounds: their smallest and largest values (from :func:`check_values`).
        window: values one bitmap covers.

    O(len(a) + len(b)) per window of the overlapping value range, with one ``window / 8``-byte
    bitmap and one chunk of private memory.
    """
    if isinstance(a, Arange) and isinstance(b, Arange):
        found = _ranges_shared(a, b)
        if found is not None:
            return found
    if len(b) < len(a):  # mark the shorter list (a sort per chunk), probe the longer one
        a, a_bounds, b, b_bounds = b, b_bounds, a, a_bounds
    low, high = max(a_bounds[0], b_bounds[0]), min(a_bounds[1], b_bounds[1])
    count, smallest = 0, -1
    for base in range(low, high + 1, window):
        top = min(base + window, high + 1)  # this pass covers values [base, top)
        bitmap = np.zeros(((top - base) >> 3) + 1, dtype=np.uint8)
        for chunk in chunks(a):
            inside = chunk[(chunk >= base) & (chunk < top)]
            if inside.size:
                mark_bits(bitmap, inside - base)
        for chunk in chunks(b):
            offsets = chunk[(chunk >= base) & (chunk < top)] - base
            if not offsets.size:
                continue
            hit = has_bits(bitmap, offsets).nonzero()[0]
            if hit.size:
                shared = np.unique(offsets[hit])
                _clear(bitmap, shared)  # a value repeated later in b is not counted twice
                count += len(shared)
                first = base + int(shared[0])
                smallest = first if smallest < 0 else min(smallest, first)
    return count, smallest
