"""A damaged shared index never reaches a batch: full checksums, per-node verification, range checks on read."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardwise import (
    BucketBatchSampler,
    ClassBalancedBatchSampler,
    PackedBatchSampler,
    TwoStreamBatchSampler,
    WeightedSampler,
)
from shardwise._core.files import BLOCK_BYTES, SAMPLE_BLOCKS
from shardwise.data.ragged import RaggedArray, RaggedWriter
from shardwise.index import IndexCorruptError, build_or_open, integrity, read_checked
from shardwise.index.manifest import npy_layout

SMALL_SYNC = 1 << 16  # files above 64 KiB are checked by sampled blocks at open, in full in the background


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts as a new process would: no entry opened yet; files above 64 KiB verified in the background."""
    integrity.forget()
    monkeypatch.setitem(integrity._settings, "sync_bytes", SMALL_SYNC)
    monkeypatch.setenv("SHARDWISE_INDEX_VERIFY", "background")  # the default (before-use) has its own tests below
    yield
    integrity.forget()


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _bucket(d: Path) -> Any:
    lengths = _rng().integers(1, 512, 100_000)
    return BucketBatchSampler(lengths, batch_size=64, cache_dir=d, num_replicas=1, rank=0)


def _store(d: Path) -> Any:
    path = d / "store"
    if not path.exists():
        with RaggedWriter(path) as writer:
            for length in _rng().integers(1, 24, 100_000).tolist():
                writer.append(np.zeros(length, dtype=np.uint8))
    return BucketBatchSampler(RaggedArray(path), batch_size=64, num_replicas=1, rank=0)


def _class_balanced(d: Path) -> Any:
    labels = _rng().integers(0, 50, 100_000)
    return ClassBalancedBatchSampler(labels, classes_per_batch=4, samples_per_class=4, cache_dir=d,
                                     num_replicas=1, rank=0)  # fmt: skip


def _weighted(d: Path) -> Any:
    return WeightedSampler(_rng().random(100_000), num_samples=300_000, cache_dir=d, num_replicas=1, rank=0)


def _distinct(d: Path) -> Any:
    weights = _rng().random(100_000)
    return WeightedSampler(weights, num_samples=90_000, replacement=False, cache_dir=d, num_replicas=1, rank=0)


def _packed(d: Path) -> Any:
    lengths = _rng().integers(1, 200, 300_000)
    return PackedBatchSampler(lengths, max_len=256, rows_per_batch=8, cache_dir=d, num_replicas=1, rank=0)


def _two_stream(d: Path) -> Any:
    return TwoStreamBatchSampler(np.arange(100_000), np.arange(100_000, 170_000), primary_batch_size=6,
                                 secondary_batch_size=2, cache_dir=d, num_replicas=1, rank=0)  # fmt: skip


# (make, entry kind, file): the index file each sampler's plan reads most (4 or 8 bytes a value)
SAMPLERS: dict[str, tuple[Callable[[Path], Any], str, str]] = {
    "bucket": (_bucket, "length-order", "order.npy"),
    "ragged-store": (_store, "length-order", "order.npy"),
    "class-balanced": (_class_balanced, "class-index-v1", "members.npy"),
    "weighted": (_weighted, "weight-table-v1", "guide.npy"),
    "weighted-cdf": (_weighted, "weight-table-v1", "cdf.npy"),
    "weighted-distinct": (_distinct, "weighted-distinct-v1", "plan.npy"),
    "packed": (_packed, "length-order", "order.npy"),
}


def _outcome(make: Callable[[Path], Any], d: Path) -> tuple[list[Any], BaseException | None]:
    """The batches a fresh sampler yields for epoch 0, and the error that stopped it (construction included)."""
    integrity.forget()
    batches: list[Any] = []
    try:
        for batch in make(d):
            batches.append(batch)
    except IndexCorruptError as error:
        return batches, error
    return batches, None


def _target(d: Path, kind: str, name: str) -> Path:
    found = [p for p in d.rglob(name) if p.parent.name.startswith(f"{kind}-") and not p.parent.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]


def _between_sampled_blocks(path: Path) -> tuple[int, np.dtype[Any], int]:
    """``(element index, dtype, header)`` of an element none of the 16 sampled blocks covers."""
    dtype, _, header = npy_layout(path)
    span = path.stat().st_size - header
    last = span - BLOCK_BYTES
    starts = [last * k // (SAMPLE_BLOCKS - 1) for k in range(SAMPLE_BLOCKS)]
    middle = (starts[7] + BLOCK_BYTES + starts[8]) // 2
    assert starts[7] + BLOCK_BYTES < middle < starts[8] - dtype.itemsize
    return middle // dtype.itemsize, dtype, header


def _flip(path: Path, element: int, bit: int, dtype: np.dtype[Any], header: int) -> None:
    """Flip one bit of one element in place, keeping the file's mtime (as a disk or page cache would)."""
    status = path.stat()
    byte = header + element * dtype.itemsize + bit // 8
    with open(path, "r+b") as file:
        file.seek(byte)
        old = file.read(1)[0]
        file.seek(byte)
        file.write(bytes([old ^ (1 << (bit % 8))]))
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))


def _in_range_bit(path: Path, element: int, dtype: np.dtype[Any]) -> int:
    """The highest bit whose flip keeps the element within the values its file holds (a range check cannot see it)."""
    values = np.load(path, mmap_mode="r")
    low, high, value = int(values.min()), int(values.max()), int(values[element])
    for bit in range(8 * dtype.itemsize - 2, -1, -1):
        if low <= value ^ (1 << bit) <= high and value ^ (1 << bit) != value:
            return bit
    raise AssertionError("no in-range bit")


def _damage(d: Path, kind: str, name: str, *, high: bool) -> Path:
    path = _target(d, kind, name)
    element, dtype, header = _between_sampled_blocks(path)
    bit = 8 * dtype.itemsize - 2 if high else _in_range_bit(path, element, dtype)  # below the sign bit
    _flip(path, element, bit, dtype, header)
    for marker in path.parent.glob("verified.*.json"):  # another node, or this node after a reboot
        marker.unlink()
    return path


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_in_range_flip_between_sampled_blocks_is_caught_by_the_full_check(
    sampler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flipped bit no range can see, between the sampled blocks: the per-node full check stops the plan, then a rebuild restores it."""
    make, kind, name = SAMPLERS[sampler]
    plan, error = _outcome(make, tmp_path)
    assert error is None and plan
    _damage(tmp_path, kind, name, high=False)
    start = integrity.EntryCheck.ensure_verifying

    def finished(self: integrity.EntryCheck) -> None:  # the background check ends before the first batch
        start(self)
        if self._thread is not None:
            self._thread.join(60)

    monkeypatch.setattr(integrity.EntryCheck, "ensure_verifying", finished)
    damaged, error = _outcome(make, tmp_path)
    assert isinstance(error, IndexCorruptError) and "fails its full CRC-32" in str(error)
    assert damaged == plan[: len(damaged)]
    again, error = _outcome(make, tmp_path)  # the next start rebuilds the entry: the same plan
    assert error is None and again == plan


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_high_bit_flip_is_caught_before_it_reaches_a_batch(
    sampler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flipped high bit (index 2**30 and more), read before the background check ends: the batch raises, no other plan."""
    make, kind, name = SAMPLERS[sampler]
    plan, error = _outcome(make, tmp_path)
    assert error is None
    _damage(tmp_path, kind, name, high=True)
    monkeypatch.setattr(integrity.EntryCheck, "ensure_verifying", lambda self: None)  # not verified yet
    damaged, error = _outcome(make, tmp_path)
    assert isinstance(error, IndexCorruptError) and "outside the range" in str(error)
    assert damaged == plan[: len(damaged)]
    monkeypatch.undo()
    monkeypatch.setitem(integrity._settings, "sync_bytes", SMALL_SYNC)
    again, error = _outcome(make, tmp_path)
    assert error is None and again == plan


def test_two_stream_checks_are_verified_in_full_at_every_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """TwoStream's cached checks are a few bytes: any flipped bit fails the open-time CRC-32 and they are rebuilt."""
    plan, error = _outcome(_two_stream, tmp_path)
    assert error is None and plan
    path = _target(tmp_path, "two-stream-check-v1", "overlap.npy")
    dtype, _, header = npy_layout(path)
    _flip(path, 0, 8 * dtype.itemsize - 2, dtype, header)
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        again, error = _outcome(_two_stream, tmp_path)
    assert error is None and again == plan
    assert "fails its CRC-32" in caplog.text


def test_a_file_below_the_full_check_size_is_verified_at_every_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Up to 4 MiB (the default) a file is checksummed in full at open: a flip between sampled blocks is rebuilt."""
    integrity._settings["sync_bytes"] = integrity.SYNC_BYTES
    values = np.arange(200_000, dtype=np.int64)  # 1.6 MB

    def build(directory: Path) -> None:
        np.save(directory / "values.npy", values)

    build_or_open("flip", "k", build, cache_dir=tmp_path)
    path = _target(tmp_path, "flip", "values.npy")
    element, dtype, header = _between_sampled_blocks(path)
    _flip(path, element, 0, dtype, header)
    integrity.forget()
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        arrays = build_or_open("flip", "k", build, cache_dir=tmp_path)
    np.testing.assert_array_equal(arrays["values"], values)
    assert "fails its CRC-32" in caplog.text


def test_the_builder_marks_its_node_verified_and_the_marker_is_tied_to_the_files(tmp_path: Path) -> None:
    """The builder's marker spares its node the full read; a changed file (another mtime) is verified again."""
    def build(directory: Path) -> None:
        np.save(directory / "values.npy", np.arange(100_000, dtype=np.int64))

    build_or_open("mark", "k", build, cache_dir=tmp_path)
    path = _target(tmp_path, "mark", "values.npy")
    marker = json.loads(next(path.parent.glob("verified.*.json")).read_text())
    manifest = json.loads((path.parent / "manifest.json").read_text())["files"]["values.npy"]
    assert marker["status"] == "verified" and manifest["min"] == 0 and manifest["max"] == 99_999
    integrity.forget()
    arrays = build_or_open("mark", "k", build, cache_dir=tmp_path)
    check = integrity._records[os.path.abspath(path)].check  # type: ignore[union-attr]
    assert check.status == "verified"  # trusted: no background read
    os.utime(path, ns=(0, 12345))  # the file changed behind the marker's back
    integrity.forget()
    arrays = build_or_open("mark", "k", build, cache_dir=tmp_path)
    check = integrity._records[os.path.abspath(path)].check  # type: ignore[union-attr]
    assert check.wait(60) == "verified"  # read in full again, found intact
    assert read_checked(arrays["values"], arrays["values"][5:9]).tolist() == [5, 6, 7, 8]


def test_read_checked_leaves_in_memory_arrays_alone() -> None:
    """Arrays in private memory (small inputs, no cache) are not index files: returned as they are."""
    values = np.array([3, 2**40])
    assert read_checked(values, values) is values


def test_a_mapped_entry_found_without_an_open_is_checked_too(tmp_path: Path) -> None:
    """An array mapped again from its file (a pickled sampler in a worker) is range-checked like an opened one."""
    def build(directory: Path) -> None:
        np.save(directory / "values.npy", np.arange(100_000, dtype=np.uint32))

    build_or_open("remap", "k", build, cache_dir=tmp_path)
    path = _target(tmp_path, "remap", "values.npy")
    element, dtype, header = _between_sampled_blocks(path)
    _flip(path, element, 31, dtype, header)
    integrity.forget()
    remapped = np.load(path, mmap_mode="r")
    with pytest.raises(IndexCorruptError, match=r"values.npy holds .* outside the range \[0, 99999\]"):
        read_checked(remapped, remapped[element - 1 : element + 1])


@pytest.mark.parametrize("mode", ["default", "before-use"])
def test_verify_before_use_rebuilds_a_damaged_entry_before_any_batch(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """By default (and with SHARDWISE_INDEX_VERIFY=before-use) the open waits for the full check: an in-range flip is rebuilt, no error."""
    plan, error = _outcome(_bucket, tmp_path)
    assert error is None
    _damage(tmp_path, "length-order", "order.npy", high=False)
    if mode == "default":
        monkeypatch.delenv("SHARDWISE_INDEX_VERIFY")
    else:
        monkeypatch.setenv("SHARDWISE_INDEX_VERIFY", mode)
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        again, error = _outcome(_bucket, tmp_path)
    assert error is None and again == plan
    assert "fails its full CRC-32" in caplog.text and "rebuilding" in caplog.text


@pytest.mark.parametrize("values", [np.arange(3_000_000, dtype=np.int64) - 7, np.array([np.nan, -2.5, 4.0] * 900_000)])
def test_describe_file_with_the_checksum_in_a_thread_gives_the_same_record(tmp_path: Path, monkeypatch, values) -> None:
    """A large file's CRC-32 computed beside its value range (a second thread): the record of one pass, and
    the CRC-32 of every byte."""
    import zlib

    np.save(tmp_path / "a.npy", values)
    dtype, _, header = npy_layout(tmp_path / "a.npy")
    from shardwise.index import checksums

    monkeypatch.setattr(checksums, "PARALLEL_BYTES", 1 << 40)
    one_pass = checksums.describe_file(tmp_path / "a.npy", header, dtype)
    monkeypatch.setattr(checksums, "PARALLEL_BYTES", 0)
    assert checksums.describe_file(tmp_path / "a.npy", header, dtype) == one_pass
    assert one_pass["crc32"] == zlib.crc32((tmp_path / "a.npy").read_bytes())
    assert (one_pass["min"], one_pass["max"]) == (float(np.nanmin(values)), float(np.nanmax(values)))
