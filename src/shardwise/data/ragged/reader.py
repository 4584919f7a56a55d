"""``RaggedArray``: the read-only, memory-mapped dataset over a store."""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..._core.arrays import as_array
from ..._core.errors import check_bool, check_iterable, check_path
from ..._core.files import sampled_crc
from .checks import CORRUPTED, check_file, check_offsets, layout, mmap, read_manifest
from .format import (
    CRC_CHUNK,
    MANIFEST,
    OFFSETS,
    VALUES,
    RaggedStoreError,
    check_dtype,
    check_feature_shape,
)
from .writer import RaggedWriter


class _WritableAlias:
    """The values mapping seen through ``__array_interface__`` as writable, only to hand it to torch.

    ``torch.from_numpy`` warns on a read-only array (torch has no read-only tensors) and the
    mapping is read-only on purpose. Tensors built on this alias share the mapped pages without
    a copy and without the warning; this object keeps the mapping alive as long as they live.
    """

    def __init__(self, base: np.ndarray[Any, Any]) -> None:
        self._base = base
        self.__array_interface__ = {
            "data": (base.ctypes.data, False),
            "shape": base.shape,
            "typestr": base.dtype.str,
            "version": 3,
        }



_OPEN_TRIES = 8


def _identity(path: Path) -> tuple[int, int] | None:
    """The directory's (device, inode): it changes when a writer renames a new store into place."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _file_identity(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


def _file_crc(file: Any, start: int, end: int) -> int:
    """CRC-32 of bytes ``[start, end)`` of an open binary file, read in ``CRC_CHUNK`` pieces into one buffer."""
    buffer = memoryview(bytearray(min(CRC_CHUNK, max(end - start, 1))))
    file.seek(start)
    crc, position = 0, start
    while position < end:
        count = file.readinto(buffer[: min(len(buffer), end - position)])
        if not count:
            break  # shorter than its stat said a moment ago: the CRC cannot match
        crc = zlib.crc32(buffer[:count], crc)
        position += count
    return crc


def _reopen(path: str, dtype: str | None, feature_shape: tuple[int, ...] | None) -> RaggedArray:
    return RaggedArray(path, dtype=dtype, feature_shape=feature_shape)


class RaggedArray(Dataset[np.ndarray[Any, Any]]):
    """A read-only dataset of N arrays of shapes ``(rows_i, *feature_shape)``, memory-mapped from disk.

    ``store[i]`` is a zero-copy numpy view of sample ``i`` (read-only); :meth:`tensor` is the same
    rows as a torch tensor, also without a copy; :attr:`lengths` is every sample's row count, read
    from the offsets alone (pass it to ``BucketBatchSampler``); ``__getitems__`` serves a whole
    batch of indices at once (PyTorch's DataLoader calls it). Pickling keeps only the path:
    DataLoader workers and spawned ranks reopen the mapping, so every process of a node shares
    one copy of the data in the page cache.

    Opening checks the manifest (format, version, fields), both ``.npy`` headers and file sizes,
    the offsets (start at 0, never decrease, end at ``total_rows``, CRC-32) and a CRC-32 of 16
    blocks of the values; anything wrong raises :class:`RaggedStoreError` naming it.
    :meth:`verify` checks every byte of the values.

    Args:
        path: a store directory written by :class:`RaggedWriter` or :meth:`write`.
        dtype: if given, the dtype the store must hold.
        feature_shape: if given, the row shape the store must hold.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        RaggedStoreError: ``path`` is not a complete, intact store of this format version, or its
            dtype or feature shape is not the one asked for.

    Example:
        >>> import tempfile, numpy as np
        >>> path = tempfile.mkdtemp() + "/store"
        >>> store = RaggedArray.write(path, [np.ones((2, 3), np.float32), np.zeros((5, 3), np.float32)])
        >>> len(store), store.lengths.tolist(), store[1].shape, store.tensor(0).dtype
        (2, [2, 5], (5, 3), torch.float32)

    .. warning::
        Arrays and tensors from a store are views of a read-only mapping. The numpy views refuse
        writes, but torch has no read-only tensors: never modify a tensor from :meth:`tensor` or
        :meth:`tensors` in place (``t.add_(1)``, ``t[0] = 0``, ``t.numpy()[...] = ...``), the
        process is killed by SIGSEGV. ``t.clone()`` first; ``pad_collate`` already copies into a
        new tensor, so its batches are yours to modify.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: Any = None,
        feature_shape: Sequence[int] | None = None,
    ) -> None:
        self.path = Path(os.path.abspath(check_path("path", path)))
        asked_dtype = None if dtype is None else check_dtype("dtype", dtype)
        asked_shape = None if feature_shape is None else check_feature_shape(feature_shape)
        if not self.path.exists():
            raise FileNotFoundError(
                f"path should be a ragged store directory, but got path={str(self.path)!r}, which does not exist"
            )
        if not self.path.is_dir():
            raise NotADirectoryError(
                f"path should be a ragged store directory, but got path={str(self.path)!r}, which is a file"
            )
        # A writer with overwrite=True may replace the directory while this reads it file by file:
        # read again if it did, so manifest, offsets and values always come from one store.
        for attempt in range(_OPEN_TRIES):
            before = _identity(self.path)
            try:
                self._open(asked_dtype, asked_shape)
            except (OSError, ValueError):  # RaggedStoreError is a ValueError; mmap raises ValueError too
                if attempt + 1 == _OPEN_TRIES or _identity(self.path) == before:
                    raise
                continue
            if _identity(self.path) == before:
                break
        else:
            raise RaggedStoreError(f"the store at {self.path} was replaced {_OPEN_TRIES} times while opening it")

    def _open(self, asked_dtype: np.dtype[Any] | None, asked_shape: tuple[int, ...] | None) -> None:
        manifest = read_manifest(self.path)
        stored_dtype, stored_shape = layout(manifest, self.path / MANIFEST)
        num_samples: int = manifest["num_samples"]
        total_rows: int = manifest["total_rows"]
        if asked_dtype is not None and asked_dtype != stored_dtype:
            raise RaggedStoreError(
                f"the store at {self.path} holds dtype {stored_dtype}, but dtype={asked_dtype} was asked"
            )
        if asked_shape is not None and asked_shape != stored_shape:
            raise RaggedStoreError(
                f"the store at {self.path} holds rows of shape {stored_shape}, "
                f"but feature_shape={asked_shape} was asked"
            )
        values_shape = (total_rows, *stored_shape)
        values_info, offsets_info = manifest["files"][VALUES], manifest["files"][OFFSETS]
        check_file(self.path, VALUES, values_info, values_shape, stored_dtype)
        check_file(self.path, OFFSETS, offsets_info, (num_samples + 1,), np.dtype(np.int64))
        sampled = sampled_crc(self.path / VALUES, values_info["header_bytes"], values_info["bytes"])
        if sampled != values_info["sampled_crc32"]:
            raise RaggedStoreError(f"{self.path / VALUES} fails its sampled checksum: {CORRUPTED}")
        # What verify() compares later: the files this instance maps (a replaced file is another inode).
        self._files = {name: _file_identity(self.path / name) for name in (VALUES, OFFSETS)}
        offsets = mmap(self.path / OFFSETS, np.dtype(np.int64), (num_samples + 1,), offsets_info["header_bytes"])
        check_offsets(offsets, total_rows, self.path / OFFSETS)
        crc = 0
        for start in range(0, len(offsets), CRC_CHUNK // 8):
            crc = zlib.crc32(offsets[start : start + CRC_CHUNK // 8].data, crc)
        if crc != offsets_info["crc32"]:
            raise RaggedStoreError(f"{self.path / OFFSETS} fails its checksum: {CORRUPTED}")

        self._manifest = manifest
        self._dtype = stored_dtype
        self._feature_shape = stored_shape
        self._num_samples = num_samples
        self._total_rows = total_rows
        self._offsets = offsets  # (N + 1,) int64, read-only mapping
        if total_rows * stored_dtype.itemsize * math.prod(stored_shape):
            self._values = mmap(self.path / VALUES, stored_dtype, values_shape, values_info["header_bytes"])
            self._alias = np.asarray(_WritableAlias(self._values))
        else:  # nothing to map: mmap of zero bytes is refused
            self._values = np.empty(values_shape, stored_dtype)
            self._values.flags.writeable = False
            self._alias = np.empty(values_shape, stored_dtype)
        self._lengths: np.ndarray[Any, Any] | None = None

    @classmethod
    def write(
        cls,
        path: str | os.PathLike[str],
        samples: Iterable[Any],
        *,
        dtype: Any = None,
        feature_shape: Sequence[int] | None = None,
        overwrite: bool = False,
        progress: bool = False,
    ) -> RaggedArray:
        """Write ``samples`` (arrays or CPU tensors, ``(rows_i, *feature_shape)``) as a store and open it.

        Streams: one sample is in memory at a time. An exception while writing (a bad sample, or one
        raised by ``samples``) leaves ``path`` untouched. See :class:`RaggedWriter` for the arguments.

        Example:
            >>> import tempfile, numpy as np
            >>> path = tempfile.mkdtemp() + "/store"
            >>> RaggedArray.write(path, (np.full((n, 2), n, np.int16) for n in range(4))).total_rows
            6
        """
        check_iterable("samples", samples, of="arrays")
        check_bool("progress", progress)
        with RaggedWriter(path, dtype=dtype, feature_shape=feature_shape, overwrite=overwrite) as writer:
            writer.extend(samples, progress=progress)
        return cls(path)

    # -- description ---------------------------------------------------------------------------

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype of every sample."""
        return self._dtype

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """The shape of one row: sample ``i`` has shape ``(lengths[i], *feature_shape)``."""
        return self._feature_shape

    @property
    def total_rows(self) -> int:
        """Rows over all samples."""
        return self._total_rows

    @property
    def nbytes(self) -> int:
        """Bytes of sample data (the values without their header)."""
        return int(self._values.nbytes)

    @property
    def lengths(self) -> np.ndarray[Any, Any]:
        """Row count of every sample, ``(N,)`` int64, read-only, from the offsets alone."""
        if self._lengths is None:
            lengths = np.diff(self._offsets)
            lengths.flags.writeable = False
            self._lengths = lengths
        return self._lengths

    @property
    def offsets(self) -> np.ndarray[Any, Any]:
        """``(N + 1,)`` int64 row offsets: sample ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (read-only)."""
        return self._offsets

    @property
    def values(self) -> np.ndarray[Any, Any]:
        """Every row of every sample, ``(total_rows, *feature_shape)``, a read-only view of the mapping."""
        return self._values

    @property
    def data_fingerprint(self) -> str:
        """A digest of the manifest (sample count, sizes and CRC-32s of both files): a sampler's state records it."""
        text = json.dumps(self._manifest, sort_keys=True).encode()
        return hashlib.blake2b(text, digest_size=8).hexdigest()

    @property
    def manifest(self) -> dict[str, Any]:
        """The store's manifest, as read at open."""
        return json.loads(json.dumps(self._manifest))  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return self._num_samples

    def __repr__(self) -> str:
        return (
            f"RaggedArray({str(self.path)!r}, num_samples={self._num_samples}, total_rows={self._total_rows}, "
            f"dtype={self._dtype}, feature_shape={self._feature_shape})"
        )

    # -- reading -------------------------------------------------------------------------------

    def _bounds(self, index: object) -> tuple[int, int]:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(
                f"index should be an integer, but got index={index!r}; read a batch with store.__getitems__(indices)"
            )
        i = int(index)
        if not 0 <= i < self._num_samples:
            raise IndexError(self._range_message(i))
        return int(self._offsets[i]), int(self._offsets[i + 1])

    def _range_message(self, i: int) -> str:
        if self._num_samples == 0:
            return f"index {i} is out of range: the store at {self.path} is empty"
        kind = "negative indices are not accepted" if i < 0 else "past the end"
        return (
            f"index {i} is out of range for a store of {self._num_samples} samples (0..{self._num_samples - 1}; {kind})"
        )

    def _batch_bounds(self, indices: Any) -> tuple[list[int], list[int]]:
        idx = as_array("indices", indices, what="a 1-D sequence of integers")
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"indices should be a 1-D sequence of integers, but got indices={indices!r}")
        if idx.size:
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0:
                raise IndexError(self._range_message(lo))
            if hi >= self._num_samples:
                raise IndexError(self._range_message(hi))
        idx = idx.astype(np.int64, copy=False)
        return self._offsets[idx].tolist(), self._offsets[idx + 1].tolist()

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        """Sample ``index`` as a read-only numpy view of the mapping (no copy, no read until touched)."""
        start, end = self._bounds(index)
        return self._values[start:end]

    def __getitems__(self, indices: Sequence[int]) -> list[np.ndarray[Any, Any]]:
        """Samples ``indices`` as read-only numpy views, in order (PyTorch's batched fetch)."""
        starts, ends = self._batch_bounds(indices)
        values = self._values
        return [values[s:e] for s, e in zip(starts, ends, strict=True)]

    def tensor(self, index: int) -> torch.Tensor:
        """Sample ``index`` as a CPU tensor sharing the mapped pages: no copy; never modify it in place."""
        start, end = self._bounds(index)
        return torch.from_numpy(self._alias[start:end])

    def tensors(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """Samples ``indices`` as tensors sharing the mapped pages (see :meth:`tensor`)."""
        starts, ends = self._batch_bounds(indices)
        alias = self._alias
        return [torch.from_numpy(alias[s:e]) for s, e in zip(starts, ends, strict=True)]

    def __iter__(self) -> Iterator[np.ndarray[Any, Any]]:
        values, offsets = self._values, self._offsets
        for i in range(self._num_samples):
            yield values[int(offsets[i]) : int(offsets[i + 1])]

    def verify(self) -> None:
        """Check that the files are still the ones opened, at their written sizes, and the CRC-32 of every byte.

        Reads both files whole with plain reads (about a second per GiB from the page cache,
        disk speed otherwise; see docs/ragged-store.md), never through the mapping, so a file
        truncated since the store was opened raises here instead of killing the process with
        ``SIGBUS``. Opening checks sizes and a sample of 16 blocks; this checks everything.

        Raises:
            RaggedStoreError: a file was deleted, replaced, truncated or extended since the store
                was opened, or its bytes differ from what was written.
        """
        for name in (OFFSETS, VALUES):
            info = self._manifest["files"][name]
            path = self.path / name
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise RaggedStoreError(f"{path} was deleted since this store was opened") from None
            with os.fdopen(fd, "rb", buffering=0) as file:
                stat = os.fstat(fd)
                if (stat.st_dev, stat.st_ino) != self._files[name]:
                    raise RaggedStoreError(
                        f"{path} was replaced since this store was opened (another file is at that path now); "
                        "open the store again to read the new one"
                    )
                if stat.st_size != info["bytes"]:
                    change = "truncated" if stat.st_size < info["bytes"] else "extended"
                    raise RaggedStoreError(
                        f"{path} is {stat.st_size} bytes, but the manifest says {info['bytes']}: the file was "
                        f"{change} since this store was opened (reading a mapped page past its new end kills "
                        "the process with SIGBUS)"
                    )
                if _file_crc(file, info["header_bytes"], info["bytes"]) != info["crc32"]:
                    raise RaggedStoreError(f"{path} fails its checksum: {CORRUPTED}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The path, never the data: a worker or spawned rank maps the same files again.
        return (_reopen, (str(self.path), self._dtype.str, self._feature_shape))

