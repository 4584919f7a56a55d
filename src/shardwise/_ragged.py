"""``RaggedArray``: N variable-length arrays in one memory-mapped store that every process shares.

A store is a directory of three files that numpy alone can read::

    values.npy     (total_rows, *feature_shape)  every sample's rows, one after the other
    offsets.npy    (N + 1,) int64                 sample i is values[offsets[i]:offsets[i + 1]]
    manifest.json  format name and version, dtype, feature shape, N, total rows, file sizes, checksums

Both ``.npy`` files are opened with ``mmap``: the bytes live once in the operating system's page
cache, shared by every rank and DataLoader worker of the node, and only the pages a process
touches are ever read. Opening reads the manifest, the two ``.npy`` headers, the offsets
(8 bytes a sample) and 16 blocks of 4 KiB of the values, whatever the store's size.

:class:`RaggedWriter` builds a store from any iterable of arrays with bounded memory (one sample
at a time, offsets flushed every 65536 samples), in a temporary directory beside the target that
is renamed into place only once the manifest, written last, is on disk. A directory without a
manifest, or whose files disagree with it, never opens.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import tempfile
import weakref
import zlib
from collections.abc import Iterable, Iterator, Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ._errors import check_bool

FORMAT = "shardwise.ragged"
VERSION = 1
MANIFEST = "manifest.json"
VALUES = "values.npy"
OFFSETS = "offsets.npy"

SAMPLE_BLOCKS = 16
"""Blocks of the values file whose CRC-32 is checked at every open (evenly spaced, first and last included)."""
BLOCK_BYTES = 4096
_CRC_CHUNK = 1 << 24  # bytes read at a time by verify(), and offsets checked at a time at open
_OFFSET_BUFFER = 1 << 16  # offsets a writer holds before flushing them to disk
_NPY_ALIGN = 64
_MAX_ROWS_DIGITS = 9223372036854775807  # widest int64: reserves room in the header for any row count
_DTYPE_KINDS = "biufc"


class RaggedStoreError(ValueError):
    """A directory is not a readable ragged store: missing or truncated files, corruption, another format."""


def _check_dtype(name: str, value: object) -> np.dtype[Any]:
    """A numeric numpy dtype in native byte order (what ``torch.from_numpy`` accepts), or raise."""
    dtype: np.dtype[Any] | None
    try:
        dtype = np.dtype(value)  # type: ignore[call-overload]
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise TypeError(
            f"{name} should be a numeric numpy dtype (bool, integer, float or complex), but got {name}={value!r}"
        )
    if not dtype.isnative:
        raise TypeError(
            f"{name} should be in native byte order, but got {name}={dtype.str!r}; "
            f"convert with array.astype({dtype.newbyteorder('=').name!r})"
        )
    return dtype


def _check_feature_shape(value: object) -> tuple[int, ...]:
    ok = isinstance(value, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in value
    )
    if not ok:
        raise TypeError(
            f"feature_shape should be a tuple of non-negative integers (the shape of one row), "
            f"but got feature_shape={value!r}"
        )
    return tuple(int(d) for d in value)  # type: ignore[attr-defined]


def _npy_header(dtype: np.dtype[Any], shape: tuple[int, ...], size: int) -> bytes:
    """A version 1.0 ``.npy`` header of exactly ``size`` bytes (padded with spaces, as numpy pads)."""
    text = f"{{'descr': {np.lib.format.dtype_to_descr(dtype)!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    body = text.encode("latin1")
    padding = size - 10 - len(body) - 1
    if padding < 0:
        raise RuntimeError(f"npy header of {len(body)} bytes does not fit the {size} bytes reserved for it")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", size - 10) + body + b" " * padding + b"\n"


def _header_size(dtype: np.dtype[Any], feature_shape: tuple[int, ...]) -> int:
    """Bytes to reserve for a header whose leading dimension is not known yet (a multiple of 64, as numpy aligns)."""
    text = _npy_header(dtype, (_MAX_ROWS_DIGITS, *feature_shape), 1 << 16).rstrip(b" \n")
    needed = len(text) + 1
    return -(-needed // _NPY_ALIGN) * _NPY_ALIGN


def _sampled_crc(path: Path, start: int, end: int) -> int:
    """CRC-32 of ``SAMPLE_BLOCKS`` blocks of ``BLOCK_BYTES`` spread evenly over bytes ``[start, end)``."""
    span = end - start
    crc = 0
    with open(path, "rb") as file:
        if span <= SAMPLE_BLOCKS * BLOCK_BYTES:
            file.seek(start)
            return zlib.crc32(file.read(span))
        last = span - BLOCK_BYTES
        for k in range(SAMPLE_BLOCKS):
            file.seek(start + last * k // (SAMPLE_BLOCKS - 1))
            crc = zlib.crc32(file.read(BLOCK_BYTES), crc)
    return crc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_replaceable(path: Path) -> bool:
    """Whether ``overwrite=True`` may delete ``path``: an empty directory or a ragged store."""
    if not path.is_dir():
        return False
    if not any(path.iterdir()):
        return True
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def _check_target(path: Path, overwrite: bool) -> None:
    if not path.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace the store there")
    if not _is_replaceable(path):
        raise FileExistsError(
            f"{path} exists and is not a ragged store or an empty directory; overwrite=True only replaces those"
        )


class RaggedWriter:
    """Build a :class:`RaggedArray` store sample by sample, with bounded memory, atomically.

    Each :meth:`append` writes one sample's rows straight to disk; offsets are buffered 65536 at
    a time. Everything goes to a hidden temporary directory beside ``path`` (``.<name>.*.partial``);
    :meth:`close` writes the manifest last and renames the directory into place, so ``path``
    either does not exist or holds a complete store. Leaving the ``with`` block by an exception,
    or :meth:`abort`, deletes the temporary directory; a process killed mid-write leaves it
    behind without a manifest, and it never opens as a store (delete it).

    Args:
        path: directory to create.
        dtype: dtype every sample must have; default: the first sample's (numpy's default
            float64 for an empty store).
        feature_shape: shape of one row (a sample is ``(rows, *feature_shape)``); default: the
            first sample's (``()`` for an empty store).
        overwrite: replace an existing store (or empty directory) at ``path``; anything else there
            is never deleted.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False, or it is not a store.

    Example:
        >>> import tempfile, numpy as np
        >>> path = tempfile.mkdtemp() + "/store"
        >>> with RaggedWriter(path) as writer:
        ...     writer.append(np.zeros((3, 2), np.float32))
        ...     writer.append(np.ones((1, 2), np.float32))
        >>> RaggedArray(path).lengths.tolist()
        [3, 1]
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: Any = None,
        feature_shape: Sequence[int] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._dtype = None if dtype is None else _check_dtype("dtype", dtype)
        self._feature_shape = None if feature_shape is None else _check_feature_shape(feature_shape)
        self._dtype_source = "the dtype argument"
        self._shape_source = "the feature_shape argument"
        self.overwrite = check_bool("overwrite", overwrite)
        _check_target(self.path, self.overwrite)
        if not self.path.parent.is_dir():
            raise FileNotFoundError(f"cannot create {self.path}: its parent directory does not exist")
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".partial", dir=self.path.parent))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        self._values: Any = None
        self._offsets: Any = None
        self._values_header = 0
        self._offsets_header = 0
        self._values_crc = 0
        self._offsets_crc = 0
        self._buffer = np.empty(_OFFSET_BUFFER, dtype=np.int64)
        self._buffered = 0
        self._count = 0
        self._rows = 0
        self._row_bytes = 0
        self._closed = False

    @property
    def num_samples(self) -> int:
        """Samples appended so far."""
        return self._count

    @property
    def total_rows(self) -> int:
        """Rows appended so far, over all samples."""
        return self._rows

    def _start(self) -> None:
        """Open both files once dtype and feature shape are known, reserving room for their headers."""
        dtype = self._dtype if self._dtype is not None else np.dtype(np.float64)
        shape = self._feature_shape if self._feature_shape is not None else ()
        self._dtype, self._feature_shape = dtype, shape
        self._row_bytes = dtype.itemsize * math.prod(shape)
        self._values_header = _header_size(dtype, shape)
        self._offsets_header = _header_size(np.dtype(np.int64), ())
        self._values = open(self._tmp / VALUES, "wb")  # noqa: SIM115  (held open across appends)
        self._offsets = open(self._tmp / OFFSETS, "wb")  # noqa: SIM115
        self._values.write(b"\0" * self._values_header)
        self._offsets.write(b"\0" * self._offsets_header)
        self._push_offset(0)

    def _push_offset(self, offset: int) -> None:
        self._buffer[self._buffered] = offset
        self._buffered += 1
        if self._buffered == _OFFSET_BUFFER:
            self._flush_offsets()

    def _flush_offsets(self) -> None:
        chunk = self._buffer[: self._buffered].data.cast("B")
        self._offsets.write(chunk)
        self._offsets_crc = zlib.crc32(chunk, self._offsets_crc)
        self._buffered = 0

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this RaggedWriter for {self.path} is closed; open a new one to write again")

    def append(self, sample: Any) -> None:
        """Write one sample: an array (or CPU tensor) of shape ``(rows, *feature_shape)``, ``rows >= 0``.

        Raises:
            TypeError: its dtype differs from the store's.
            ValueError: it has no rows axis, or its feature shape differs from the store's.
        """
        self._check_open()
        index = self._count
        array = np.asarray(sample)
        if array.ndim == 0:
            raise ValueError(
                f"sample {index} is a scalar, but every sample needs a rows axis: shape (rows, *feature_shape)"
            )
        if self._dtype is None:
            self._dtype = _check_dtype(f"sample {index}'s dtype", array.dtype)
            self._dtype_source = f"sample {index}"
        if self._feature_shape is None:
            self._feature_shape = tuple(array.shape[1:])
            self._shape_source = f"sample {index}"
        if self._values is None:
            self._start()
        if array.dtype != self._dtype:
            raise TypeError(
                f"sample {index} has dtype {array.dtype}, but the store holds {self._dtype} (set by "
                f"{self._dtype_source}); convert it first, e.g. array.astype(np.{self._dtype.name})"
            )
        if array.shape[1:] != self._feature_shape:
            raise ValueError(
                f"sample {index} has shape {array.shape}, so feature shape {array.shape[1:]}, but the store "
                f"holds rows of shape {self._feature_shape} (set by {self._shape_source})"
            )
        if array.size:
            data = np.ascontiguousarray(array).reshape(-1).data.cast("B")
            self._values.write(data)
            self._values_crc = zlib.crc32(data, self._values_crc)
        self._rows += array.shape[0]
        self._count += 1
        self._push_offset(self._rows)

    def extend(self, samples: Iterable[Any], *, progress: bool = False) -> None:
        """:meth:`append` every sample of ``samples``; ``progress=True`` shows a tqdm bar (extra ``progress``)."""
        self._check_open()
        if check_bool("progress", progress):
            samples = _progress_bar(samples)
        for sample in samples:
            self.append(sample)

    def close(self) -> None:
        """Finish the store: headers, checksums, fsync, manifest last, then rename it into place."""
        self._check_open()
        if self._values is None:
            self._start()
        self._flush_offsets()
        dtype, feature_shape = self._dtype, self._feature_shape
        if dtype is None or feature_shape is None:
            raise RuntimeError("RaggedWriter._start did not set the dtype and feature shape")
        self._closed = True
        for file, header, file_dtype, shape in (
            (self._values, self._values_header, dtype, (self._rows, *feature_shape)),
            (self._offsets, self._offsets_header, np.dtype(np.int64), (self._count + 1,)),
        ):
            file.seek(0)
            file.write(_npy_header(file_dtype, shape, header))
            file.flush()
            os.fsync(file.fileno())
            file.close()
        values_bytes = self._values_header + self._rows * self._row_bytes
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": dtype.str,
            "feature_shape": list(feature_shape),
            "num_samples": self._count,
            "total_rows": self._rows,
            "files": {
                VALUES: {
                    "bytes": values_bytes,
                    "header_bytes": self._values_header,
                    "crc32": self._values_crc,
                    "sampled_crc32": _sampled_crc(self._tmp / VALUES, self._values_header, values_bytes),
                },
                OFFSETS: {
                    "bytes": self._offsets_header + 8 * (self._count + 1),
                    "header_bytes": self._offsets_header,
                    "crc32": self._offsets_crc,
                },
            },
        }
        with open(self._tmp / MANIFEST, "w") as file:
            json.dump(manifest, file, indent=2)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        _fsync_dir(self._tmp)
        self._publish()
        _fsync_dir(self.path.parent)

    def _publish(self) -> None:
        if not self.path.exists():
            os.rename(self._tmp, self.path)
            self._cleanup.detach()
            return
        _check_target(self.path, self.overwrite)
        old = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".old", dir=self.path.parent))
        os.rename(self.path, old / "store")
        os.rename(self._tmp, self.path)
        self._cleanup.detach()
        shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        """Stop writing and delete the temporary directory; ``path`` is left as it was."""
        if self._closed:
            return
        self._closed = True
        for file in (self._values, self._offsets):
            if file is not None:
                file.close()
        self._cleanup()

    def __enter__(self) -> RaggedWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"RaggedWriter({str(self.path)!r}, num_samples={self._count}, total_rows={self._rows}, {state})"


def _progress_bar(samples: Iterable[Any]) -> Iterable[Any]:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("progress=True needs 'tqdm'; install it with: pip install 'shardwise[progress]'") from None
    total = len(samples) if isinstance(samples, Sized) else None
    return tqdm(samples, total=total, unit="sample", desc="writing ragged store")  # type: ignore[no-any-return]


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


def _field(manifest: dict[str, Any], key: str, kind: type, where: Path) -> Any:
    value = manifest.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RaggedStoreError(f"{where} field {key!r} should be a {kind.__name__}, but got {key}={value!r}")
    return value


def _count(manifest: dict[str, Any], key: str, where: Path) -> int:
    value: int = _field(manifest, key, int, where)
    if value < 0:
        raise RaggedStoreError(f"{where} field {key!r} should be non-negative, but got {key}={value!r}")
    return value


def _read_header(path: Path, name: str, info: dict[str, Any]) -> tuple[int, tuple[int, ...], np.dtype[Any]]:
    """Parse a ``.npy`` header; return (header bytes, shape, dtype), checking its size against the manifest."""
    file_path = path / name
    if not file_path.is_file():
        raise RaggedStoreError(f"{name} is missing from the ragged store at {path}")
    size = file_path.stat().st_size
    try:
        with open(file_path, "rb") as file:
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
            header = file.tell()
    except (ValueError, OSError, SyntaxError) as error:
        raise RaggedStoreError(f"{file_path} is not a readable .npy file ({error})") from None
    if fortran:
        raise RaggedStoreError(f"{file_path} is in Fortran order; a ragged store's arrays are C-ordered")
    if header != info["header_bytes"]:
        raise RaggedStoreError(
            f"{file_path} has a {header}-byte header, but the manifest says {info['header_bytes']}: "
            "the file was replaced or corrupted"
        )
    if size != info["bytes"]:
        problem = "truncated" if size < info["bytes"] else "longer than written"
        raise RaggedStoreError(
            f"{file_path} is {size} bytes, but the manifest says {info['bytes']}: the file is {problem}"
        )
    return header, tuple(shape), dtype


def _file_info(files: Any, name: str, where: Path) -> dict[str, Any]:
    info = files.get(name) if isinstance(files, dict) else None
    if not isinstance(info, dict):
        raise RaggedStoreError(f"{where} has no entry for {name!r} under 'files'")
    for key in ("bytes", "header_bytes", "crc32"):
        _count(info, key, where)
    return info


def _mmap(path: Path, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int) -> np.ndarray[Any, Any]:
    """A read-only memory map of the array in ``path``, as a plain ndarray (views of it stay plain)."""
    return np.asarray(np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape))


def _check_offsets(offsets: np.ndarray[Any, Any], total_rows: int, where: Path) -> None:
    """Offsets start at 0, never decrease and end at total_rows; checked in bounded chunks."""
    if offsets[0] != 0:
        raise RaggedStoreError(f"{where} starts at {int(offsets[0])}, not 0: the file is corrupted")
    if offsets[-1] != total_rows:
        raise RaggedStoreError(
            f"{where} ends at {int(offsets[-1])}, but the store has total_rows={total_rows}: the file is corrupted"
        )
    step = _CRC_CHUNK // 8
    for start in range(0, len(offsets) - 1, step):
        chunk = offsets[start : start + step + 1]
        drops = np.flatnonzero(chunk[1:] < chunk[:-1])
        if drops.size:
            i = start + int(drops[0])
            raise RaggedStoreError(
                f"{where} decreases at sample {i} (offset {int(offsets[i])} then {int(offsets[i + 1])}): "
                "the file is corrupted"
            )


_CORRUPTED = "its bytes differ from what was written (the file is corrupted)"


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the store at ``path``, checked for format and version."""
    manifest_path = path / MANIFEST
    try:
        text = manifest_path.read_text()
    except FileNotFoundError:
        raise RaggedStoreError(
            f"{path} is not a finished ragged store: {MANIFEST} is missing (a write that did not "
            "finish leaves none; write the store again)"
        ) from None
    try:
        manifest = json.loads(text)
    except ValueError as error:
        raise RaggedStoreError(f"{manifest_path} is not valid JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise RaggedStoreError(f"{manifest_path} should hold a JSON object, but holds {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise RaggedStoreError(
            f"{manifest_path} has format={manifest.get('format')!r}, but RaggedArray reads format {FORMAT!r}"
        )
    if manifest.get("version") != VERSION:
        raise RaggedStoreError(
            f"{manifest_path} has version={manifest.get('version')!r}, but this shardwise reads version "
            f"{VERSION} of format {FORMAT!r}; open it with the shardwise release that wrote it, or write it again"
        )
    return manifest


def _layout(manifest: dict[str, Any], where: Path) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """Check every field of ``manifest``; return its dtype and feature shape."""
    try:
        dtype = _check_dtype("dtype", _field(manifest, "dtype", str, where))
        feature_shape = _check_feature_shape(_field(manifest, "feature_shape", list, where))
    except TypeError as error:
        raise RaggedStoreError(f"{where}: {error}") from None
    _count(manifest, "num_samples", where)
    _count(manifest, "total_rows", where)
    files = manifest.get("files")
    _count(_file_info(files, VALUES, where), "sampled_crc32", where)
    _file_info(files, OFFSETS, where)
    return dtype, feature_shape


def _check_file(path: Path, name: str, info: dict[str, Any], shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    """The ``.npy`` file ``name`` has the manifest's header size, total size, shape and dtype."""
    header, got_shape, got_dtype = _read_header(path, name, info)
    if got_shape != shape or got_dtype != dtype:
        raise RaggedStoreError(
            f"{path / name} holds {got_dtype} of shape {got_shape}, but the manifest says {dtype} "
            f"of shape {shape}: the file was replaced or corrupted"
        )
    if info["bytes"] != header + dtype.itemsize * math.prod(shape):
        raise RaggedStoreError(f"{path / MANIFEST} gives a size for {name} that does not match its shape")


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
        self.path = Path(os.path.abspath(os.fspath(path)))
        asked_dtype = None if dtype is None else _check_dtype("dtype", dtype)
        asked_shape = None if feature_shape is None else _check_feature_shape(feature_shape)
        if not self.path.exists():
            raise FileNotFoundError(f"no ragged store at {self.path}: the directory does not exist")
        if not self.path.is_dir():
            raise NotADirectoryError(f"{self.path} is a file; a ragged store is a directory")
        manifest = _read_manifest(self.path)
        stored_dtype, stored_shape = _layout(manifest, self.path / MANIFEST)
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
        _check_file(self.path, VALUES, values_info, values_shape, stored_dtype)
        _check_file(self.path, OFFSETS, offsets_info, (num_samples + 1,), np.dtype(np.int64))
        sampled = _sampled_crc(self.path / VALUES, values_info["header_bytes"], values_info["bytes"])
        if sampled != values_info["sampled_crc32"]:
            raise RaggedStoreError(f"{self.path / VALUES} fails its sampled checksum: {_CORRUPTED}")
        offsets = _mmap(self.path / OFFSETS, np.dtype(np.int64), (num_samples + 1,), offsets_info["header_bytes"])
        _check_offsets(offsets, total_rows, self.path / OFFSETS)
        crc = 0
        for start in range(0, len(offsets), _CRC_CHUNK // 8):
            crc = zlib.crc32(offsets[start : start + _CRC_CHUNK // 8].data, crc)
        if crc != offsets_info["crc32"]:
            raise RaggedStoreError(f"{self.path / OFFSETS} fails its checksum: {_CORRUPTED}")

        self._manifest = manifest
        self._dtype = stored_dtype
        self._feature_shape = stored_shape
        self._num_samples = num_samples
        self._total_rows = total_rows
        self._offsets = offsets  # (N + 1,) int64, read-only mapping
        if total_rows * stored_dtype.itemsize * math.prod(stored_shape):
            self._values = _mmap(self.path / VALUES, stored_dtype, values_shape, values_info["header_bytes"])
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
        idx = np.asarray(indices)
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
        """Check the CRC-32 of every byte of the values (reads the whole file; opening samples 16 blocks).

        Raises:
            RaggedStoreError: the values differ from what was written.
        """
        data = self._values.reshape(-1).view(np.uint8) if self._values.size else np.empty(0, np.uint8)
        crc = 0
        for start in range(0, data.size, _CRC_CHUNK):
            crc = zlib.crc32(data[start : start + _CRC_CHUNK].data, crc)
        if crc != self._manifest["files"][VALUES]["crc32"]:
            raise RaggedStoreError(f"{self.path / VALUES} fails its checksum: {_CORRUPTED}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The path, never the data: a worker or spawned rank maps the same files again.
        return (_reopen, (str(self.path), self._dtype.str, self._feature_shape))
