"""The compiled build of a packing index (the ``fast`` extra): the piece index and the strata layouts, on threads.

What ``index/packing.py`` writes with numpy steps (and worker processes), written here by
the kernels of :mod:`.jit`, file for file and byte for byte the same. The kernels release the
GIL, so the build spreads them over threads of the building process (no process to start, no
second import of numba):

- :func:`write_pieces`: the piece index in two passes over the lengths, ``CHUNK`` samples a
  task: every chunk counted (in parallel), then every chunk written at its own cursors (the
  counts of the chunks before it), in parallel as well;
- :func:`write_layouts`: the strata packed in tasks of :data:`TASK` strata on the threads, and
  the chain of strata dealing their rows into batches in this thread, a range at a time as soon
  as its strata are packed. Files are written once (no page written twice, no flush between:
  the cache's manifest fsyncs every file once).

Private memory: O(chunk) and O(strata) (the per-stratum sizes), whatever the number of samples.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from ..files import NpyWriter
from ..offsets import offsets_from_counts
from ..threads import KernelThreads

CHUNK = 1 << 22
"""Samples per task of :func:`write_pieces` (16 MB of int32 lengths)."""
TASK = 16
"""Strata per packing task of :func:`write_layouts`."""
DEAL = 512
"""Strata per call of the chain kernel (its batch keys are buffered: O(DEAL * window / 8))."""


def _threads(threads: int) -> KernelThreads:
    """``threads`` threads besides this one, which waits or deals (one: this one alone, no pool)."""
    return KernelThreads(threads, name="shardwise-build")


def _chunk(lengths: np.ndarray, c: int) -> np.ndarray:
    """Chunk ``c`` of ``lengths``: a view of the map, or a native-order copy (the kernels read native integers)."""
    part = np.asarray(lengths[c * CHUNK : (c + 1) * CHUNK])
    return part if part.dtype.isnative else part.astype(part.dtype.newbyteorder("="))


def allocate(path: Path) -> None:
    """Reserve every block of a new (sparse) file at once, before it is written through a map (Linux ``fallocate``).

    A page of a file map first written into a hole allocates its block in the page fault: ~1 s
    for the 150,000 pages of a 600 MB index. Reserved up front, the faults are cheaper (0.7-1 s
    less at 1e8 samples on this machine). Where the platform or the file system cannot (no
    emulation: glibc's ``posix_fallocate`` would write every block), nothing happens.
    """
    if not sys.platform.startswith("linux"):  # pragma: no cover - other platforms
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):  # pragma: no cover - no libc symbol
        return
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    descriptor = os.open(path, os.O_RDWR)
    try:
        fallocate(descriptor, 0, 0, os.fstat(descriptor).st_size)  # -1 (unsupported): the pages allocate as before
    finally:
        os.close(descriptor)


def piece_counts(jit: ModuleType, lengths: np.ndarray, max_len: int, threads: int,
                 on_chunk: Callable[[int], None] | None = None) -> np.ndarray:  # fmt: skip
    """``(chunks, 2, max_len + 1)`` int64: :func:`~.pieces.piece_counts` of every ``CHUNK`` of ``lengths``."""
    chunks = max(1, -(-lengths.size // CHUNK))
    counts = np.zeros((chunks, 2, max_len + 1), dtype=np.int64)
    with _threads(threads) as pool:
        tasks = [pool.submit(jit.count_pieces, _chunk(lengths, c), max_len, counts[c]) for c in range(chunks)]
        for c, task in enumerate(tasks):
            task.result()
            if on_chunk is not None:
                on_chunk(min(CHUNK, lengths.size - c * CHUNK))
    return counts


def fill_pieces(jit: ModuleType, lengths: np.ndarray, max_len: int, counts: np.ndarray, sample: np.ndarray,
                start: np.ndarray, threads: int, on_chunk: Callable[[int], None] | None = None) -> None:  # fmt: skip
    """:func:`~.pieces.fill_pieces` with the per-chunk ``counts`` of :func:`piece_counts`: chunks in parallel."""
    total = counts.sum(axis=0)
    offsets = offsets_from_counts(total.sum(axis=0))
    before = np.cumsum(counts, axis=0) - counts  # each chunk's items of every class in the chunks before it
    sample, start = np.asarray(sample), np.asarray(start)  # plain views of the maps (what the kernels take)
    with _threads(threads) as pool:
        tasks = []
        for c in range(counts.shape[0]):
            short = offsets[:-1] + before[c, 0]
            pieces = offsets[:-1] + total[0] + before[c, 1]
            part = _chunk(lengths, c)
            tasks.append(pool.submit(jit.fill_pieces, part, c * CHUNK, max_len, sample, start, short, pieces))
        for c, task in enumerate(tasks):
            task.result()
            if on_chunk is not None:
                on_chunk(min(CHUNK, lengths.size - c * CHUNK))


def write_layouts(jit: ModuleType, directory: Path, counts: np.ndarray, num_strata: int, max_len: int, *,
                  firsts: np.ndarray, phases: np.ndarray, rows_per_batch: int | None, tokens_per_batch: int | None,
                  attention: bool, drop_short: bool, threads: int,
                  on_strata: Callable[[int], None] | None = None) -> None:  # fmt: skip
    """The files of ``index.packing.write_layouts``, by the compiled kernels.

    Args:
        firsts: :func:`~.strata.strata_starts` (every stratum's first slot).
        phases: :func:`~.strata.class_phases` of the classes.
        threads: threads that pack strata (this one deals them into batches meanwhile).
        on_strata: told of every range of strata dealt.
    """
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    phase = (phases % np.uint64(num_strata)).astype(np.int64)
    slot_file = np.lib.format.open_memmap(directory / "slot_rows.npy", mode="w+", dtype=np.int32,
                                          shape=(int(counts.sum()),))  # fmt: skip
    allocate(directory / "slot_rows.npy")
    slot_rows = np.asarray(slot_file)
    num_rows = np.zeros(num_strata, dtype=np.int64)
    rows = NpyWriter(directory / "batch_of_row.npy", np.int32)
    keys = NpyWriter(directory / "batch_keys.npy", np.int64)
    sizes = np.zeros((4, num_strata), dtype=np.int64)
    carry = np.zeros((2, max(rows_per_batch or 1, 1)), dtype=np.int64)
    handed = 0
    with _threads(threads) as pool, contextlib.closing(rows), contextlib.closing(keys):
        packed = [pool.submit(jit.pack_strata, counts, phase, num_strata, max_len, s, firsts[s : s + TASK], slot_rows,
                       num_rows[s : s + TASK]) for s in range(0, num_strata, TASK)]  # fmt: skip
        for first in range(0, num_strata, DEAL):  # the chain, a range at a time as soon as its strata are packed
            last = min(first + DEAL, num_strata)
            for task in packed[first // TASK : -(-last // TASK)]:
                task.result()
            row_buffer = np.empty(int(num_rows[first:last].sum()) + (last - first) * (rows_per_batch or 0),
                                  dtype=np.int32)  # fmt: skip
            key_buffer = np.empty(row_buffer.size, dtype=np.int64)  # a stratum has fewer batches than rows
            handed, written = jit.deal_strata(counts, phase, num_strata, max_len, first, last, slot_rows, firsts,
                                              num_rows, rows_per_batch or 0, tokens_per_batch or 0, attention,
                                              drop_short, carry, handed, row_buffer, 0, key_buffer,
                                              sizes[:, first:last])  # fmt: skip
            rows.write(row_buffer[: int(sizes[1, first:last].sum())])
            keys.write(key_buffer[:written])
            if on_strata is not None:
                on_strata(last - first)
    del slot_file, slot_rows
    write_sizes(directory, sizes)


def write_sizes(directory: Path, sizes: np.ndarray) -> None:
    """The layouts' per-stratum files from ``sizes`` ``(4, strata)``: slots, rows, batches, carried rows.

    ``slot_offsets``, ``row_offsets`` and ``batch_offsets`` (each stratum's first, then the total)
    and ``carried``; written the same way by the compiled build and the numpy one.
    """
    for name, size in zip(("slot_offsets", "row_offsets", "batch_offsets"), sizes[:3], strict=True):
        np.save(directory / f"{name}.npy", np.concatenate([[0], np.cumsum(size)]).astype(np.int64))
    np.save(directory / "carried.npy", sizes[3])
