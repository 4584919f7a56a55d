"""Index builders: O(n) outputs written to disk, O(chunk + keys) private memory while building.

:func:`order_by_key` is a chunked, stable counting sort of integer keys (lengths, labels): two
passes over the input, ``chunk`` keys at a time, the output written straight into a ``.npy``
memory map in the build directory that :func:`shardwise.index.build_or_open` hands out.
"""

from __future__ import annotations

import mmap
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .._core.class_buckets import group_by_class
from .._core.errors import check_int, check_path, check_str
from .._core.files import advise_pages
from .._core.foreign import private
from .progress import Progress

CHUNK = 1 << 20
"""Keys per step of a build: about 40 bytes of private memory each (40 MiB), whatever n."""
MAX_KEYS = 1 << 27
"""Largest key + 1 a counting sort accepts (its counts take 8 bytes a key: 1 GiB)."""


class OffsetLengths:
    """The lengths ``offsets[i + 1] - offsets[i]`` of a ragged store, read a slice at a time (never all at once).

    Example:
        >>> OffsetLengths(np.array([0, 3, 3, 7]))[0:3].tolist()
        [3, 0, 4]
    """

    ndim = 1
    dtype = np.dtype(np.int64)

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = offsets

    @property
    def size(self) -> int:
        return int(self.offsets.shape[0]) - 1

    shape = property(lambda self: (self.size,))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, span: slice) -> np.ndarray:
        first, stop, _ = span.indices(self.size)
        return np.diff(np.asarray(self.offsets[first : stop + 1], dtype=np.int64))


MADV_POPULATE_WRITE = 23
"""Linux's madvise flag (5.14+) that maps every page of a range writable in one call."""
POPULATE_MAX = 1 << 30
"""Largest output :func:`populate` maps at once (1 GiB: below the kernel's dirty-page thresholds on most nodes)."""


def populate(array: Any, first: int = 0, stop: int | None = None) -> None:
    """Map the pages of ``array[first:stop]`` (a writable 1-D ``np.memmap``) before a build writes them.

    A build writing a fresh file mapping takes a page fault per 4 KiB page (about a million at
    1e9 four-byte values, a few microseconds each on a busy virtual machine); one
    ``madvise(MADV_POPULATE_WRITE)`` maps them all at once. Nothing for other arrays; kernels
    before Linux 5.14 (and other systems) refuse the flag, and ranges over ``POPULATE_MAX`` are
    left alone: their pages then fault in one at a time, as before. A sequential writer populates
    a window ahead of itself (:func:`populate_ahead`).
    """
    # The number is Linux's: elsewhere it may name another advice, so only the mmap module's constant.
    advice = getattr(mmap, "MADV_POPULATE_WRITE", MADV_POPULATE_WRITE if sys.platform.startswith("linux") else None)
    if not isinstance(array, np.memmap) or array.ndim != 1:
        return
    stop = len(array) if stop is None else min(stop, len(array))
    size = (stop - first) * array.itemsize
    if size <= 0 or size > POPULATE_MAX:
        return  # all at once, its pages would be dirty (and written back) long before the build writes them
    mapped = getattr(array, private("numpy", "_mmap"), None)
    advise_pages(mapped, array.ctypes.data + first * array.itemsize, size, advice)


POPULATE_WINDOW = 1 << 23
"""Bytes a sequential writer maps ahead of itself (:func:`populate_ahead`)."""


def populate_ahead(array: Any, position: int, mapped: int) -> int:
    """Before writing ``array`` from ``position`` on: populate the next window once ``position`` reaches
    ``mapped`` (the end of the windows populated so far); returns the new end."""
    if position < mapped:
        return mapped
    end = position + max(1, POPULATE_WINDOW // max(getattr(array, "itemsize", 1), 1))
    populate(array, position, end)
    return end


def _as_keys(keys: Any) -> Any:
    return keys if isinstance(keys, OffsetLengths) else np.asarray(keys)


def index_dtype(n: int) -> np.dtype[Any]:
    """The narrowest dtype that holds every index below ``n``: uint32 up to 2**32, else int64."""
    n = check_int("n", n, minimum=0)
    return np.dtype(np.uint32) if n <= 2**32 else np.dtype(np.int64)


def key_counts(
    keys: Any, *, param: str = "keys", chunk: int = CHUNK, num_keys: int | None = None, progress: Progress | None = None
) -> np.ndarray:
    """``(K,)`` int64 count of every key value ``0..K-1``, read ``chunk`` keys at a time.

    ``K`` is ``num_keys`` or the largest key + 1. Raises naming ``param`` unless every key is an
    integer in ``[0, MAX_KEYS)`` (and below ``num_keys`` when given). ``progress`` is told of
    every chunk counted.
    """
    chunk = check_int("chunk", chunk, minimum=1)
    num_keys = None if num_keys is None else check_int("num_keys", num_keys, minimum=1)
    array = _as_keys(keys)
    if array.dtype.hasobject:
        raise TypeError(f"{param} should hold integers, but got {param}={keys!r:.80} ({type(keys).__name__})")
    if array.ndim != 1:
        raise ValueError(f"{param} should be a 1-D sequence of integers, but got {param} with shape {array.shape}")
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{param} should hold integers, but got {param} of dtype {array.dtype}")
    limit = MAX_KEYS if num_keys is None else min(num_keys, MAX_KEYS)
    counts = np.zeros(0 if num_keys is None else num_keys, dtype=np.int64)
    for first in range(0, array.size, chunk):
        part = array[first : first + chunk]
        low, high = int(part.min()), int(part.max())
        if low < 0:
            at = first + int(np.argmin(part))
            raise ValueError(f"{param} should hold non-negative integers, but got {param}[{at}]={low}")
        if high >= limit:
            at = first + int(np.argmax(part))
            what = f"below num_keys={num_keys}" if num_keys is not None and num_keys <= MAX_KEYS else "below 2**27"
            raise ValueError(f"{param} should hold integers {what} to be indexed, but got {param}[{at}]={high}")
        if high >= counts.size:
            counts = np.concatenate([counts, np.zeros(high + 1 - counts.size, dtype=np.int64)])
        counts += np.bincount(part.astype(np.intp, copy=False), minlength=counts.size)
        if progress is not None:
            progress.update(part.size)
    return counts


def order_by_key(
    keys: Any,
    directory: Path,
    *,
    name: str = "order",
    param: str = "keys",
    chunk: int = CHUNK,
    num_keys: int | None = None,
) -> None:
    """Write the indices of ``keys`` sorted by key (stable) and each key's offsets into ``directory``.

    Files written: ``<name>.npy``, ``(n,)`` indices (:func:`index_dtype`) with the indices of key
    ``k`` at ``[offsets[k], offsets[k + 1])``, in increasing index order; and
    ``<name>_offsets.npy``, ``(K + 1,)`` int64 (``K``: ``num_keys`` or the largest key + 1).

    Private memory: ``O(chunk + K)``, never ``O(n)``: keys are read ``chunk`` at a time (twice)
    and the output is a file mapping. Time: a counting pass, then the class index's sort
    (:func:`shardwise._core.class_buckets.group_by_class`, keys as classes: two local passes with
    numba, else every chunk ordered by numpy's stable sort and written to its keys' slots); shown
    as it goes (:class:`~shardwise.index.progress.Progress`).

    Args:
        keys: ``(n,)`` non-negative integers: an array, a memory map, anything ``numpy.asarray``
            takes without copying, or :class:`OffsetLengths` of a ragged store.
        directory: where to write (a build directory from :func:`~shardwise.index.build_or_open`).
        name: file name stem.
        param: the parameter name used in error messages.
        chunk: keys per step.
        num_keys: the number of key values (default: the largest key + 1).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> d = Path(tempfile.mkdtemp())
        >>> order_by_key(np.array([2, 0, 2, 1]), d)
        >>> np.load(d / "order.npy").tolist(), np.load(d / "order_offsets.npy").tolist()
        ([1, 3, 0, 2], [0, 1, 2, 4])
    """
    directory = Path(check_path("directory", directory))
    name, param = check_str("name", name), check_str("param", param)
    array = _as_keys(keys)
    n = array.size
    with Progress(2 * n, f"indexing {param} ({n:,} samples, 2 passes)") as progress:
        _order_by_key(array, directory, name, param, chunk, num_keys, progress)


def _order_by_key(
    array: Any, directory: Path, name: str, param: str, chunk: int, num_keys: int | None, progress: Progress
) -> None:
    counts = key_counts(array, param=param, chunk=chunk, num_keys=num_keys, progress=progress)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    np.save(directory / f"{name}_offsets.npy", offsets)
    n = array.size
    out = np.lib.format.open_memmap(directory / f"{name}.npy", mode="w+", dtype=index_dtype(n), shape=(n,))
    # the class index's sort: keys are classes 0..K-1 (NOTE [ Class index in two passes ])
    group_by_class(array, np.arange(counts.size), counts, out, chunk=chunk, progress=progress.update)
    out.flush()
    del out
