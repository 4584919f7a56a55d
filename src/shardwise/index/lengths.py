"""Lengths as samplers take them: one validated input (:class:`LengthsInput`) and its shared length index.

:class:`LengthsInput` is the one step from whatever a user passes as ``lengths`` (a list, a numpy
array or memory map, a ``RaggedArray``, a ``pyarrow`` array, an HF ``dataset["column"]``, a
column of Parquet files through ``shardwise.column``) to what samplers read: a 1-D integer array
used as is (or a store's offsets, read a slice at a time), checked once, with its identity for
the index cache. Samplers take that object and never look at the raw input again.

The length index, kind ``"length-order"``: ``order.npy`` holds the sample indices sorted by length
(stable: equal lengths in increasing index order), ``order_offsets.npy`` the ``(max_length + 2,)``
offsets of every length value, so the samples of length ``L`` are ``order[offsets[L]:offsets[L + 1]]``.
About 4 bytes a sample (8 above 2**32 samples) plus 8 bytes a length value.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._core.arrays import check_non_negative_integers, one_dimensional
from .._core.errors import check_path
from .builders import MAX_KEYS, OffsetLengths, order_by_key
from .cache import DEFAULT_TIMEOUT, CacheDir, build_or_open
from .grouped import GroupedIndex
from .inputs import held_in, input_array
from .keys import file_position, key_of, ragged_key

_DIGEST_BLOCKS, _DIGEST_BLOCK = 16, 256  # lengths read for a fingerprint's digest: 16 runs of 256

LENGTH_KIND = "length-order"
STORE_INDEX = "index"
"""The directory inside a ragged store that holds its indexes (written by ``RaggedWriter``)."""


def is_ragged_store(values: Any) -> bool:
    """Whether ``values`` looks like a ``RaggedArray`` (``offsets``, ``manifest`` and ``path``)."""
    return all(hasattr(values, name) for name in ("offsets", "manifest", "path")) and isinstance(
        getattr(values, "manifest", None), dict
    )


def store_index_dir(store_path: str | os.PathLike[str]) -> Path:
    """Where a ragged store keeps its indexes: ``<store>/index``."""
    return Path(check_path("store_path", store_path)) / STORE_INDEX


def _store_cache_dir(store: Any) -> Path | None:
    """The store's own index directory if it exists or can be created there, else ``None`` (default cache)."""
    directory = store_index_dir(store.path)
    if directory.is_dir() or os.access(store.path, os.W_OK | os.X_OK):
        return directory
    return None


class LengthsInput:
    """One ``lengths`` input, resolved and checked once: what every sampler that takes lengths reads.

    Build it with :meth:`of` (a ``LengthsInput`` given again is returned as is). What it holds:

    - :attr:`values`: the lengths as a 1-D integer array that supports ``len`` and slicing: the
      numpy array or memory map given (never copied: a memory map stays one, so its cache key
      is O(1)), the row lengths of a ``pyarrow`` array or HF column (from the Arrow offsets, one
      pass, cached per node), or, for a ``RaggedArray``, :class:`OffsetLengths` over its offsets;
    - :attr:`store`: the ``RaggedArray`` given, else ``None``;
    - :attr:`key`: its identity for the index cache (:func:`~shardwise.index.key_of`: a store's
      own checksum, a memory map's file identity, else a hash of the bytes), computed when first
      asked for;
    - :meth:`value_range`: the smallest and largest length, checked non-negative, computed once
      when first asked for (a pass over the values: the index build checks them itself, so a
      warm start over 1e9 lengths never scans them).

    Shape and dtype are checked at :meth:`of` (O(1)); values where they are read in full. Cost at
    1e9 lengths: the input itself (mapped or in memory), nothing more until an index is built.

    Example:
        >>> lengths = LengthsInput.of([5, 1, 3])
        >>> len(lengths), lengths.value_range(), lengths.compact().dtype.name
        (3, (1, 5), 'uint16')
    """

    __slots__ = ("_key", "_range", "store", "values")

    def __init__(self, values: Any, store: Any = None) -> None:
        self.values, self.store = values, store
        self._key: str | None = None
        self._range: tuple[int, int] | None = None

    @classmethod
    def of(cls, lengths: object, *, allow_empty: bool = False) -> LengthsInput:
        """``lengths`` as one checked input, or raise naming ``lengths`` (``TypeError``/``ValueError``).

        Args:
            lengths: a 1-D integer sequence, numpy array or memory map, CPU tensor, ``RaggedArray``,
                ``pyarrow`` Array/ChunkedArray (list/string rows: their lengths), HF
                ``dataset["column"]``, or a ``LengthsInput`` (returned as is). A whole HF
                ``Dataset`` is refused with the one-line fix (which column?).
            allow_empty: accept no lengths at all (the index functions do; samplers do not).
        """
        if isinstance(lengths, LengthsInput):
            return lengths
        if is_ragged_store(lengths):
            return cls(OffsetLengths(lengths.offsets), store=lengths)  # type: ignore[attr-defined]
        # a pyarrow Array/ChunkedArray or HF column: its row lengths, from the offsets
        array = input_array("lengths", lengths, sequence_of="integers", one="length", kinds="iu",
                            holds="integers (token counts)", allow_empty=allow_empty)  # fmt: skip
        return cls(array)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def size(self) -> int:
        """The number of samples."""
        return len(self.values)

    @property
    def mapped(self) -> bool:
        """Whether the lengths live in a file (a memory map or a store): their key is O(1), their index shared."""
        return self.store is not None or isinstance(self.values, np.memmap)

    @property
    def key(self) -> str:
        """The cache key of these lengths (a store's checksum, a memory map's file identity, else a full hash)."""
        if self._key is None:
            self._key = ragged_key(self.store.manifest) if self.store is not None else key_of(self.values)
        return self._key

    def value_range(self) -> tuple[int, int]:
        """The smallest and largest length, after checking that every one is a non-negative integer (once)."""
        if self._range is None:
            if self.size == 0:
                one_dimensional("lengths", self.values, sequence_of="integers", one="length")  # raises: empty
            self._range = check_non_negative_integers(
                "lengths", self.read(0, self.size), holds="integers (token counts)", noun="integers"
            )
        return self._range

    def read(self, first: int, stop: int) -> np.ndarray:
        """The lengths of samples ``first .. stop - 1`` (a view of an array, a slice of a store's offsets)."""
        return np.asarray(self.values[first:stop])

    def length_of(self, index: int) -> int:
        """The length of one sample."""
        return int(self.values[index : index + 1][0])

    def compact(self) -> np.ndarray:
        """A private copy in the narrowest of uint16, uint32, int64 that holds every length (checked)."""
        _, high = self.value_range()
        dtype = np.uint16 if high < 2**16 else np.uint32 if high < 2**32 else np.int64
        return np.array(self.read(0, self.size), dtype=dtype)

    def private_index(self) -> GroupedIndex:
        """The length index in private memory (no cache): for small inputs, milliseconds and a few MiB."""
        _, high = self.value_range()
        if high >= MAX_KEYS:
            values = self.read(0, self.size)
            raise ValueError(
                f"lengths should hold integers below 2**27 to be bucketed without a sort_window, but got lengths"
                f"[{int(np.argmax(values))}]={high}; pass a sort_window to sort them per epoch instead"
            )
        compact = self.read(0, self.size).astype(np.int64, copy=False)
        offsets = np.zeros(high + 2, dtype=np.int64)
        np.cumsum(np.bincount(compact, minlength=high + 1), out=offsets[1:])
        return GroupedIndex(np.argsort(compact, kind="stable"), offsets)

    def shared_index(self, *, cache_dir: CacheDir = None, timeout: float = DEFAULT_TIMEOUT) -> GroupedIndex:
        """The node's shared length index of these lengths, built once (a chunked counting sort), then mapped.

        ``cache_dir``: see :func:`~shardwise.index.build_or_open`; for a ragged store ``None`` means
        the store's own ``index/`` directory (the default cache if the store is read-only and has none).
        """
        if self.store is not None and cache_dir is None:
            cache_dir = _store_cache_dir(self.store)
        values = self.values

        def build(directory: Path) -> None:
            order_by_key(values, directory, name="order", param="lengths")

        arrays = build_or_open(LENGTH_KIND, self.key, build, cache_dir=cache_dir, timeout=timeout)
        return GroupedIndex(arrays["order"], arrays["order_offsets"])

    def digest(self, index: GroupedIndex) -> str:
        """A short digest of the lengths for a state's fingerprint, O(distinct lengths), whatever n.

        It covers the number of samples, how many have each length (``index``'s offsets) and the
        lengths in 16 evenly spaced blocks of 256: other data is refused on resume, without a pass
        over 1e9 lengths at every start (the index key already tracks the input's identity).
        """
        n = len(index)
        hasher = hashlib.blake2b(f"lengths:{n}".encode(), digest_size=8)
        hasher.update(np.ascontiguousarray(index.offsets, dtype=np.int64).tobytes())
        span = min(n, _DIGEST_BLOCK)
        for first in sorted({(n - span) * k // (_DIGEST_BLOCKS - 1) for k in range(_DIGEST_BLOCKS)}):
            block = self.read(first, first + span)  # a few pages each, wherever the lengths live
            hasher.update(np.ascontiguousarray(block, dtype=np.int64).tobytes())
        return hasher.hexdigest()

    def __repr__(self) -> str:
        where = "a ragged store" if self.store is not None else held_in(self.values)
        return f"LengthsInput(<{self.size} lengths in {where}>)"

    def __getstate__(self) -> dict[str, Any]:
        # A memory map travels by location (path, dtype, shape, offset), not 8 bytes a sample:
        # ddp_spawn ranks and DataLoader workers map the same shared file.
        values: Any = self.values
        if isinstance(values, np.memmap) and values.flags.c_contiguous:
            where = file_position(values)
            if where is not None:
                values = _Mapped(where[0], values.dtype.str, values.shape, where[-1])
        return {"values": values, "store": self.store, "_key": self._key, "_range": self._range}

    def __setstate__(self, state: dict[str, Any]) -> None:
        values = state["values"]
        self.values = values.open() if isinstance(values, _Mapped) else values
        self.store, self._key, self._range = state["store"], state["_key"], state["_range"]


class _Mapped:
    """Memory-mapped lengths by location: reopened (read-only) when a :class:`LengthsInput` is unpickled."""

    def __init__(self, path: str, dtype: str, shape: tuple[int, ...], offset: int) -> None:
        self.path, self.dtype, self.shape, self.offset = path, dtype, shape, offset

    def open(self) -> np.memmap:
        return np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r", offset=self.offset, shape=self.shape)


def length_index(lengths: Any, *, cache_dir: CacheDir = None, timeout: float = DEFAULT_TIMEOUT) -> GroupedIndex:
    """The shared :class:`GroupedIndex` of samples grouped by length (built once, then mapped).

    Args:
        lengths: ``(n,)`` non-negative integer lengths (an array or memory map, used as is), a
            ragged store (``RaggedArray``: lengths read from its offsets a slice at a time), or
            anything :meth:`LengthsInput.of` takes (a ``LengthsInput`` itself included).
        cache_dir: see :func:`~shardwise.index.build_or_open`; for a ragged store ``None`` means
            the store's own ``index/`` directory (the default cache if the store is read-only
            and has none).
        timeout: seconds to wait for another process building the same index.

    Raises:
        TypeError, ValueError: lengths that are not non-negative integers (naming ``lengths``).
    """
    return LengthsInput.of(lengths, allow_empty=True).shared_index(cache_dir=cache_dir, timeout=timeout)


def prebuild_store_index(store_path: str | os.PathLike[str], offsets: np.ndarray, manifest: dict[str, Any]) -> None:
    """Write a ragged store's length index into ``<store_path>/index`` (``RaggedWriter`` calls it)."""

    def build(directory: Path) -> None:
        order_by_key(OffsetLengths(offsets), directory, name="order", param="lengths")

    build_or_open(LENGTH_KIND, ragged_key(manifest), build, cache_dir=store_index_dir(store_path))
