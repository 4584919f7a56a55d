"""Full checksums of index files: the CRC-32 of every byte and the range of the values, read from the mapping.

Layer 1 of :mod:`shardwise.index.integrity` (what a build records in the manifest), and the full
check a node runs once per entry (:func:`full_crc`).
"""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._core import threads

CHUNK_BYTES = 1 << 24
"""Bytes read at a time by a full checksum (16 MiB)."""


# -- at build --------------------------------------------------------------------------------------
def _scan(path: Path, start: int, visit: Callable[[memoryview], None], stop: Callable[[], bool] | None = None) -> bool:
    """Call ``visit`` on ``CHUNK_BYTES`` pieces of the file from byte ``start``, mapped (no copy: 1.5x read()).

    Returns False if ``stop()`` became true before the end.
    """
    size = path.stat().st_size
    if size <= start:
        return True
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        whole = memoryview(mapped)
        try:
            for first in range(start, size, CHUNK_BYTES):
                if stop is not None and stop():
                    return False
                piece = whole[first : min(size, first + CHUNK_BYTES)]
                try:
                    visit(piece)
                finally:
                    piece.release()
        finally:
            whole.release()
    return True


def full_crc(path: Path, stop: Callable[[], bool] | None = None) -> int | None:
    """CRC-32 of every byte of ``path`` (``None`` if ``stop()`` became true before the end)."""
    crc = [0]

    def visit(piece: memoryview) -> None:
        crc[0] = zlib.crc32(piece, crc[0])

    return crc[0] if _scan(path, 0, visit, stop) else None


PARALLEL_BYTES = 1 << 26
"""Files from this size (64 MiB) are checksummed by a second thread while the first reads their value range."""


def describe_file(path: Path, header: int, dtype: np.dtype[Any]) -> dict[str, Any]:
    """The full CRC-32 of a ``.npy`` file and the range of the values it holds (chunked passes over the mapping).

    Returns ``{"crc32": int}`` plus ``"min"``, ``"max"`` for integer and floating dtypes (and
    ``"nan"``: whether a float array holds a NaN). Private memory: O(1) (the file is mapped). The
    CRC-32 and the range are two passes that both release the GIL: from ``PARALLEL_BYTES`` on, the
    CRC-32 runs in a thread beside the range (two cores: the time of one pass).
    """
    with open(path, "rb") as file:
        crc = zlib.crc32(file.read(header))
    numeric = dtype.kind in "iuf" and dtype.isnative and dtype.itemsize > 0 and CHUNK_BYTES % dtype.itemsize == 0
    state: dict[str, Any] = {"crc": crc, "min": None, "max": None, "nan": False}

    def checksum(piece: memoryview) -> None:
        state["crc"] = zlib.crc32(piece, state["crc"])

    def value_range(piece: memoryview) -> None:
        values = np.frombuffer(piece, dtype=dtype, count=len(piece) // dtype.itemsize)
        if dtype.kind == "f":
            finite = ~np.isnan(values)
            state["nan"] = state["nan"] or not bool(finite.all())
            values = values[finite]
        if values.size:
            low, high = values.min().item(), values.max().item()
            state["min"] = low if state["min"] is None else min(state["min"], low)
            state["max"] = high if state["max"] is None else max(state["max"], high)
        del values

    if not numeric:
        _scan(path, header, checksum)
    elif path.stat().st_size < PARALLEL_BYTES:

        def both(piece: memoryview) -> None:
            checksum(piece)
            value_range(piece)

        _scan(path, header, both)
    else:
        failed: list[BaseException] = []

        def crc_pass() -> None:
            try:
                _scan(path, header, checksum)
            except BaseException as error:  # given back below
                failed.append(error)

        thread = threads.start(crc_pass, name="shardwise-describe")
        try:
            _scan(path, header, value_range)
        finally:
            thread.join()
        if failed:
            raise failed[0]
    info: dict[str, Any] = {"crc32": state["crc"]}
    if numeric:
        info.update(min=state["min"], max=state["max"], nan=state["nan"])
    return info
