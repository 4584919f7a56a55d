"""Content keys of sampler inputs: which cache entry belongs to which input, cheaply at 1e9 entries.

A full hash of an 8 GB input costs seconds per rank per start, so the key depends on where the
input lives:

- a ragged store (anything with a ``manifest`` holding the offsets' CRC-32, such as
  ``RaggedArray``): the store's own checksum of its offsets, the sample and row counts: O(1),
  and a store copied elsewhere keeps its key (and its index);
- a memory-mapped array (``numpy.memmap``, ``np.load(..., mmap_mode="r")``, and views of them):
  the file's identity (resolved path, device, inode, size, ``mtime_ns``), where the array starts
  in it, its dtype, shape and strides, plus a hash of 64 blocks of 4 KiB spread over its bytes:
  O(1). The trade-off, as make's: rewriting the file changes its ``mtime_ns`` and so the key; an
  edit that keeps size and ``mtime_ns`` (deliberately reset) and misses the sampled blocks is
  not seen;
- any other array: a BLAKE2b of all its bytes (about 1 s per GB; exact). Memory-map large inputs.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import queue
from typing import Any

import numpy as np

from .._core.arrays import digest_hasher
from .._core.files import advise_pages
from .._core.foreign import private

SAMPLED_BLOCKS = 64
BLOCK_ELEMENTS_BYTES = 4096
WILL_NEED = getattr(mmap, "MADV_WILLNEED", None)
_HASH_CHUNK = 1 << 24  # bytes hashed at a time from a non-contiguous array


def key_of(values: Any) -> str:
    """A short hex key that changes when the content of ``values`` changes (see the module docstring).

    Args:
        values: a ragged store (``RaggedArray``), a ``numpy.memmap`` (or a view of one), or any
            array-like (converted with ``numpy.asarray``, hashed in full).

    Example:
        >>> key_of(np.arange(4)) == key_of(np.arange(4)), key_of(np.arange(4)) == key_of(np.arange(5))
        (True, False)
    """
    manifest = getattr(values, "manifest", None)
    if isinstance(manifest, dict) and "files" in manifest and hasattr(values, "offsets"):
        return ragged_key(manifest)
    array = np.asarray(values)
    if array.dtype.hasobject:
        raise TypeError(
            f"values should be an array of numbers, a memory map or a ragged store, but got values={values!r:.80} "
            f"({type(values).__name__})"
        )
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(f"{array.dtype.str}|{array.shape}".encode())
    where = file_position(values)
    if where is not None:
        hasher.update(repr(("mapped", *where, array.strides)).encode())
        _update_sampled(hasher, array, getattr(values, private("numpy", "_mmap"), None))
    else:
        _update_full(hasher, array)
    return hasher.hexdigest()


def ragged_key(manifest: dict[str, Any]) -> str:
    """The key of a ragged store from its manifest: its offsets' CRC-32, sample and row counts."""
    offsets = manifest["files"].get("offsets.npy", {})
    parts = ["ragged", manifest.get("num_samples"), manifest.get("total_rows"), offsets.get("crc32")]
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def file_position(values: Any) -> tuple[Any, ...] | None:
    """``(path, dev, inode, size, mtime_ns, byte offset)`` of a memory-mapped array, else ``None``."""
    if not isinstance(values, np.memmap) or values.filename is None:
        return None
    raw = getattr(values, private("numpy", "_mmap"), None)
    if not isinstance(raw, mmap.mmap) or values.size == 0:
        return None
    try:
        status = os.stat(values.filename)
        base = np.frombuffer(raw, dtype=np.uint8).ctypes.data
    except (OSError, ValueError, TypeError):
        return None
    # np.memmap maps from offset rounded down to the allocation granularity; a view's data
    # pointer tells where, in that mapping, this (possibly sliced) array starts.
    start = values.offset - values.offset % mmap.ALLOCATIONGRANULARITY
    position = start + (values.ctypes.data - base)
    path = os.path.realpath(values.filename)
    return (path, status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, position)


def _flat(array: np.ndarray) -> np.ndarray:
    """A 1-D view of a 1-D or contiguous array (a copy only for a non-contiguous N-D array)."""
    return array if array.ndim == 1 else array.reshape(-1)


def _update_sampled(hasher: Any, array: np.ndarray, raw: Any = None) -> None:
    flat = _flat(array)
    per_block = max(1, BLOCK_ELEMENTS_BYTES // max(array.dtype.itemsize, 1))
    n = flat.size
    if n <= SAMPLED_BLOCKS * per_block:
        hasher.update(np.ascontiguousarray(flat).view(np.uint8).data)
        return
    last = n - per_block
    firsts = [last * k // (SAMPLED_BLOCKS - 1) for k in range(SAMPLED_BLOCKS)]
    if raw is not None and flat.flags.c_contiguous:
        # Ask for every block's pages at once: on a file out of the page cache (a 4 GB input right
        # after a build) the reads then overlap instead of faulting one block after another
        # (1e9 int32 lengths: ~400 ms -> ~2 ms).
        for first in firsts:
            advise_pages(raw, flat.ctypes.data + first * flat.itemsize, per_block * flat.itemsize, WILL_NEED)
    for first in firsts:
        hasher.update(np.ascontiguousarray(flat[first : first + per_block]).view(np.uint8).data)


def _update_full(hasher: Any, array: np.ndarray) -> None:
    if array.size == 0:
        return
    if array.flags.c_contiguous:
        hasher.update(array.reshape(-1).view(np.uint8).data)
        return
    flat = _flat(array)
    step = max(1, _HASH_CHUNK // max(array.dtype.itemsize, 1))
    for first in range(0, flat.size, step):
        hasher.update(np.ascontiguousarray(flat[first : first + step]).view(np.uint8).data)


class BackgroundDigest:
    """``shardwise._core.arrays.digest`` of 1-D arrays, hashed by one thread while the caller works on.

    BLAKE2b releases the GIL on large buffers, so on a second core the hash of an index's input
    (several GB at 1e9 samples) overlaps the build's passes instead of adding one. Start it with
    whole arrays (``BackgroundDigest(a, b)``), or with ``dtype`` and ``length`` and :meth:`feed` it
    the array's pieces in order as they are written; :meth:`result` waits and gives the digests
    (one after the other: 16 hex digits each). Use it as a context manager: leaving the block early
    stops the thread.

    Example:
        >>> from shardwise._core.arrays import digest
        >>> a, b = np.arange(1000, dtype=np.int32), np.arange(5.0)
        >>> with BackgroundDigest(a, b) as hashing:
        ...     same = hashing.result() == digest(a) + digest(b)
        >>> same
        True
    """

    _PIECE = 1 << 24  # bytes hashed per update: the GIL is released for each

    def __init__(self, *arrays: np.ndarray, dtype: Any = None, length: int | None = None) -> None:
        from .._core import threads

        specs = [(array.dtype, len(array)) for array in arrays] if arrays else [(np.dtype(dtype), int(length or 0))]
        self._specs = specs
        self._hashers = [digest_hasher(kind, (size,)) for kind, size in specs]
        self._part, self._fed = 0, 0  # the array being fed, and its elements fed so far
        self._error: BaseException | None = None
        self._queue: queue.SimpleQueue[tuple[int, np.ndarray] | None] = queue.SimpleQueue()
        self._thread = threads.start(self._run, name="shardwise-digest")
        for array in arrays:
            self.feed(array)

    def _advance(self) -> None:
        while self._part < len(self._specs) and self._fed == self._specs[self._part][1]:
            self._part, self._fed = self._part + 1, 0

    def feed(self, piece: np.ndarray) -> None:
        """Hash ``piece`` next: the next elements of the array being fed, not modified afterwards (a view will do)."""
        piece = np.asarray(piece)
        if piece.ndim == 1 and piece.size == 0:
            return  # nothing to hash (an empty array's digest is its dtype and shape)
        self._advance()
        kind, size = self._specs[self._part] if self._part < len(self._specs) else (None, 0)
        if piece.dtype != kind or piece.ndim != 1 or self._fed + len(piece) > size:
            raise ValueError(
                f"piece should be the next 1-D {kind} elements of {size}, but got {piece.dtype} of shape "
                f"{piece.shape} after {self._fed}"
            )
        self._fed += len(piece)
        step = max(1, self._PIECE // max(piece.dtype.itemsize, 1))
        for first in range(0, len(piece), step):
            self._queue.put((self._part, piece[first : first + step]))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                part, piece = item
                try:
                    self._hashers[part].update(np.ascontiguousarray(piece).view(np.uint8).data)
                except BaseException as error:  # given back by result()
                    self._error = error

    def result(self) -> str:
        """The hex digests, once every element was fed and hashed."""
        self._advance()
        if self._part < len(self._specs):
            size = self._specs[self._part][1]
            raise ValueError(f"the digest of array {self._part} ({size} elements) was fed {self._fed} of them")
        self._stop()
        if self._error is not None:
            raise self._error
        return "".join(hasher.hexdigest() for hasher in self._hashers)

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> BackgroundDigest:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._error = self._error or RuntimeError("stopped")
        self._stop()
