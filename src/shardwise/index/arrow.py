"""Arrow inputs: a column of an HF ``datasets.Dataset``, a ``pyarrow`` array or a Parquet file as numpy.

:func:`column` turns a column into the 1-D numpy array samplers take (``lengths``, ``labels``,
``weights``), in one vectorised pass over the Arrow buffers, never a Python loop per row:

- ``kind="length"``: the length of each row of a list column (token ids) or of a string/binary
  column (in bytes), read from the Arrow offsets (``pyarrow.compute.list_value_length``,
  ``binary_length``); ``int32``, or ``int64`` for the ``large_`` types.
- ``kind="values"``: the values of a numeric or boolean column (labels, weights, a length column).

What is cached: a memory-mapped HF Dataset (``load_from_disk``, ``load_dataset``, ``map`` with a
cache) or Parquet files get an entry in the shared per-node index cache
(:func:`shardwise.index.build_or_open`, kind ``"arrow-column"``), keyed by the dataset's
fingerprint and its files' identity (path, size, modification time) or by the Parquet files'
identity, so the first process of a node computes it and the others map it (milliseconds); the
result is a read-only ``numpy.memmap``, whose sampler key is then O(1). An in-memory Dataset, a
``pyarrow.Table``, ``Array`` or ``ChunkedArray`` has no identity to key by: the result is computed
in this process (one pass; private memory: the result only, 4-8 bytes a row), or is a zero-copy
view of the Arrow buffer when the values are numeric, in one chunk and without nulls.

Rows follow the Dataset's logical order: a ``select``/``shuffle``/``train_test_split`` indices
mapping is applied chunk by chunk, and a ``with_format`` view reads the same Arrow table.
Cost at 1e9 rows: one pass over the offsets (seconds per 1e8 rows, one core), a 4-8 GB cache file
per column, private memory O(chunk) while building, O(1) once cached.

NOTE [ HF datasets private names ]: ``datasets.Dataset`` exposes no public accessor for its
indices mapping or its fingerprint; this module reads ``Dataset._indices`` (a table with one
``uint64`` column, or ``None``) and ``Dataset._fingerprint`` (a str), tested with datasets 5.2.0
(:data:`HF_PRIVATE`, their rows of ``shardwise._core.foreign.PRIVATE``; :func:`hf_private` checks them
with a message naming the fix).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._core.foreign import private, rows
from .cache import DEFAULT_TIMEOUT, CacheDir, build_or_open

__all__ = ["ARROW_KIND", "KINDS", "column", "hf_column", "hf_dataset", "hf_private", "is_arrow", "resolve"]

ARROW_KIND = "arrow-column"
"""The index cache kind of a cached column."""
KINDS = ("length", "values")
CHUNK = 1 << 20
"""Rows handled at a time: bounds the private memory of a build (a few MiB)."""
HF_PRIVATE = rows("datasets")
"""HF datasets' rows of the one table of foreign private names (``shardwise._core.foreign.PRIVATE``)."""

_INDICES = private("datasets", "_indices")
_FINGERPRINT = private("datasets", "_fingerprint")
_HINT = "install it with: pip install 'shardwise[arrow]'"


def _pa() -> tuple[Any, Any]:
    try:
        import pyarrow
        import pyarrow.compute
    except ImportError as error:
        raise ImportError(f"reading Arrow columns needs 'pyarrow'; {_HINT}") from error
    return pyarrow, pyarrow.compute


def is_arrow(values: object) -> bool:
    """True for a ``pyarrow`` Array/ChunkedArray (recognised without importing pyarrow)."""
    module = type(values).__module__ or ""
    return module.startswith("pyarrow") and hasattr(values, "type") and hasattr(values, "null_count")


def hf_dataset(values: object) -> bool:
    """True for an HF ``datasets.Dataset`` (recognised without importing datasets)."""
    module = type(values).__module__ or ""
    # a DatasetDict has column_names too, but a dict of them (one list per split)
    names = getattr(values, "column_names", None)
    return module.startswith("datasets") and hasattr(values, "data") and isinstance(names, list)


def hf_column(values: object) -> bool:
    """True for ``dataset["name"]`` of an HF Dataset (a lazy ``datasets.arrow_dataset.Column``)."""
    module = type(values).__module__ or ""
    source = getattr(values, "source", None)
    named = isinstance(getattr(values, "column_name", None), str)
    return module.startswith("datasets") and named and hf_dataset(source)


def hf_private(dataset: Any) -> tuple[Any, str]:
    """``(dataset._indices, dataset._fingerprint)``, or raise naming the missing name and the version to pin."""
    for row in HF_PRIVATE:
        if not hasattr(dataset, row.name):
            raise ImportError(
                f"shardwise reads Dataset.{row.name} of HF datasets (tested with datasets {row.tested}), which this "
                f"version lacks; install datasets=={row.tested}"
            )
    return getattr(dataset, _INDICES), str(getattr(dataset, _FINGERPRINT))


def resolve(name: str, values: object) -> object:
    """``values`` with a ``pyarrow`` Array/ChunkedArray or an HF ``dataset["name"]`` turned into numpy; else as is.

    Called by the samplers where they take an array (before the numpy checks of ``_core``): a
    list or string column gives its row lengths, a numeric one its values. An HF Dataset is
    refused with the one-line fix (it has many columns: which one?).
    """
    if is_arrow(values):
        return column(values, kind="length" if _is_sized(values.type) else "values")  # type: ignore[attr-defined]
    if hf_column(values):  # dataset["length"]: read from Arrow, not row by row through the Column
        dataset, name_ = values.source, values.column_name  # type: ignore[attr-defined]
        sized = _is_sized(dataset.data.table.schema.field(name_).type)
        return column(dataset, name_, kind="length" if sized else "values")
    if hf_dataset(values):
        raise TypeError(
            f"{name} should be an array, but got a datasets.Dataset with columns {list(values.column_names)}; "  # type: ignore[attr-defined]
            f"pass {name}=shardwise.column(dataset, 'input_ids', kind='length') (token counts) or "
            f"shardwise.column(dataset, 'label') (a column's values)"
        )
    return values


def column(
    source: Any,
    name: str | None = None,
    *,
    kind: str = "values",
    cache_dir: CacheDir = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> np.ndarray:
    """A column of an Arrow source as a read-only 1-D numpy array (row lengths or values).

    Args:
        source: an HF ``datasets.Dataset`` (memory-mapped or in memory, with any indices mapping
            or format) or one of its columns (``dataset["input_ids"]``, then ``name`` is ``None``),
            a ``shardwise.Mixture``/``ConcatDataset`` of Datasets (concatenated, in order), a
            ``pyarrow.Table``, a Parquet file's path (or a list of paths, concatenated), or a
            ``pyarrow`` Array/ChunkedArray (then ``name`` is ``None``).
        name: the column (required for a Dataset, a Table or Parquet files).
        kind: ``"length"`` for the length of each row of a list/string/binary column, ``"values"``
            for the values of a numeric or boolean column.
        cache_dir: the index cache directory (see :func:`shardwise.index.build_or_open`);
            ``False`` computes in this process.
        timeout: seconds to wait for another process that computes the same column.

    Returns:
        A read-only numpy array of one row per sample: a ``numpy.memmap`` of the node's cache
        for memory-mapped Datasets and Parquet files, else an array in this process.

    Raises:
        ValueError: the column is missing (the message lists the columns and the fix) or holds nulls.
        TypeError: the column's type does not fit ``kind``, or the source is not an Arrow source.

    Example:
        >>> import datasets  # doctest: +SKIP
        >>> data = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3], [4, 5, 6]]})  # doctest: +SKIP
        >>> shardwise.column(data, "input_ids", kind="length")  # doctest: +SKIP
        array([2, 1, 3], dtype=int32)
    """
    if kind not in KINDS:
        raise ValueError(f"kind should be one of {', '.join(map(repr, KINDS))}, but got kind={kind!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name should be a column name (a str) or None, but got name={name!r}")
    plan = _plan(source, name, kind)
    if plan.view is not None and plan.key is None:
        out = plan.view
    elif plan.key is None or cache_dir is False:
        out = np.empty(plan.rows, dtype=plan.dtype)
        plan.fill(out)
    else:

        def build(directory: Path) -> None:
            path = directory / "values.npy"
            target = np.lib.format.open_memmap(path, mode="w+", dtype=plan.dtype, shape=(plan.rows,))
            plan.fill(target, directory)
            target.flush()
            del target

        key = f"{plan.key}|column={name!r}|kind={kind}|rows={plan.rows}|dtype={plan.dtype.str}"
        out = build_or_open(ARROW_KIND, key, build, cache_dir=cache_dir, timeout=timeout)["values"]
    out.flags.writeable = False
    return out


# -- what to read, and how -------------------------------------------------------------------------
class _Plan:
    """How to fill the column: its rows, dtype, a cache key (None: no identity) and a chunked filler."""

    def __init__(self, rows: int, dtype: np.dtype[Any], key: str | None, fill: Callable[..., None]) -> None:
        self.rows, self.dtype, self.key, self._fill = rows, dtype, key, fill
        self.view: np.ndarray | None = None  # the values as a zero-copy view of one Arrow buffer, if they are one

    def fill(self, out: np.ndarray, scratch: Path | None = None) -> None:
        self._fill(out, scratch)


def _plan(source: Any, name: str | None, kind: str) -> _Plan:
    pa, _ = _pa()
    if isinstance(source, (pa.Array, pa.ChunkedArray)):
        if name is not None:
            raise TypeError(
                f"name should be None for a pyarrow {type(source).__name__} (it is one column), but got name={name!r}"
            )
        chunks = source.chunks if isinstance(source, pa.ChunkedArray) else [source]
        return _chunks_plan(chunks, source.type, len(source), kind, "the array", None)
    if hf_dataset(source):
        return _dataset_plan(source, _need(name, source), kind)
    if hf_column(source) and name is None:
        return _dataset_plan(source.source, source.column_name, kind)
    parts = getattr(source, "datasets", None)  # shardwise.Mixture, torch ConcatDataset
    if isinstance(parts, Sequence) and parts and all(hf_dataset(part) for part in parts):
        return _concat_plan([_dataset_plan(part, _need(name, part), kind) for part in parts])
    if isinstance(source, pa.Table):
        return _table_plan(source, _need(name, source), kind, None)
    paths = [source] if isinstance(source, (str, os.PathLike)) else source
    if isinstance(paths, (list, tuple)) and paths and all(isinstance(p, (str, os.PathLike)) for p in paths):
        return _parquet_plan(list(paths), _need(name, source), kind)
    raise TypeError(
        "source should be a datasets.Dataset, a Mixture of them, a pyarrow Table/Array/ChunkedArray or Parquet "
        f"file path(s), but got {type(source).__name__}"
        + ("; pick a split: dataset['train']" if hasattr(source, "keys") and hasattr(source, "num_rows") else "")
    )


def _need(name: str | None, source: object) -> str:
    if name is None:
        raise TypeError(f"name should be the column to read from {type(source).__name__}, but got name=None")
    return name


def _missing(name: str, names: list[str], where: str, kind: str) -> ValueError:
    fix = (
        "add one with dataset = dataset.map(lambda b: {'length': [len(x) for x in b['input_ids']]}, batched=True), "
        "or with Arrow: dataset.add_column('length', pyarrow.compute.list_value_length("
        "dataset.data.column('input_ids')).to_numpy())"
        if kind == "length" or name == "length"
        else "pass the name of an existing column"
    )
    return ValueError(f"column {name!r} is not in {where}, whose columns are {names}; {fix}")


def _is_sized(type_: Any) -> bool:
    pa, _ = _pa()
    t = pa.types
    return bool(
        t.is_list(type_) or t.is_large_list(type_) or t.is_fixed_size_list(type_) or t.is_string(type_)
        or t.is_large_string(type_) or t.is_binary(type_) or t.is_large_binary(type_)
        or (hasattr(t, "is_list_view") and (t.is_list_view(type_) or t.is_large_list_view(type_)))
    )  # fmt: skip


def _dtype(type_: Any, kind: str, where: str) -> np.dtype[Any]:
    pa, _ = _pa()
    t = pa.types
    if kind == "length":
        if not _is_sized(type_):
            raise TypeError(
                f"kind='length' reads list, string or binary columns, but {where} has type {type_}; "
                "pass kind='values' to read its values"
            )
        large = t.is_large_list(type_) or t.is_large_string(type_) or t.is_large_binary(type_)
        large = large or (hasattr(t, "is_large_list_view") and t.is_large_list_view(type_))
        return np.dtype(np.int64 if large else np.int32)
    if not (t.is_integer(type_) or t.is_floating(type_) or t.is_boolean(type_)):
        fix = (
            "; encode string labels as integers first: dataset = dataset.class_encode_column(name)"
            if t.is_string(type_) or t.is_large_string(type_) or t.is_dictionary(type_)
            else "; pass kind='length' for the length of each row"
            if _is_sized(type_)
            else ""
        )
        raise TypeError(f"kind='values' reads numeric or boolean columns, but {where} has type {type_}{fix}")
    dtype: np.dtype[Any] = np.dtype(type_.to_pandas_dtype())
    return dtype


def _convert(array: Any, kind: str, where: str, first_row: int) -> np.ndarray:
    """One Arrow array (a slice of at most CHUNK rows) as numpy: its row lengths or its values."""
    pa, pc = _pa()
    if array.null_count:
        row = first_row + int(pc.index(pc.is_null(array), True).as_py())
        raise ValueError(
            f"{where} should hold no nulls, but row {row} is null; fill them first, e.g. "
            "dataset = dataset.filter(lambda r: r[name] is not None)"
        )
    if kind == "values":
        return np.asarray(array.to_numpy(zero_copy_only=False))
    t = pa.types
    if t.is_fixed_size_list(array.type):
        return np.full(len(array), array.type.list_size)
    type_ = array.type
    if t.is_string(type_) or t.is_large_string(type_) or t.is_binary(type_) or t.is_large_binary(type_):
        return np.asarray(pc.binary_length(array).to_numpy(zero_copy_only=False))
    return np.asarray(pc.list_value_length(array).to_numpy(zero_copy_only=False))


def _fill_chunks(chunks: Any, kind: str, where: str, out: np.ndarray) -> None:
    position = 0
    for chunk in chunks:
        for start in range(0, len(chunk), CHUNK):
            piece = _convert(chunk.slice(start, CHUNK), kind, where, position)
            out[position : position + len(piece)] = piece
            position += len(piece)
    if position != len(out):
        raise RuntimeError(f"{where} yielded {position} rows, but {len(out)} were expected")


def _chunks_plan(chunks: Any, type_: Any, rows: int, kind: str, where: str, key: str | None) -> _Plan:
    dtype = _dtype(type_, kind, where)
    plan = _Plan(rows, dtype, key, lambda out, scratch: _fill_chunks(chunks, kind, where, out))
    if kind == "values" and len(chunks) == 1 and not chunks[0].null_count and dtype.kind in "iuf":
        plan.view = chunks[0].to_numpy(zero_copy_only=True)  # fixed-width, contiguous: no copy at all
    return plan


def _table_plan(table: Any, name: str, kind: str, key: str | None) -> _Plan:
    if name not in table.column_names:
        raise _missing(name, list(table.column_names), "the table", kind)
    col = table.column(name)
    return _chunks_plan(col.chunks, col.type, len(col), kind, f"column {name!r}", key)


def _file_identity(path: str) -> str:
    stat = os.stat(path)
    return f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"


def _dataset_plan(dataset: Any, name: str, kind: str) -> _Plan:
    indices, fingerprint = hf_private(dataset)
    if name not in dataset.column_names:
        raise _missing(name, list(dataset.column_names), "the dataset", kind)
    files = [entry["filename"] for entry in dataset.cache_files]
    table = dataset.data.table  # the whole Arrow table, before the indices mapping
    on_disk = bool(files) and _memory_mapped(dataset.data)
    key = f"hf:{fingerprint}:{','.join(_file_identity(f) for f in files)}" if on_disk else None
    base = _table_plan(table, name, kind, key)
    if indices is None:
        return base
    order = indices.column(0)  # uint64 rows of `table`, one per logical row

    def fill(out: np.ndarray, scratch: Path | None) -> None:
        if scratch is not None:  # build the table's column beside the entry, then gather (O(chunk) private)
            path = scratch / "table.tmp"
            whole: np.ndarray = np.lib.format.open_memmap(path, mode="w+", dtype=base.dtype, shape=(base.rows,))
        else:
            whole = np.empty(base.rows, dtype=base.dtype)
        base.fill(whole)
        position = 0
        for chunk in order.chunks:
            for start in range(0, len(chunk), CHUNK):
                rows = np.asarray(chunk.slice(start, CHUNK).to_numpy(zero_copy_only=False))
                out[position : position + len(rows)] = whole[rows]
                position += len(rows)
        del whole
        if scratch is not None:
            path.unlink()

    return _Plan(len(dataset), base.dtype, key, fill)


def _memory_mapped(table: Any) -> bool:
    """Every block of an HF table is memory-mapped from a file (nothing held only in memory)."""
    blocks = getattr(table, "blocks", None)
    if blocks is not None:  # ConcatenationTable: rows of tables
        return all(_memory_mapped(block) for row in blocks for block in row)
    return type(table).__name__ == "MemoryMappedTable"


def _concat_plan(plans: list[_Plan]) -> _Plan:
    dtypes = {plan.dtype for plan in plans}
    dtype = np.result_type(*dtypes)
    rows = sum(plan.rows for plan in plans)
    keys = [plan.key for plan in plans]
    key = "concat:" + ";".join(k for k in keys if k is not None) if all(k is not None for k in keys) else None

    def fill(out: np.ndarray, scratch: Path | None) -> None:
        position = 0
        for plan in plans:
            part = out[position : position + plan.rows]
            if plan.dtype != dtype:
                part = np.empty(plan.rows, dtype=plan.dtype)
            plan.fill(part, scratch)
            out[position : position + plan.rows] = part
            position += plan.rows

    return _Plan(rows, dtype, key, fill)


def _parquet_plan(paths: list[Any], name: str, kind: str) -> _Plan:
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(f"reading Parquet columns needs 'pyarrow'; {_HINT}") from error
    files = [os.fspath(path) for path in paths]
    for path in files:
        if not os.path.isfile(path):
            raise ValueError(f"source should be Parquet file paths, but {path!r} is not a file")
    schema = pq.read_schema(files[0])
    if name not in schema.names:
        raise _missing(name, list(schema.names), f"the Parquet file {files[0]!r}", kind)
    dtype = _dtype(schema.field(name).type, kind, f"column {name!r}")
    rows = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    key = "parquet:" + ",".join(_file_identity(path) for path in files)

    def fill(out: np.ndarray, scratch: Path | None) -> None:
        position = 0
        for path in files:  # one row group of one column at a time: O(row group) private memory
            reader = pq.ParquetFile(path)
            for group in range(reader.num_row_groups):
                col = reader.read_row_group(group, columns=[name]).column(0)
                count = len(col)
                _fill_chunks(col.chunks, kind, f"column {name!r} of {path!r}", out[position : position + count])
                position += count

    return _Plan(rows, dtype, key, fill)
