"""The class index (two compiled passes, or numpy's one-pass sort) is what a stable argsort by class makes."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from shardwise._core import class_buckets, class_index
from shardwise._core.class_buckets import bucket_plan, group_by_class
from shardwise._core.class_index import count_classes, group_in_one_pass, kernels
from shardwise._core.packing.compiled import ENV_NUMBA

NO_NUMBA = importlib.util.find_spec("numba") is None
PATHS = ["0", pytest.param("1", marks=pytest.mark.skipif(NO_NUMBA, reason="numba (the fast extra) is not installed"))]


def reference(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(classes, counts, members)`` by ``np.unique`` and a stable argsort of the class ids."""
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return classes, counts, np.argsort(inverse.reshape(-1), kind="stable")


def awkward_labels() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    big = np.full(9_000, 3, dtype=np.int32)
    big[rng.integers(0, 9_000, 700)] = rng.integers(0, 50, 700)
    return [
        ("one class", np.full(5_003, -7, dtype=np.int64)),
        ("many classes, more than a chunk", rng.integers(0, 20_000, 30_001).astype(np.int32)),
        ("a class larger than a bucket", big),
        ("negative, sparse within DENSE_SPAN", rng.choice([-300, -2, 0, 5, 4_000], 10_007)),
        ("huge and sparse: searched", rng.integers(-3, 4, 10_000) * 2**40),
        ("uint64 past 2**63", np.uint64(2**63) + rng.integers(0, 5, 10_000).astype(np.uint64)),
        ("strings", rng.choice(["a", "bb", "c", "dd", "e"], 10_000)),
        ("int8", rng.integers(-128, 128, 10_000).astype(np.int8)),
        ("sorted descending: the range widens", np.sort(rng.integers(-500, 3_000, 9_999))[::-1].copy()),
    ]


@pytest.fixture
def small_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks, buckets and blocks small enough that every input above spans many of each."""
    monkeypatch.setattr(class_index, "CHUNK", 1 << 10)
    monkeypatch.setattr(class_index, "COMPILED_CHUNK", 1 << 11)
    monkeypatch.setattr(class_buckets, "COMPILED_CHUNK", 1 << 11)
    monkeypatch.setattr(class_buckets, "BUCKET_ITEMS", 1 << 9)
    monkeypatch.setattr(class_buckets, "BUCKET_CLASSES", 1 << 6)
    monkeypatch.setattr(class_buckets, "MIN_BLOCK_BITS", 1)
    monkeypatch.setattr(class_index, "COMPILED_FROM", 0)


@pytest.mark.parametrize("numba", PATHS)
@pytest.mark.usefixtures("small_buckets")
def test_both_paths_equal_a_stable_argsort(numba: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Counts and grouped members equal the reference, into a file mapping (pwrite) and into memory, both dtypes."""
    monkeypatch.setenv(ENV_NUMBA, numba)
    for name, labels in awkward_labels():
        classes, counts = count_classes(labels)
        expected_classes, expected_counts, expected = reference(labels)
        assert classes.tolist() == expected_classes.tolist(), name
        assert counts.tolist() == expected_counts.tolist(), name
        for dtype in (np.uint32, np.int64):
            plan = bucket_plan(counts, len(labels), np.dtype(dtype))
            assert plan is not None and (len(plan.firsts) > 2 or len(classes) == 1), name  # numba: the two passes
            mapped = np.lib.format.open_memmap(tmp_path / "members.npy", mode="w+", dtype=dtype, shape=(len(labels),))
            group_by_class(labels, classes, counts, mapped)
            mapped.flush()
            assert np.array_equal(np.load(tmp_path / "members.npy"), expected), (name, dtype)
            del mapped
            in_memory = np.empty(len(labels), dtype=dtype)
            group_by_class(labels, classes, counts, in_memory)
            assert np.array_equal(in_memory, expected), (name, dtype)


@pytest.mark.parametrize("numba", PATHS)
@pytest.mark.usefixtures("small_buckets")
def test_empty_classes_and_blocks_of_one_bucket(numba: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Classes with no sample (counts of 0) take no slot; a block that gives a bucket nothing is skipped."""
    monkeypatch.setenv(ENV_NUMBA, numba)
    labels = np.concatenate([np.zeros(3_000, dtype=np.int64), np.full(3_000, 4), np.arange(5, 3_005)])  # 1..3 absent
    classes = np.arange(3_005)
    counts = np.bincount(labels, minlength=3_005)
    members = np.empty(len(labels), dtype=np.uint32)
    group_by_class(labels, classes, counts, members)
    assert np.array_equal(members, np.argsort(labels, kind="stable"))


@pytest.mark.parametrize("numba", PATHS[1:])
def test_codes_that_do_not_fit_fall_back_to_one_pass(numba: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Too many block x bucket counts: no plan, and group_by_class writes the one-pass sort's index."""
    monkeypatch.setenv(ENV_NUMBA, numba)
    labels = np.random.default_rng(3).integers(0, 500, 20_000)
    classes, counts = count_classes(labels)
    monkeypatch.setattr(class_buckets, "SEGMENTS_MAX", 0)
    assert bucket_plan(counts, len(labels), np.dtype(np.uint32)) is None
    members, one_pass = np.empty(len(labels), dtype=np.uint32), np.empty(len(labels), dtype=np.uint32)
    group_by_class(labels, classes, counts, members)
    group_in_one_pass(labels, classes, counts, one_pass)
    assert np.array_equal(members, reference(labels)[2]) and np.array_equal(one_pass, members)


def test_buckets_hold_at_most_twice_bucket_items_unless_one_class() -> None:
    """A bucket of several classes stays within pass 2's scratch; a class larger than that is alone."""
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 3 * class_buckets.BUCKET_ITEMS, 300) * (rng.random(300) < 0.2) + rng.integers(1, 9, 300)
    plan = bucket_plan(counts, int(counts.sum()), np.dtype(np.uint32))
    assert plan is not None
    sizes = np.add.reduceat(counts, plan.firsts[:-1])
    several = np.diff(plan.firsts) > 1
    assert sizes[several].max() <= 2 * class_buckets.BUCKET_ITEMS
    assert (np.diff(plan.firsts) <= class_buckets.BUCKET_CLASSES).all()


def test_numba_required_but_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """SHARDWISE_NUMBA=1 without numba: an ImportError with the install command; auto falls back to numpy."""
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba now raises ImportError
    monkeypatch.setenv(ENV_NUMBA, "1")
    with pytest.raises(ImportError, match=r"pip install 'shardwise\[fast\]'"):
        kernels(1 << 30)
    monkeypatch.setenv(ENV_NUMBA, "auto")
    assert kernels(1 << 30) is None


@pytest.mark.parametrize("numba", PATHS[1:])
def test_several_blocks_filled_from_both_ends(numba: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Codes of 20 position bits (4,096 classes a bucket): 3 blocks, pass 1's two threads meet inside every run."""
    monkeypatch.setenv(ENV_NUMBA, numba)
    labels = np.random.default_rng(8).integers(0, 50_000, 3_000_000).astype(np.int32) * 3  # a sparse table
    classes, counts = count_classes(labels)
    plan = bucket_plan(counts, len(labels), np.dtype(np.uint32))
    assert plan is not None and plan.block_bits == 20  # 3 blocks: the second thread takes the last two, backwards
    members = np.lib.format.open_memmap(tmp_path / "members.npy", mode="w+", dtype=np.uint32, shape=(len(labels),))
    group_by_class(labels, classes, counts, members)
    assert np.array_equal(members, np.argsort(labels, kind="stable"))


@pytest.mark.parametrize("numba", PATHS)
@pytest.mark.usefixtures("small_buckets")
def test_order_by_key_is_the_class_index_sort(numba: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """order_by_key (the length index) sorts with group_by_class: a stable argsort, for arrays and ragged offsets."""
    from shardwise.index.builders import OffsetLengths, order_by_key

    monkeypatch.setenv(ENV_NUMBA, numba)
    lengths = np.random.default_rng(6).lognormal(4, 1, 20_001).clip(0, 3_000).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    for name, keys in (("array", lengths), ("ragged", OffsetLengths(offsets))):
        order_by_key(keys, tmp_path, name=name, chunk=1 << 10)
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), np.argsort(lengths, kind="stable")), name
        assert np.array_equal(np.diff(np.load(tmp_path / f"{name}_offsets.npy")), np.bincount(lengths)), name
