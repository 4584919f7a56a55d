"""Rows of an Arrow table as Python values, numpy arrays or torch tensors: ``ShardedSource``'s ``output_format``.

The formats are HF ``datasets``' ``with_format`` types, with the same shapes:

- ``"python"``: what ``Table.to_pylist()`` gives (ints, floats, strings, lists of ints...);
- ``"numpy"``: a column of numbers gives numpy scalars (``np.int64``, ``np.float32``...), a column
  of lists of numbers (fixed or variable length) a 1-D ``np.ndarray`` per row;
- ``"torch"``: the same as ``torch.Tensor`` (0-d for numbers, 1-D for lists of numbers).

Other columns (strings, binaries, structs, nested lists) stay Python values in every format; a
missing value is ``None``, and a list holding a missing number a Python list. Arrays are fresh
copies, writable and owning their memory: a row never pins its decoded shard.

Each column of a batch is converted at once (one copy of its values' buffer); rows are then
views cut at the column's offsets, never a Python loop over elements. Cost: O(values in the batch).
A shard of only numbers and lists of numbers skips Arrow altogether per batch (:class:`NumericColumns`,
:func:`cut_rows`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from .formats import pyarrow


class OutputFormat(enum.Enum):
    """What a sample's values are: Python objects, numpy arrays or torch tensors (HF ``with_format`` types)."""

    PYTHON = "python"
    NUMPY = "numpy"
    TORCH = "torch"


def _numeric(pa: Any, kind: Any) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind))


def _values(pa: Any, array: Any) -> np.ndarray:
    """A numeric Arrow array (nulls filled) as a fresh, writable numpy array, read from its buffer.

    Not ``Array.to_numpy``: it imports pandas (seconds and tens of MiB in every fresh DataLoader
    worker, each epoch).
    """
    if pa.types.is_boolean(array.type):  # bit-packed, least significant bit first
        start, stop, data = array.offset, array.offset + len(array), array.buffers()[1]
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little") if data is not None else ()
        return np.array(bits[start:stop], dtype=bool)
    values: np.ndarray = _buffer(pa, array).copy()
    return values


def _buffer(pa: Any, array: Any) -> np.ndarray:
    """A non-boolean numeric Arrow array's values as a numpy view of its data buffer (nulls as stored)."""
    kind = array.type
    if pa.types.is_floating(kind):
        dtype = np.dtype(f"f{kind.bit_width // 8}")
    else:
        dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(kind) else 'u'}{kind.bit_width // 8}")
    data = array.buffers()[1]
    if data is None:  # an empty array may have no buffer
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype)[array.offset : array.offset + len(array)]


def _column(pa: Any, array: Any, output: OutputFormat) -> list[Any] | Any:
    """One column of ``n`` rows, as a sequence of ``n`` values in ``output``'s format."""
    kind = array.type
    values: Any
    if _numeric(pa, kind):
        values = _values(pa, array.fill_null(False if pa.types.is_boolean(kind) else 0) if array.null_count else array)
        values = values if output is OutputFormat.NUMPY else _torch(values)
        return _missing(array, values) if array.null_count else values
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if (is_list or pa.types.is_fixed_size_list(kind)) and _numeric(pa, kind.value_type):
        # offsets and values are the unsliced buffers' (flatten() would rebase them): row i is
        # values[offsets[i]:offsets[i + 1]]; cut once into views of one copy of the batch's values.
        if is_list:
            offsets = _values(pa, array.offsets).astype(np.int64, copy=False)
        else:
            offsets = np.arange(array.offset, array.offset + len(array) + 1, dtype=np.int64) * kind.list_size
        start, stop = int(offsets[0]), int(offsets[-1])
        child = array.values.slice(start, stop - start)
        if child.null_count == 0:  # else a list holds a missing number: Python lists, with None
            values = _values(pa, child)
            if output is OutputFormat.TORCH:
                values = _torch(values)
            cuts = (offsets - start).tolist()
            rows = [values[cuts[i]:cuts[i + 1]] for i in range(len(array))]
            return _missing(array, rows) if array.null_count else rows
    return array.to_pylist()


def _missing(array: Any, values: Any) -> list[Any]:
    """``values`` with ``None`` where ``array`` has a missing value."""
    valid = _values(pyarrow(), array.is_valid()).tolist()
    return [value if ok else None for value, ok in zip(values, valid, strict=True)]


def _torch(values: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(values)


def table_rows(table: Any, output: OutputFormat) -> list[dict[str, Any]]:
    """Every row of ``table`` (a ``pyarrow.Table``) as a dict of column name to value, in ``output``'s format."""
    if output is OutputFormat.PYTHON:
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows
    pa = pyarrow()
    names = table.column_names
    if not names:
        return [{} for _ in range(table.num_rows)]
    columns = [_column(pa, column.combine_chunks(), output) for column in table.columns]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


class UnconvertedTable(ValueError):
    """A table of :func:`tables_rows` whose rows would not convert: ``index`` says which (the cause is chained)."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


def tables_rows(tables: Sequence[Any], output: OutputFormat) -> list[dict[str, Any]]:
    """The rows of ``tables`` (``pyarrow.Table`` s), in order: one conversion when their schemas agree.

    Raises:
        UnconvertedTable: naming the first table whose rows would not convert.
    """
    if len(tables) > 1 and all(table.schema.equals(tables[0].schema) for table in tables):
        try:
            return table_rows(pyarrow().concat_tables(tables), output)
        except (ValueError, TypeError):  # a table's rows would not convert: say which, below
            pass
    rows: list[dict[str, Any]] = []
    for index, table in enumerate(tables):
        try:
            rows.extend(table_rows(table, output))
        except (ValueError, TypeError) as error:
            raise UnconvertedTable(index, error) from error
    return rows


class NumericColumns:
    """A decoded shard whose columns are all numbers or lists of numbers, as numpy views of its buffers.

    Rows are then cut straight from the buffers (:func:`cut_rows`: one index a number column, one
    slice a row of a list column): no Arrow ``take`` and no conversion per batch. Zero-copy: the
    views share the table's memory (Arrow keeps a memory map alive while a view of it lives, the
    file closed or not). :func:`numeric_columns` builds it, or returns ``None`` for other tables.
    """

    __slots__ = ("cells",)

    def __init__(self, names: list[str], columns: list[tuple[np.ndarray, np.ndarray | None]]) -> None:
        # (name, values, offsets or None) a column; offsets as a memoryview, whose items are Python
        # ints: a slice by them costs half a slice by numpy integers.
        self.cells: list[tuple[str, np.ndarray, memoryview | None]] = [
            (name, values, None if offsets is None else offsets.data)
            for name, (values, offsets) in zip(names, columns, strict=True)
        ]


def cut_rows(tables: Sequence[NumericColumns], indices: Sequence[int], output: OutputFormat) -> list[dict[str, Any]]:
    """Row ``indices[j]`` of ``tables[j]`` for each ``j`` (a batch across shards), as ``table_rows`` gives it in
    ``output`` (numpy or torch).

    One loop over the batch's rows, nothing built per shard: a batch reads a few rows of each of
    about ``window`` shards, and per-shard calls (a fancy index, ``tolist``: ~10 us a shard) cost
    more than the rows. Cost: ~0.6 us a row of two columns, plus the copy of its lists' values.
    """
    rows: list[dict[str, Any]] = []
    append = rows.append
    for table, index in zip(tables, indices, strict=True):
        row: dict[str, Any] = {}
        for name, values, offsets in table.cells:
            row[name] = values[index] if offsets is None else values[offsets[index] : offsets[index + 1]].copy()
        append(row)
    if output is OutputFormat.TORCH:
        for row in rows:
            for name, value in row.items():
                # a number: a 0-d tensor of its own (np.asarray of a numpy scalar is a fresh, writable 0-d array)
                row[name] = _torch(value if isinstance(value, np.ndarray) else np.asarray(value))
    return rows


def _view(pa: Any, array: Any) -> np.ndarray | None:
    """A numeric Arrow array without nulls as a numpy view of its buffer (``None``: booleans, nulls)."""
    kind = array.type
    if array.null_count or pa.types.is_boolean(kind) or not _numeric(pa, kind):
        return None
    return _buffer(pa, array)


def numeric_columns(table: Any) -> NumericColumns | None:
    """``table``'s columns as numpy views, if each is one chunk of numbers or lists of numbers, without nulls."""
    pa = pyarrow()
    columns: list[tuple[np.ndarray, np.ndarray | None]] = []
    for column in table.columns:
        if column.num_chunks != 1:  # views of one buffer a column (ShardReader.compact() makes it so)
            return None
        array = column.chunk(0)
        kind = array.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            if array.null_count:
                return None
            offsets, values = _view(pa, array.offsets), _view(pa, array.values)
            if offsets is None or values is None:
                return None
            columns.append((values, offsets))
            continue
        values = _view(pa, array)
        if values is None:
            return None
        columns.append((values, None))
    return NumericColumns(list(table.column_names), columns)
