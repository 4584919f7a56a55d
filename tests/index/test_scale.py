"""Samplers at scale on the shared index: bounded private memory, one index per node, same plans with or without it."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from shardwise import BucketBatchSampler, RaggedArray
from shardwise._core.bucketing import bucket_plan
from shardwise._core.offsets import span_positions
from shardwise._core.ordering import balanced_batch_order
from shardwise._core.seeds import derive_seed
from shardwise._core.sorted_bucketing import SortedBucketPlan
from shardwise.index import cache as cache_module
from tests.memcap import run_capped


def _write_lengths(path: Path, n: int, high: int = 512, seed: int = 0) -> None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(n,))
    rng = np.random.default_rng(seed)
    for first in range(0, n, 1 << 20):
        stop = min(first + (1 << 20), n)
        out[first:stop] = rng.integers(1, high + 1, stop - first)
    out.flush()
    del out


def test_bucket_over_1e7_mapped_lengths_runs_under_a_data_cap(tmp_path: Path) -> None:
    """1e7 memory-mapped int64 lengths (80 MB): build the index and iterate with 48 MB of private memory to spare."""
    n = 10_000_000
    _write_lengths(tmp_path / "lengths.npy", n)
    out = run_capped(
        f"""
lengths = np.load({str(tmp_path / "lengths.npy")!r}, mmap_mode="r")
cap(48)  # MiB of private memory to spare: an argsort of the lengths alone needs 80 MB
sampler = shardwise.BucketBatchSampler(lengths, max_tokens=4096, cache_dir={str(tmp_path / "cache")!r},
                                       num_replicas=8, rank=3, seed=1)
batches = samples = 0
for batch in sampler:
    batches += 1
    samples += len(batch)
print(batches, samples, len(sampler))
""",
        timeout=300,
    )
    batches, samples, length = map(int, out.split())
    assert batches == length > 0 and samples > n // 8 * 0.9
    assert len([p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]) == 1


def test_packed_over_3e6_mapped_lengths_builds_its_index_under_a_data_cap(tmp_path: Path) -> None:
    """3e6 mapped lengths, some split: the piece index and the layouts build with 64 MB of private memory to spare."""
    n = 3_000_000
    out = np.lib.format.open_memmap(tmp_path / "lengths.npy", mode="w+", dtype=np.int32, shape=(n,))
    out[:] = np.clip(np.random.default_rng(2).lognormal(5.5, 1.0, n), 1, 8192).astype(np.int32)
    out.flush()
    del out
    got = run_capped(
        f"""
import itertools
lengths = np.load({str(tmp_path / "lengths.npy")!r}, mmap_mode="r")
cap(64)  # MiB to spare (chunks of 2**20 and their temporaries); the in-memory piece index it replaced: ~40 bytes a sample, 120 MB
sampler = shardwise.PackedBatchSampler(lengths, max_len=4096, rows_per_batch=8, num_replicas=8, rank=3, seed=1,
                                       cache_dir={str(tmp_path / "cache")!r})
longest = max(sum(i.stop - i.start for i in b if i.row == r) for b in itertools.islice(sampler, 10) for r in range(8))
print(len(sampler), sampler.num_items - n if (n := {n}) else 0, longest)
""",
        timeout=300,
    )
    batches, pieces, longest = map(int, got.split())
    assert batches > 0 and pieces > 0 and 0 < longest <= 4096
    entries = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "cache").iterdir() if not p.name.startswith("."))
    assert entries == ["lengths-range", "pack-layouts", "pack-pieces"]


def _plan_digest(args: tuple[str, str]) -> str:
    lengths_path, cache_dir = args
    lengths = np.load(lengths_path, mmap_mode="r")
    sampler = BucketBatchSampler(lengths, max_tokens=2048, cache_dir=cache_dir, num_replicas=1, rank=0, seed=5)
    return hashlib.sha256(repr(list(sampler)).encode()).hexdigest()


def test_four_processes_on_an_empty_cache_build_once_and_agree(tmp_path: Path) -> None:
    """Four processes starting at once on an empty cache leave one entry, no partial, and plan alike."""
    _write_lengths(tmp_path / "lengths.npy", 300_000, high=300)
    cache_dir = tmp_path / "cache"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        digests = pool.map_async(_plan_digest, [(str(tmp_path / "lengths.npy"), str(cache_dir))] * 4).get(180)
    assert len(set(digests)) == 1
    entries = [p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")]
    assert len(entries) == 1 and not entries[0].startswith(".")
    assert digests[0] == _plan_digest((str(tmp_path / "lengths.npy"), str(cache_dir)))


def test_same_plan_with_and_without_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached index, the in-memory fallback and the small in-memory index give one plan."""
    monkeypatch.setattr(cache_module, "_warned", set())
    lengths = np.random.default_rng(2).integers(0, 90, 5000)
    plans = []
    for cache_dir in (tmp_path, False, None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # cache_dir=False warns (tested in test_index)
            for options in ({"max_tokens": 400, "batch_size_multiple": 4}, {"batch_size": 7}):
                sampler = BucketBatchSampler(lengths, cache_dir=cache_dir, num_replicas=3, rank=1, seed=4, **options)
                sampler.set_epoch(2)
                plans.append(list(sampler))
    assert plans[0] == plans[2] == plans[4] and plans[1] == plans[3] == plans[5]


def test_corrupted_index_is_rebuilt_and_plans_alike(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A damaged cache file is detected when the next sampler opens it, rebuilt, and the plan is unchanged."""
    lengths = np.random.default_rng(3).integers(1, 60, 20_000)
    before = list(BucketBatchSampler(lengths, max_tokens=300, cache_dir=tmp_path, num_replicas=1, rank=0))
    (entry,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    with open(entry / "order.npy", "r+b") as file:
        file.truncate(1000)
    with caplog.at_level("WARNING", logger="shardwise"):
        after = list(BucketBatchSampler(lengths, max_tokens=300, cache_dir=tmp_path, num_replicas=1, rank=0))
    assert "rebuilding" in caplog.text and after == before


def test_ragged_store_is_ready_for_bucketing(tmp_path: Path) -> None:
    """RaggedWriter writes the length index, so a sampler over the store builds nothing and plans as over its lengths."""
    rng = np.random.default_rng(4)
    store = RaggedArray.write(tmp_path / "store", [np.zeros(int(k), np.int8) for k in rng.integers(0, 50, 3000)])
    entries = list((tmp_path / "store" / "index").iterdir())
    mtimes = {p: p.stat().st_mtime_ns for p in entries}
    sampler = BucketBatchSampler(store, max_tokens=200, num_replicas=2, rank=1, seed=8)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "store" / "index").iterdir()} == mtimes
    same = BucketBatchSampler(np.asarray(store.lengths), max_tokens=200, num_replicas=2, rank=1, seed=8)
    assert list(sampler) == list(same)
    assert sampler.state_dict() == same.state_dict()


def test_sorted_plan_matches_the_materialised_recipe() -> None:
    """Without a key the arithmetic plan equals bucket_plan's; with one, its order is the balanced order of its cut."""
    rng = np.random.default_rng(5)
    for trial in range(60):
        n = int(rng.integers(1, 600))
        lengths = rng.integers(0, int(rng.integers(1, 80)), n)
        tokens = trial % 2 == 0
        values, counts = np.unique(lengths, return_counts=True)
        if tokens:
            values, counts = values[::-1], counts[::-1]
            size = {"max_tokens": int(rng.integers(max(int(lengths.max()), 1), 400)),
                    "multiple": int(rng.choice([1, 4, 8]))}  # fmt: skip
        else:
            size = {"batch_size": int(rng.integers(1, 20)), "drop_short": bool(trial % 4 == 1)}
        group = int(rng.choice([1, 4, 64]))
        stream = np.argsort(-lengths if tokens else lengths, kind="stable")
        plain = SortedBucketPlan(values, counts, group=group, key=None, **size)  # type: ignore[arg-type]
        starts, sizes = plain.spans(np.arange(len(plain)))
        reference = bucket_plan(np.arange(n), lengths, group=group, key=None, **size)  # type: ignore[arg-type]
        flat = stream[span_positions(starts, sizes)]
        np.testing.assert_array_equal(flat, reference.order)
        np.testing.assert_array_equal(np.diff(np.concatenate([[0], np.cumsum(sizes)])), reference.sizes())
        key = 1000 + trial
        keyed = SortedBucketPlan(values, counts, group=group, key=key, **size)  # type: ignore[arg-type]
        starts, sizes = keyed.spans(np.arange(len(keyed)))
        by_start = np.argsort(starts)
        sorted_lengths = lengths[stream]
        costs = np.array(
            [z * sorted_lengths[s : s + z].max() for s, z in zip(starts[by_start], sizes[by_start], strict=True)]
        )
        expected = balanced_batch_order(costs, group, derive_seed(key, "groups"))
        np.testing.assert_array_equal(by_start[expected], np.arange(len(keyed)))
        covered = sorted(span_positions(starts, sizes).tolist())
        assert covered == list(range(n)) or (
            size.get("drop_short") and len(set(covered)) == len(covered) == n - n % size["batch_size"]
        )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs /proc")
def test_warm_sampler_holds_no_per_sample_array(tmp_path: Path) -> None:
    """A warm sampler over 2e6 mapped lengths keeps only O(distinct lengths) arrays of its own."""
    _write_lengths(tmp_path / "lengths.npy", 2_000_000, high=300)
    lengths = np.load(tmp_path / "lengths.npy", mmap_mode="r")
    BucketBatchSampler(lengths, max_tokens=1024, cache_dir=tmp_path / "c", num_replicas=1, rank=0)
    sampler = BucketBatchSampler(lengths, max_tokens=1024, cache_dir=tmp_path / "c", num_replicas=4, rank=2)
    next(iter(sampler))
    private = [
        (name, value.nbytes)
        for name, value in vars(sampler).items()
        if isinstance(value, np.ndarray) and not np.shares_memory(value, lengths) and value.nbytes > 1 << 16
    ]
    assert private == [] and isinstance(sampler.lengths, np.memmap)
    assert isinstance(sampler._grouped().order, np.memmap)


def test_pickled_sampler_carries_the_file_location_not_the_lengths(tmp_path: Path) -> None:
    """Pickling a sampler over mapped lengths carries their location; the copy reopens them and plans alike."""
    import pickle

    _write_lengths(tmp_path / "lengths.npy", 300_000, high=100)
    lengths = np.load(tmp_path / "lengths.npy", mmap_mode="r")
    sampler = BucketBatchSampler(lengths, max_tokens=500, cache_dir=tmp_path / "c", num_replicas=2, rank=0)
    data = pickle.dumps(sampler)
    assert len(data) < 100_000
    copy = pickle.loads(data)
    assert isinstance(copy.lengths, np.memmap) and list(copy) == list(sampler)


def test_bad_cache_arguments_name_the_parameter(tmp_path: Path) -> None:
    """A cache_dir that is a file, or a negative cache_timeout, fails at construction naming the parameter."""
    from shardwise.index import IndexCacheError

    (tmp_path / "file").write_text("x")
    with pytest.raises(IndexCacheError, match="cache_dir should be a directory"):
        BucketBatchSampler([3, 1, 2], max_tokens=8, cache_dir=tmp_path / "file")
    with pytest.raises(ValueError, match="cache_timeout should be a non-negative number"):
        BucketBatchSampler([3, 1, 2], max_tokens=8, cache_timeout=-1)
