"""The packing index build: the fast best-fit-decreasing layout equals the plan-version-2 reference, placement for placement."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from shardwise._core.packing import (
    Balance,
    TooLong,
    class_phases,
    fill_pieces,
    piece_counts,
    piece_index,
    strata_starts,
    stratum_histogram,
    stratum_layouts,
)
from shardwise._core.packing.rows import pack_histogram
from shardwise._core.threads import ENV_WORKERS
from shardwise.index.packing import PARALLEL_FROM, write_layouts
from shardwise.index.workers import MAX_WORKERS, build_workers, map_tasks


# -- the reference: pack_histogram as plan version 2 was first written (numpy per step) -----------------
class _ReferenceRooms:
    """Rows grouped by the room they have left: ``take`` rows with a given room, ``put`` them back."""

    def __init__(self, max_len: int) -> None:
        self.stacks: list[list[np.ndarray]] = [[] for _ in range(max_len + 1)]  # room -> blocks of row ids
        self.count = np.zeros(max_len + 1, dtype=np.int64)  # room -> rows with that room

    def smallest_fitting(self, length: int) -> int:
        """The least room that holds ``length`` tokens, or -1."""
        found = np.flatnonzero(self.count[length:])
        return length + int(found[0]) if found.size else -1

    def take(self, room: int, count: int) -> np.ndarray:
        pieces, got = [], 0
        stack = self.stacks[room]
        while got < count:
            block = stack.pop()
            if block.size > count - got:
                stack.append(block[count - got :])
                block = block[: count - got]
            pieces.append(block)
            got += block.size
        self.count[room] -= count
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def put(self, room: int, rows: np.ndarray) -> None:
        if rows.size:
            self.stacks[room].append(rows)
            self.count[room] += rows.size


def reference_pack_histogram(histogram: np.ndarray, max_len: int) -> tuple[np.ndarray, int]:
    """The reference implementation of :func:`~shardwise._core.packing.rows.pack_histogram` (same contract).

    The version before runs of row ids: a whole run of equal items is placed in a few numpy
    operations per (length, row-room) pair. Kept to check the faster steps row for row.
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    rooms = _ReferenceRooms(max_len)
    num_rows = 0
    placed: list[list[np.ndarray]] = [[] for _ in range(max_len + 1)]  # length -> row of each item, in order
    for length in range(max_len, 0, -1):
        need = int(histogram[length])
        while need:
            room = rooms.smallest_fitting(length)
            if room < 0:  # no row has room: open rows, each filled with as many as fit
                per_row = max_len // length
                opened = -(-need // per_row)
                rows = np.arange(num_rows, num_rows + opened, dtype=np.int64)
                num_rows += opened
                placed[length].append(np.repeat(rows, per_row)[:need])
                rooms.put(max_len - per_row * length, rows[:-1])
                rooms.put(max_len - (need - (opened - 1) * per_row) * length, rows[-1:])
                break
            per_row = room // length
            full = min(int(rooms.count[room]), need // per_row)
            if full:  # rows of this room that the run fills to the brim, one after another
                rows = rooms.take(room, full)
                placed[length].append(np.repeat(rows, per_row))
                rooms.put(room - per_row * length, rows)
                need -= full * per_row
            if need and rooms.count[room]:  # the rest of the run: fewer than fill one row
                row = rooms.take(room, 1)
                placed[length].append(np.repeat(row, need))
                rooms.put(room - need * length, row)
                need = 0
    zeros = int(histogram[0])
    if zeros:
        num_rows = max(num_rows, 1)
        placed[0].append(np.arange(zeros, dtype=np.int64) % num_rows)
    item_rows = [np.concatenate(p) for p in placed if p]
    flat = np.concatenate(item_rows) if item_rows else np.empty(0, dtype=np.int64)
    return flat.astype(np.int64, copy=False), num_rows


def random_histogram(rng: np.random.Generator, max_len: int, count: int, kinds: int = 4) -> np.ndarray:
    """``count`` items of lengths 0..max_len drawn one of ``kinds`` ways: uniform, long-tailed, a few values,
    mostly long, (with ``kinds=5``) one length. Also the draws of ``test_packing_compiled``."""
    kind = int(rng.integers(kinds))
    if kind == 0:
        lengths = rng.integers(0, max_len + 1, count)
    elif kind == 1:
        lengths = np.clip(rng.lognormal(np.log(max(max_len / 8, 1)), 1.2, count), 0, max_len).astype(np.int64)
    elif kind == 2:
        lengths = rng.choice([0, 1, max(max_len // 3, 1) + 1, max_len // 2, max_len], count)
    elif kind == 3:
        lengths = max_len - rng.integers(0, max(max_len // 3, 1), count)
    else:
        lengths = np.full(count, int(rng.integers(0, max_len + 1)))
    return np.bincount(lengths, minlength=max_len + 1)


@pytest.mark.parametrize("seed", range(4))
def test_pack_histogram_equals_the_reference_on_random_histograms(seed: int) -> None:
    """Every item's row and the row count equal the reference's, over random histograms and row sizes."""
    rng = np.random.default_rng(seed)
    for _ in range(150):
        max_len = int(rng.integers(1, 200))
        histogram = random_histogram(rng, max_len, int(rng.integers(0, 400)))
        rows, num_rows = pack_histogram(histogram, max_len)
        expected_rows, expected_num = reference_pack_histogram(histogram, max_len)
        assert num_rows == expected_num
        np.testing.assert_array_equal(rows, expected_rows)


def test_pack_histogram_equals_the_reference_on_strata_of_long_tailed_lengths() -> None:
    """The strata of a long-tailed corpus (max_len=4096, a window of 4096) pack exactly as the reference packs them."""
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(5.5, 1.0, 40_000), 1, 4096).astype(np.int64)
    counts = np.bincount(lengths, minlength=4097)
    strata = -(-lengths.size // 4096)
    phases = class_phases(counts.size)
    for stratum in (0, 3, strata - 1):
        histogram = stratum_histogram(counts, strata, stratum, phases)
        rows, num_rows = pack_histogram(histogram, 4096)
        expected_rows, expected_num = reference_pack_histogram(histogram, 4096)
        assert num_rows == expected_num
        np.testing.assert_array_equal(rows, expected_rows)


def test_stratum_layouts_keep_the_chain_of_the_reference() -> None:
    """Whole layouts (rows dealt, rows handed on, batch keys) are those the reference packing gives."""
    rng = np.random.default_rng(3)
    counts = np.bincount(np.clip(rng.lognormal(3.0, 1.0, 5000), 0, 128).astype(np.int64), minlength=129)
    layouts = list(stratum_layouts(counts, 7, 128, rows_per_batch=4, tokens_per_batch=None, balance=Balance.ATTENTION))
    phases = class_phases(counts.size)
    for stratum, layout in enumerate(layouts):
        expected_rows, expected_num = reference_pack_histogram(stratum_histogram(counts, 7, stratum, phases), 128)
        np.testing.assert_array_equal(layout.slot_rows, expected_rows)
        assert layout.own_rows == expected_num


def reference_split_index(lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``piece_index(..., "split")`` as first written: one stable sort of the samples then the pieces, in memory."""
    long = np.flatnonzero(lengths > max_len)
    long_lengths = lengths[long].astype(np.int64)
    pieces = -(-long_lengths // max_len)
    owner = np.repeat(long, pieces)
    piece = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    starts = piece * max_len
    piece_len = np.minimum(np.repeat(long_lengths, pieces) - starts, max_len)
    short = np.flatnonzero(lengths <= max_len)
    sample = np.concatenate([short, owner])
    start = np.concatenate([np.zeros(short.size, dtype=np.int64), starts])
    keys = np.concatenate([lengths[short].astype(np.int64), piece_len])
    order = np.argsort(keys, kind="stable")
    return sample[order], start[order], np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=max_len + 1))])


@pytest.mark.parametrize("chunk", [7, 1000])
def test_chunked_piece_index_equals_one_sort_of_samples_then_pieces(chunk: int) -> None:
    """The two-pass chunked piece index (as the shared build writes it) equals one stable sort of everything."""
    rng = np.random.default_rng(chunk)
    for max_len in (1, 5, 64):
        lengths = rng.integers(0, 4 * max_len + 2, size=int(rng.integers(1, 3000)))
        counts = piece_counts(lengths, max_len, chunk=chunk)
        sample = np.zeros(int(counts.sum()), dtype=np.uint32)
        start = np.zeros_like(sample)
        fill_pieces(lengths, max_len, counts, sample, start, chunk=chunk)
        expected = reference_split_index(lengths, max_len)
        np.testing.assert_array_equal(sample, expected[0])
        np.testing.assert_array_equal(start, expected[1])
        np.testing.assert_array_equal(np.concatenate([[0], np.cumsum(counts.sum(axis=0))]), expected[2])
        index = piece_index(lengths, max_len, TooLong.SPLIT)
        if index.start is not None:
            np.testing.assert_array_equal(index.sample, expected[0])


def test_layouts_packed_by_worker_processes_equal_those_packed_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layouts files written with a worker process packing half the strata equal the in-memory chain's."""
    rng = np.random.default_rng(5)
    counts = np.bincount(np.clip(rng.lognormal(2.5, 1.0, 4000), 0, 64).astype(np.int64), minlength=65)
    strata = PARALLEL_FROM + 3
    options = {"rows_per_batch": 3, "tokens_per_batch": None, "balance": Balance.TOKENS, "drop_short": False}
    monkeypatch.setenv(ENV_WORKERS, "1")
    write_layouts(tmp_path, counts, strata, 64, **options)
    expected = list(stratum_layouts(counts, strata, 64, **options))
    slot_rows, batch_of_row = np.load(tmp_path / "slot_rows.npy"), np.load(tmp_path / "batch_of_row.npy")
    np.testing.assert_array_equal(slot_rows, np.concatenate([layout.slot_rows for layout in expected]))
    np.testing.assert_array_equal(batch_of_row, np.concatenate([layout.batch_of_row for layout in expected]))
    batches = np.diff(np.load(tmp_path / "batch_offsets.npy"))
    assert batches.tolist() == [layout.num_batches for layout in expected]


def test_map_tasks_keeps_the_order_of_tasks_and_raises_a_worker_error() -> None:
    """Results come back in task order whichever process computed them; a failing worker raises naming the step."""
    assert map_tasks(abs, [-1, -2, -3, -4, -5, -6, -7], workers=2, what="abs") == [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(RuntimeError, match=r"a worker process of square roots failed:(.|\n)*math domain error"):
        map_tasks(math.sqrt, [4.0, -1.0], workers=1, what="square roots")


def test_build_workers_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """SHARDWISE_BUILD_WORKERS sets the extra processes; anything but a non-negative integer is refused by name."""
    monkeypatch.setenv(ENV_WORKERS, "3")
    assert build_workers() == 3
    monkeypatch.setenv(ENV_WORKERS, "many")
    with pytest.raises(ValueError, match="SHARDWISE_BUILD_WORKERS should be a non-negative integer, but got"):
        build_workers()
    monkeypatch.delenv(ENV_WORKERS)
    assert 0 <= build_workers() <= MAX_WORKERS


def test_strata_starts_are_the_cumulative_sizes_of_the_strata() -> None:
    """strata_starts (all strata at once, in chunks) equals the running sum of every stratum's histogram."""
    rng = np.random.default_rng(11)
    counts = rng.integers(0, 50, 300)
    phases = class_phases(counts.size)
    for strata in (1, 2, 7, 600):
        sizes = [int(stratum_histogram(counts, strata, s, phases).sum()) for s in range(strata)]
        expected = np.concatenate([[0], np.cumsum(sizes)])
        np.testing.assert_array_equal(strata_starts(counts, strata, phases, chunk=64), expected)
