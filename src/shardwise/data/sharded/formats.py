"""Shard file formats: sample counts and columns from metadata, rows from a local copy.

Parquet counts come from the footer (row-group metadata), Arrow IPC counts from the record-batch
headers (read in C++, never a Python loop over samples), WebDataset counts from the tar member
names (headers only: ``tarfile`` seeks over member bodies). pyarrow is an optional extra,
imported on first use with an install hint.
"""

from __future__ import annotations

import contextlib
import enum
import os
import tarfile
from collections.abc import Callable
from typing import IO, Any

import numpy as np

ARROW_MAGIC = b"ARROW1"
INSTALL_HINT = "install it with: pip install 'shardwise[sharded]'"


class Format(enum.Enum):
    """A shard file format."""

    PARQUET = "parquet"
    ARROW = "arrow"
    WEBDATASET = "webdataset"


SUFFIXES = {
    ".parquet": Format.PARQUET,
    ".pq": Format.PARQUET,
    ".arrow": Format.ARROW,
    ".feather": Format.ARROW,
    ".ipc": Format.ARROW,
    ".tar": Format.WEBDATASET,
}


class ShardError(RuntimeError):
    """A shard is missing, truncated or not in the format it claims: names the URL (and the sample)."""


def pyarrow() -> Any:
    """The ``pyarrow`` module, or an ImportError saying how to install it."""
    try:
        import pyarrow as pa
        import pyarrow.compute  # here, not on a worker's first take: forked workers inherit it
        import pyarrow.ipc
        import pyarrow.parquet  # loaded for pa.parquet below
    except ImportError as error:  # pragma: no cover - pyarrow is installed in the test environment
        raise ImportError(
            f"shardwise.data.sharded needs 'pyarrow' for Parquet and Arrow shards; {INSTALL_HINT}"
        ) from error
    return pa


def format_of(url: str) -> Format | None:
    """The format a URL's suffix names, or ``None``."""
    lower = url.lower()
    for suffix, fmt in SUFFIXES.items():
        if lower.endswith(suffix):
            return fmt
    return None


def sample_key(member: str) -> str:
    """The WebDataset sample key of a tar member: its path up to the first dot of its base name."""
    directory, _, base = member.rpartition("/")
    stem = base.split(".", 1)[0]
    return f"{directory}/{stem}" if directory else stem


def _arrow_reader(handle: IO[bytes]) -> Any:
    pa = pyarrow()
    head = handle.read(len(ARROW_MAGIC))
    handle.seek(0)
    return pa.ipc.open_file(handle) if head == ARROW_MAGIC else pa.ipc.open_stream(handle)


def _arrow_table(handle: IO[bytes]) -> Any:
    return _arrow_reader(handle).read_all()


def _tar_members(handle: IO[bytes]) -> dict[str, dict[str, tuple[int, int]]]:
    """``{key: {extension: (data offset, size)}}`` in tar order, from the member headers only."""
    samples: dict[str, dict[str, tuple[int, int]]] = {}
    with tarfile.open(fileobj=handle, mode="r:") as archive:
        for member in archive:
            if not member.isfile():
                continue
            key = sample_key(member.name)
            extension = member.name.rpartition("/")[2].split(".", 1)[1] if "." in member.name.rpartition("/")[2] else ""
            samples.setdefault(key, {})[extension] = (member.offset_data, member.size)
    return samples


def count_rows(handle: IO[bytes], fmt: Format) -> int:
    """Samples in one shard, from its metadata (``handle``: a seekable binary file, local or remote)."""
    return shard_facts(handle, fmt)[0]


def shard_facts(handle: IO[bytes], fmt: Format) -> tuple[int, list[str]]:
    """``(samples, column names)`` of one shard, from its metadata (one read of a Parquet footer).

    A WebDataset shard's "columns" are the member extensions of its first sample.
    """
    if fmt is Format.PARQUET:
        parquet = pyarrow().parquet.ParquetFile(handle)
        return int(parquet.metadata.num_rows), list(parquet.schema_arrow.names)
    if fmt is Format.ARROW:
        reader = _arrow_reader(handle)
        names = list(reader.schema.names)
        if hasattr(reader, "num_record_batches"):
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches)), names
        return sum(batch.num_rows for batch in reader), names
    members = _tar_members(handle)
    return len(members), sorted(next(iter(members.values()), {}))


def _as_values(column: Any, name: str) -> np.ndarray:
    """A column as int64 values: integers as they are, strings/binaries/lists by their lengths."""
    pa = pyarrow()
    kind = column.type
    if pa.types.is_integer(kind):
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
    compute = pa.compute
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.asarray(compute.utf8_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return np.asarray(compute.binary_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return np.asarray(compute.list_value_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)
    raise TypeError(
        f"column {name!r} should hold integers, strings, binaries or lists (their lengths are used), "
        f"but it holds {kind}"
    )


def read_column(handle: IO[bytes], fmt: Format, name: str) -> np.ndarray:
    """One column of a shard as int64 (a length or label column), reading only that column."""
    if fmt is Format.PARQUET:
        table = pyarrow().parquet.ParquetFile(handle).read(columns=[name])
    elif fmt is Format.ARROW:
        table = _arrow_table(handle).select([name])
    else:
        values = []
        for parts in _tar_members(handle).values():
            if name not in parts:
                raise KeyError(f"a sample has no member with extension {name!r}")
            offset, size = parts[name]
            handle.seek(offset)
            values.append(int(handle.read(size).decode().strip()))
        return np.asarray(values, dtype=np.int64)
    return _as_values(table.column(0).combine_chunks(), name)


def missing_columns(columns: list[str], names: list[str]) -> list[str]:
    """The names of ``columns`` that are not among a table's column ``names`` (``"a.b"``: a field of column ``a``)."""
    return [c for c in columns if c not in names and c.split(".", 1)[0] not in names]


def decode_pool() -> Any:
    """The memory pool a shard is decoded into for the cache: pyarrow's jemalloc pool where it has one, else ``None``
    (the default pool).

    Measured inside a cold epoch on 2 cores (docs/sharded.md), the node's decodes cost 1.9-2.2 CPU-s
    in the default pool (mimalloc) and ~0.8 in jemalloc; why was not established (decoded alone,
    the two cost about the same, and jemalloc takes more page faults). Only the decode's own buffers
    come from it (the table is written to the cache and freed): the process's default pool is left
    alone.
    """
    try:
        return pyarrow().jemalloc_memory_pool()
    except (NotImplementedError, AttributeError):  # a pyarrow built without it (Windows wheels)
        return None


def _readable(source: str | memoryview) -> Any:
    """What a Parquet reader opens: a path (memory-mapped by the reader), or an Arrow reader over the bytes."""
    pa = pyarrow()
    return source if isinstance(source, str) else pa.BufferReader(pa.py_buffer(source))


def _with_pool(parquet: Any, source: str | memoryview, pool: Any) -> None:
    """Give ``parquet`` (a ``ParquetFile``) a reader that allocates from ``pool``; on any failure keep its own.

    ``ParquetFile`` takes no pool: its reader, ``pyarrow._parquet.ParquetReader(memory_pool=...)``,
    does (private, present in every pyarrow this supports; anything else keeps the default pool). It
    opens the file with the footer ``parquet`` parsed already, not parsing it again.
    """
    try:
        from pyarrow._parquet import ParquetReader

        reader = ParquetReader(memory_pool=pool)
        reader.open(_readable(source), use_memory_map=True, metadata=parquet.metadata)
    except Exception:  # an optimisation only: the default reader reads the same rows
        return
    parquet.reader = reader


def _parquet_table(source: str | memoryview, columns: list[str] | None, pool: Any = None) -> Any:
    """A whole Parquet file (a path, memory-mapped, or its bytes) as a table of ``columns`` (``None``: all).

    Read through ``ParquetFile``, not ``parquet.read_table``: the latter goes through
    ``pyarrow.dataset``, whose import pulls in pandas: seconds and tens of MiB in every fresh
    DataLoader worker, each epoch (docs/benchmarks/sharded-sources.md, "the worker path"). ``ParquetFile.read``
    returns empty columns for names the file lacks, so they are refused here, as ``read_table``
    refuses them (a ``ValueError``).
    """
    parquet = pyarrow().parquet.ParquetFile(_readable(source), memory_map=True)
    if columns is not None:
        names = parquet.schema_arrow.names
        missing = missing_columns(columns, names)
        if missing:
            where = source if isinstance(source, str) else "the shard"
            raise ValueError(f"no column {missing[0]!r} in {where}; its columns are {names}")
    if pool is not None:
        _with_pool(parquet, source, pool)
    # One thread: a DataLoader worker is already one of a process per core; Arrow's thread pools in
    # every worker cost private memory and, on shards of a few row groups, time.
    return parquet.read(columns=columns, use_threads=False)


def decode_parquet(source: str | memoryview, output: str, columns: list[str] | None = None) -> None:
    """Write Parquet shard ``source``'s ``columns`` (``None``: all) to ``output`` as an uncompressed Arrow IPC file.

    ``source``: the shard's path, or its bytes (the node cache fetches a shard it keeps decoded into
    memory: ``ShardCache._make``). The node cache keeps this in the shard's place
    (``ShardedSource(decode="node")``): every worker then memory-maps the decoded columns instead of
    decoding the shard again. One record batch a shard when it fits (a column's offsets are 32-bit),
    so that rows are cut from numpy views of it; written whole, then synced (the cache renames it
    into place). Decoded into :func:`decode_pool`.
    """
    pa = pyarrow()
    table = _parquet_table(source, columns, decode_pool())
    with contextlib.suppress(pa.ArrowInvalid, pa.ArrowCapacityError):  # 2 GiB in a string column: a batch a row group
        table = table.combine_chunks()
    with open(output, "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        sink.flush()
        os.fsync(sink.fileno())


class ShardReader:
    """Random access to the rows of one local shard file (memory-mapped where the format allows).

    Args:
        path: a local file.
        fmt: its format.
        columns: the columns to return (Parquet, Arrow); ``None`` for all.
        output: a table's rows as dicts (Parquet, Arrow; ``rows.table_rows`` in an output
            format); default: ``Table.to_pylist``. WebDataset rows are bytes as read.
    """

    def __init__(self, path: str, fmt: Format, columns: list[str] | None = None,
                 output: Callable[[Any], list[dict[str, Any]]] | None = None) -> None:
        self.path, self.fmt, self.columns = path, fmt, columns
        self._convert: Callable[[Any], list[dict[str, Any]]] = output or (lambda table: table.to_pylist())
        self._reader: Callable[[int], dict[str, Any]]
        self.numeric: Any = None  # set by ShardedSource: the shard as numpy views (rows.NumericColumns), if it can be
        if fmt is Format.PARQUET:
            # Decoded whole, once: the locality-aware plan reads a shard's samples in random order
            # while its window is resident, so decoding a row group per sample would cost ~100x more.
            self._table = _parquet_table(path, columns)
            self._reader = self._arrow_row
        elif fmt is Format.ARROW:
            pa = pyarrow()
            self._file = pa.memory_map(path)
            table = _arrow_table(self._file)
            self._table = table.select(columns) if columns is not None else table
            self._reader = self._arrow_row
        else:
            with open(path, "rb") as handle:
                self._keys = list(_tar_members(handle).items())
            self._reader = self._tar_row

    def __len__(self) -> int:
        if self.fmt is not Format.WEBDATASET:
            return int(self._table.num_rows)
        return len(self._keys)

    def row(self, index: int) -> dict[str, Any]:
        """Row ``index`` of the shard as a dict (WebDataset: ``{"__key__": key, extension: bytes}``)."""
        return self._reader(index)

    def rows(self, indices: list[int]) -> list[dict[str, Any]]:
        """Rows ``indices`` of the shard, in that order: what ``[self.row(i) for i in indices]`` returns.

        Parquet, Arrow: one ``take`` and one conversion for all of them (a batch's rows of this
        shard), not a slice and a conversion per row. WebDataset: the file is opened once.
        """
        if self.fmt is not Format.WEBDATASET:
            return self._convert(self.take(indices))
        with open(self.path, "rb") as handle:
            return [self._tar_read(handle, index) for index in indices]

    @property
    def table(self) -> Any:
        """The decoded shard (Parquet, Arrow): a ``pyarrow.Table``."""
        return self._table

    def compact(self) -> None:
        """Parquet: one chunk a column (a shard of several row groups is copied once, the chunks freed)."""
        if self.fmt is Format.PARQUET and any(column.num_chunks > 1 for column in self._table.columns):
            self._table = self._table.combine_chunks()

    def take(self, indices: list[int]) -> Any:
        """Rows ``indices`` of a Parquet or Arrow shard as a ``pyarrow.Table`` (one ``take``), unconverted."""
        positions = np.asarray(indices, dtype=np.int64)
        # An Arrow array over the numpy buffer: pa.array() would import pandas (seconds per worker).
        pa = pyarrow()
        taken = pa.Array.from_buffers(pa.int64(), len(positions), [None, pa.py_buffer(positions)])
        return self._table.take(taken)

    def _arrow_row(self, index: int) -> dict[str, Any]:
        return self._convert(self._table.slice(index, 1))[0]

    def _tar_row(self, index: int) -> dict[str, Any]:
        # Opened per sample, not kept open: a reader dropped by a worker never leaks a file descriptor.
        with open(self.path, "rb") as handle:
            return self._tar_read(handle, index)

    def _tar_read(self, handle: IO[bytes], index: int) -> dict[str, Any]:
        key, parts = self._keys[index]
        row: dict[str, Any] = {"__key__": key}
        for extension, (offset, size) in parts.items():
            handle.seek(offset)
            row[extension] = handle.read(size)
        return row

    def close(self) -> None:
        """Release the file."""
        if self.fmt is Format.ARROW:
            self._file.close()
