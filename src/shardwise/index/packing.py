"""``PackedBatchSampler``'s shared index: the item index and the strata layouts, built once per node.

From :data:`SHARED_FROM` samples on, what the plan needs in O(n) lives in the node's index cache
(:func:`shardwise.index.build_or_open`), built by one process and memory-mapped by every rank
and worker:

- the **item index** (:func:`shared_index`): the samples grouped by length, which is the length
  index ``BucketBatchSampler`` uses too, or, when long samples are split, an index of pieces
  (kind ``"pack-pieces"``: a chunked counting sort, two passes over the lengths, O(chunk)
  private memory, :func:`~shardwise._core.packing.fill_pieces`);
- the **strata layouts** (:func:`shared_layouts`, kind ``"pack-layouts"``): every stratum's
  rows and batches (:func:`~shardwise._core.packing.stratum_layouts`), streamed to the files one
  stratum at a time, with a progress bar; :func:`read_layout` reads one stratum back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._core.arrays import check_non_negative_integers
from .._core.files import NpyWriter
from .._core.packing import (
    Balance,
    PieceIndex,
    StratumLayout,
    TooLong,
    class_phases,
    fast_build,
    fill_pieces,
    pack_histogram,
    piece_counts,
    strata_starts,
    stratum_histogram,
    stratum_layouts,
)
from .._core.packing.compiled import kernels
from .builders import index_dtype
from .cache import SHARED_FROM, CacheDir, build_or_open
from .grouped import GroupedIndex
from .integrity import read_checked
from .lengths import LENGTH_KIND, LengthsInput, length_index
from .progress import Progress
from .workers import build_workers, map_tasks

PIECES_KIND, LAYOUTS_KIND, RANGE_KIND = "pack-pieces", "pack-layouts", "lengths-range"


def lengths_array(values: Any) -> np.ndarray:
    """Lengths: a large numpy array (or memory map) as is (its values are checked by :func:`lengths_range`),
    anything else as a validated compact copy."""
    lengths = LengthsInput.of(values)  # any form a user passes, resolved and shape-checked in one step
    if isinstance(lengths.values, np.ndarray) and lengths.size >= SHARED_FROM:
        return lengths.values
    return lengths.compact()


def lengths_range(lengths: np.ndarray, key: str, cache_dir: CacheDir, timeout: float) -> tuple[int, int]:
    """The smallest and largest of large ``lengths``, checked once per node and input (kept in the index cache).

    The check (integers, non-negative) reads every value: a warm open reads two numbers instead,
    so another rank's start does not grow with n.

    Raises:
        TypeError, ValueError: a value is not a non-negative integer (naming ``lengths``).
    """

    def build(directory: Path) -> None:
        low, high = check_non_negative_integers("lengths", lengths, holds="integers (token counts)", noun="integers")
        np.save(directory / "range.npy", np.array([low, high], dtype=np.int64))

    arrays = build_or_open(RANGE_KIND, key, build, cache_dir=cache_dir, timeout=timeout)
    low, high = np.asarray(read_checked(arrays["range"], arrays["range"][:2])).tolist()
    return int(low), int(high)


def _missing(directory: Path) -> None:
    raise RuntimeError(
        "PackedBatchSampler's shared index is not in the cache (was it deleted?); build the sampler again "
        "from its lengths on this node"
    )


def _write_pieces(lengths: np.ndarray, max_len: int, directory: Path) -> None:
    """The piece index as files: ``sample``, ``start`` (narrow dtypes, written in place) and ``offsets``.

    Compiled (:mod:`~shardwise._core.packing.fast_build`, on threads) where numba is installed,
    else numpy a chunk at a time; the same bytes either way. Nothing is flushed here: the cache's
    manifest fsyncs every file once.
    """
    n = int(lengths.size)
    jit = kernels(n)
    with Progress(2 * n, f"indexing lengths into pieces of max_len={max_len} ({n:,} samples, 2 passes)") as progress:
        if jit is not None:
            threads = build_workers() + 1
            chunk_counts = fast_build.piece_counts(jit, lengths, max_len, threads, on_chunk=progress.update)
            counts = chunk_counts.sum(axis=0)
        else:
            counts = piece_counts(lengths, max_len, on_chunk=progress.update)
        items = int(counts.sum())
        longest = int(max(lengths.max(initial=0), 0))  # starts are below the longest sample
        sample = np.lib.format.open_memmap(directory / "sample.npy", mode="w+", dtype=index_dtype(n), shape=(items,))
        fast_build.allocate(directory / "sample.npy")  # written in full, scattered: its blocks reserved at once
        start = np.lib.format.open_memmap(directory / "start.npy", mode="w+", dtype=index_dtype(longest),
                                          shape=(items,))  # fmt: skip
        if jit is not None:
            fast_build.fill_pieces(jit, lengths, max_len, chunk_counts, sample, start, threads,
                                   on_chunk=progress.update)  # fmt: skip
        else:
            fill_pieces(lengths, max_len, counts, sample, start, on_chunk=progress.update)
        del sample, start
    np.save(directory / "offsets.npy", np.concatenate([[0], np.cumsum(counts.sum(axis=0))]).astype(np.int64))


def shared_index(lengths: np.ndarray | None, key: str, max_len: int, too_long: TooLong, split: bool,
                 cache_dir: CacheDir, timeout: float) -> PieceIndex:  # fmt: skip
    """The item index from the node's shared cache: the length index, or (``split``) an index of pieces.

    ``lengths=None`` reopens an entry built before (an unpickled sampler holds no lengths).
    """
    if split:

        def build(directory: Path) -> None:
            _write_pieces(lengths, max_len, directory)  # type: ignore[arg-type]

        arrays = build_or_open(PIECES_KIND, f"{key}|max_len={max_len}", build if lengths is not None else _missing,
                               cache_dir=cache_dir, timeout=timeout)  # fmt: skip
        return PieceIndex(arrays["sample"], arrays["start"], np.asarray(arrays["offsets"]), np.empty(0, np.int64))
    if lengths is not None:
        grouped = length_index(lengths, cache_dir=cache_dir, timeout=timeout)
    else:
        arrays = build_or_open(LENGTH_KIND, key, _missing, cache_dir=cache_dir, timeout=timeout)
        grouped = GroupedIndex(arrays["order"], arrays["order_offsets"])
    offsets = np.asarray(grouped.offsets, dtype=np.int64)
    if offsets.size < max_len + 2:  # no sample reaches max_len: empty classes up to it
        offsets = np.concatenate([offsets, np.full(max_len + 2 - offsets.size, offsets[-1], dtype=np.int64)])
    over = read_checked(grouped.order, grouped.order[int(offsets[max_len + 1]) :])
    skipped = np.sort(np.asarray(over, dtype=np.int64))
    return PieceIndex(grouped.order, None, offsets[: max_len + 2], skipped)


PARALLEL_FROM = 64
"""Strata from which the packing step of a layouts build uses more processes (below: ~0.5 s, not worth a start)."""
_TASK = 8  # strata per task handed to a process


def pack_strata(task: tuple[str, np.ndarray, int, int, int, np.ndarray]) -> list[int]:
    """Pack some strata into the ``slot_rows`` file, each at its slots; their row counts.

    ``task``: ``(path, counts, num_strata, max_len, first, starts)``: strata ``first`` on, one
    fewer than ``starts``, their slots ``starts[i]:starts[i + 1]`` (from
    :func:`~shardwise._core.packing.strata_starts`). Run by the building process and by worker
    processes (:func:`shardwise.index.workers.map_tasks`), each on its own strata.
    """
    path, counts, num_strata, max_len, first, starts = task
    slot_rows = np.load(path, mmap_mode="r+")
    phases = class_phases(counts.size)
    rows = []
    for i in range(starts.size - 1):
        histogram = stratum_histogram(counts, num_strata, first + i, phases)
        item_rows, num_rows = pack_histogram(histogram, max_len)
        slot_rows[starts[i] : starts[i + 1]] = item_rows
        rows.append(num_rows)
    return rows  # no flush: the pages are the file's (a shared map); the manifest fsyncs the file once


def write_layouts(directory: Path, counts: np.ndarray, num_strata: int, max_len: int, *,
                  rows_per_batch: int | None, tokens_per_batch: int | None, balance: Balance,
                  drop_short: bool) -> None:  # fmt: skip
    """Every stratum's layout as files, one stratum in memory at a time (slots stream to the file).

    Files: ``slot_rows`` (int32, stratum after stratum), ``batch_of_row`` (int32), ``batch_keys``,
    their ``slot_offsets``, ``row_offsets`` and ``batch_offsets`` per stratum, and ``carried``.
    Two steps: every stratum packed into rows, then the chain of strata dealing their rows into
    batches. Compiled where numba is installed (:func:`~shardwise._core.packing.compiled.kernels`:
    :func:`~shardwise._core.packing.fast_build.write_layouts`, the packing on threads, the chain
    alongside), else :func:`pack_strata` in pure Python, spread over
    :func:`~shardwise.index.workers.build_workers` more processes from :data:`PARALLEL_FROM`
    strata on, then the numpy chain. The same bytes either way.
    """
    firsts = strata_starts(counts, num_strata, class_phases(counts.size))
    jit = kernels(int(counts.sum()))
    if jit is not None and int(counts.max(initial=0)) * (num_strata + 1) < 2**62:  # the kernels' int64 bounds
        what = f"packing {num_strata:,} strata into rows of max_len={max_len} and dealing them into batches"
        threads = build_workers() + 1 if num_strata >= PARALLEL_FROM else 1
        with Progress(num_strata, f"{what} ({threads} threads)", unit="strata") as bar:
            fast_build.write_layouts(jit, directory, counts, num_strata, max_len, firsts=firsts,
                                     phases=class_phases(counts.size), rows_per_batch=rows_per_batch,
                                     tokens_per_batch=tokens_per_batch, attention=balance is Balance.ATTENTION,
                                     drop_short=drop_short, threads=threads, on_strata=bar.update)  # fmt: skip
        return
    path = directory / "slot_rows.npy"
    slot_rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(int(counts.sum()),))
    fast_build.allocate(path)
    workers = build_workers() if num_strata >= PARALLEL_FROM else 0
    what = f"packing {num_strata:,} strata into rows of max_len={max_len}"
    file = str(path)
    tasks = [(file, counts, num_strata, max_len, s, firsts[s : s + _TASK + 1]) for s in range(0, num_strata, _TASK)]
    with Progress(len(tasks), f"{what} ({workers + 1} processes)", unit="tasks") as bar:
        done = map_tasks(pack_strata, tasks, workers=workers, what=what, on_done=bar.update)
    num_rows = [rows for part in done for rows in part]

    def packed(stratum: int) -> tuple[np.ndarray, int]:
        return np.asarray(slot_rows[firsts[stratum] : firsts[stratum + 1]], dtype=np.int64), num_rows[stratum]

    layouts = stratum_layouts(counts, num_strata, max_len, rows_per_batch=rows_per_batch,
                              tokens_per_batch=tokens_per_batch, balance=balance, drop_short=drop_short,
                              packed=packed)  # fmt: skip
    sizes = np.zeros((4, num_strata), dtype=np.int64)
    with (
        NpyWriter(directory / "batch_of_row.npy", np.int32) as rows,
        NpyWriter(directory / "batch_keys.npy", np.int64) as keys,
        Progress(num_strata, f"dealing the rows of {num_strata:,} strata into batches", unit="strata") as bar,
    ):
        for stratum, layout in enumerate(layouts):  # stratum by stratum, front to back: one in memory
            rows.write(layout.batch_of_row)
            keys.write(layout.batch_keys)
            sizes[:, stratum] = (layout.slot_rows.size, layout.batch_of_row.size, layout.num_batches,
                                 layout.carried)  # fmt: skip
            bar.update(1)
    fast_build.write_sizes(directory, sizes)


def shared_layouts(config: str, counts: np.ndarray | None, num_strata: int, max_len: int, *,
                   rows_per_batch: int | None, tokens_per_batch: int | None, balance: Balance, drop_short: bool,
                   cache_dir: CacheDir, timeout: float) -> dict[str, np.ndarray]:  # fmt: skip
    """The strata layouts' files from the node's shared cache, built by :func:`write_layouts` if missing.

    ``config`` keys the entry (the lengths' key and every option of the plan); ``counts=None``
    reopens an entry built before (an unpickled sampler), and raises if it is missing.
    """

    def write(directory: Path) -> None:
        if counts is None:
            raise RuntimeError("PackedBatchSampler's stratum layouts are not in the cache; build the sampler again")
        write_layouts(directory, counts, num_strata, max_len, rows_per_batch=rows_per_batch,
                      tokens_per_batch=tokens_per_batch, balance=balance, drop_short=drop_short)  # fmt: skip

    return build_or_open(LAYOUTS_KIND, config, write, cache_dir=cache_dir, timeout=timeout)


def read_layout(arrays: dict[str, np.ndarray], stratum: int) -> StratumLayout:
    """Stratum ``stratum``'s layout from the files :func:`write_layouts` wrote (each read checked)."""

    def read(name: str, first: int, stop: int) -> np.ndarray:  # checked against the range built
        return np.asarray(read_checked(arrays[name], arrays[name][first:stop]), dtype=np.int64)

    slots, rows, batches = (read(f"{name}_offsets", stratum, stratum + 2) for name in ("slot", "row", "batch"))
    return StratumLayout(
        read("slot_rows", slots[0], slots[1]),
        read("batch_of_row", rows[0], rows[1]),
        read("batch_keys", batches[0], batches[1]),
        int(read("carried", stratum, stratum + 1)[0]),
    )
