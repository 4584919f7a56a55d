"""A pass's first rows read from their shard's pieces, before the shard is whole (NOTE [ Head first ] in head.py).

A reader of a shard on its way to the cache asks :func:`early_rows`: rows whose row groups the
ledger records are read from the sparse file (:func:`read_rows`), rows promised but not in yet are
waited for (bounded), and any other row is left to the whole shard.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .formats import pyarrow
from .head import Ledger, groups_of, row_group_range, sparse_path

_POLL = 0.005  # seconds between two looks at a ledger by a reader waiting for promised pieces


def read_rows(final: Path, rows: Sequence[int], columns: list[str] | None, count: int) -> Any:
    """Rows ``rows`` (local numbers, in that order) of the shard cached as ``final``, from its pieces or its whole file.

    Returns a ``pyarrow.Table``, or ``None`` when the pieces do not hold them (yet). ``count``: the
    shard's samples as indexed (another count: ``ValueError``).
    """
    pa = pyarrow()
    whole = final.exists()
    path = final if whole else sparse_path(final)
    ledger = None if whole else Ledger.read(final)
    if ledger is None and not whole:
        return None
    try:
        parquet = pa.parquet.ParquetFile(str(path), memory_map=True)
    except (FileNotFoundError, OSError, ValueError):
        return None  # renamed into place, or evicted, meanwhile: the whole-shard path takes it from here
    metadata = parquet.metadata
    if metadata.num_rows != count:
        raise ValueError(f"it has {metadata.num_rows} samples, but its metadata says {count}")
    groups = groups_of(metadata, rows)
    if ledger is not None and not all(ledger.covers(*row_group_range(metadata, g)) for g in groups):
        return None
    table = parquet.read_row_groups(groups, columns=columns, use_threads=False)
    starts, at = {}, 0
    for group in range(metadata.num_row_groups):
        starts[group] = at
        at += metadata.row_group(group).num_rows
    # row r of group g is row (offset of g among the groups read) + (r - first row of g)
    offsets, at = {}, 0
    for group in groups:
        offsets[group] = at
        at += metadata.row_group(group).num_rows
    bounds = [starts[g] + metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    positions = []
    for row in rows:
        group = bisect.bisect_right(bounds, row)
        positions.append(offsets[group] + row - starts[group])
    index = np.asarray(positions, dtype=np.int64)
    return table.take(pa.Array.from_buffers(pa.int64(), len(index), [None, pa.py_buffer(index)]))


def early_rows(final: Path, derived: Path | None, rows: Sequence[int], columns: list[str] | None, count: int,
               timeout: float) -> Any:
    """Rows ``rows`` of a shard on its way to the cache (``final``: its downloaded name; ``derived``: the file made
    from it, if any), from its pieces, or, rows promised, from the downloaded file while ``derived`` is being made.

    Waits (at most ``timeout`` seconds) while a promise of this node holds ``rows`` and is not kept
    yet. Returns a ``pyarrow.Table``, or ``None``: open the shard whole (it is there, or the rows
    are not promised, or the pieces did not come).
    """
    deadline = time.monotonic() + timeout
    while True:
        if derived is not None and derived.exists():
            return None
        ledger = Ledger.read(final)
        promised = ledger is not None and ledger.promised.issuperset(rows)
        if final.exists():  # whole, not yet derived (or nothing to derive: read it whole)
            # Promised rows (a pass's first) are read from it while the derived file is made; others wait
            # for that file: read here, each batch would decode its rows' row groups (~100x the rows asked
            # for) while the one decode that serves them all is under way.
            return read_rows(final, rows, columns, count) if promised and derived is not None else None
        if ledger is None or not promised:
            return None
        if ledger.ranges:  # the footer is in (recorded first): the rows' row groups may be too
            table = read_rows(final, rows, columns, count)
            if table is not None:
                return table
        if ledger.settled or time.monotonic() > deadline:
            return None
        time.sleep(_POLL)
