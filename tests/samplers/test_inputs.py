"""Lengths resolved in one step: every form a user passes becomes one ``LengthsInput``, checked once, one plan."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardwise.index.lengths as lengths_module
from shardwise import BucketBatchSampler, RaggedArray
from shardwise.index import key_of, length_index
from shardwise.index.builders import OffsetLengths
from shardwise.index.lengths import LengthsInput
from shardwise.samplers.inputs import as_lengths

N = 400


def _lengths(n: int = N) -> np.ndarray:
    return np.random.default_rng(0).integers(1, 60, size=n)


def _forms(tmp_path: Path) -> dict[str, Any]:
    """The same lengths as a user may hold them (the Arrow forms: tests/index/test_arrow_inputs.py)."""
    lengths = _lengths()
    np.save(tmp_path / "lengths.npy", lengths)
    store = RaggedArray.write(tmp_path / "store", (np.zeros((k, 2), np.float32) for k in lengths))
    return {
        "list": lengths.tolist(),
        "numpy": lengths,
        "int32": lengths.astype(np.int32),
        "memmap": np.load(tmp_path / "lengths.npy", mmap_mode="r"),
        "tensor": torch.from_numpy(lengths),
        "ragged store": store,
        "LengthsInput": LengthsInput.of(lengths),
    }


def _run(lengths: Any, cache: Path, **options: Any) -> tuple[list[list[int]], dict[str, Any]]:
    sampler = BucketBatchSampler(lengths, seed=3, num_replicas=2, rank=1, cache_dir=cache, **options)
    batches = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches += list(sampler)
    return batches, sampler.state_dict()


@pytest.mark.parametrize("options", [{"max_tokens": 128}, {"batch_size": 8, "sort_window": 64}], ids=["shared", "window"])
def test_every_form_of_lengths_is_one_input_and_one_plan(tmp_path: Path, options: dict[str, Any]) -> None:
    """A list, arrays, a memory map, a tensor, a ragged store and a LengthsInput give the same lengths, plans and state."""
    forms = _forms(tmp_path)
    expected = _lengths().tolist()
    runs = {}
    for name, form in forms.items():
        resolved = LengthsInput.of(form)
        assert resolved.read(0, len(resolved)).tolist() == expected, name
        runs[name] = _run(form, tmp_path / "cache", **options)
    first = runs["list"]
    assert first[0], "no batches: the comparison would be vacuous"
    for name, run in runs.items():
        assert run == first, f"{name}: another plan or state than the list's"


def test_a_memory_map_stays_one_and_is_keyed_and_pickled_by_its_file(tmp_path: Path) -> None:
    """Mapped lengths are used as is (O(1) key of the file), and pickle as their location, not 8 bytes a sample."""
    np.save(tmp_path / "lengths.npy", _lengths(300_000))
    mapped = np.load(tmp_path / "lengths.npy", mmap_mode="r")
    resolved = LengthsInput.of(mapped)
    assert resolved.values is mapped and resolved.mapped
    assert resolved.key == key_of(mapped)
    data = pickle.dumps(resolved)
    assert len(data) < 10_000
    copy = pickle.loads(data)
    assert isinstance(copy.values, np.memmap) and np.array_equal(copy.values, mapped) and copy.key == resolved.key


def test_a_ragged_store_reads_its_offsets_and_keeps_its_own_key(tmp_path: Path) -> None:
    """A RaggedArray becomes its offsets' lengths, keyed by the store's checksum (a copy keeps its index)."""
    store = RaggedArray.write(tmp_path / "store", (np.zeros((k, 3), np.int8) for k in (4, 0, 2)))
    resolved = LengthsInput.of(store)
    assert resolved.store is store and isinstance(resolved.values, OffsetLengths) and resolved.mapped
    assert resolved.read(0, 3).tolist() == [4, 0, 2] and resolved.value_range() == (0, 4)
    assert resolved.key == key_of(store)


@pytest.mark.parametrize("options", [{"max_tokens": 128}, {"batch_size": 8, "sort_window": 64}], ids=["small", "window"])
def test_values_are_checked_once(options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a sampler checks the lengths for non-negative integers once (it did twice with a sort_window)."""
    calls = []
    real = lengths_module.check_non_negative_integers

    def counted(*args: Any, **kwargs: Any) -> tuple[int, int]:
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(lengths_module, "check_non_negative_integers", counted)
    BucketBatchSampler(_lengths().tolist(), seed=0, num_replicas=1, rank=0, **options)
    assert calls == ["lengths"]


def test_a_lengths_input_is_returned_as_is_and_its_range_computed_once() -> None:
    """LengthsInput.of(a LengthsInput) is that object; its range and compact copy follow the values."""
    resolved = LengthsInput.of(np.array([7, 0, 70_000]))
    assert LengthsInput.of(resolved) is resolved
    assert resolved.value_range() == (0, 70_000) and resolved.compact().dtype == np.uint32
    assert resolved.length_of(2) == 70_000 and len(resolved) == 3


def test_the_old_entry_points_answer_as_before(tmp_path: Path) -> None:
    """as_lengths and length_index (what verify and the packed sampler call) agree with LengthsInput."""
    lengths = _lengths()
    assert LengthsInput.of(lengths).values is lengths
    compact = as_lengths(lengths.tolist())
    assert compact.dtype == np.uint16 and compact.tolist() == lengths.tolist()
    by_array = length_index(lengths, cache_dir=tmp_path)
    by_input = length_index(LengthsInput.of(lengths), cache_dir=tmp_path)
    assert np.array_equal(by_array.order, by_input.order) and np.array_equal(by_array.offsets, by_input.offsets)


@pytest.mark.parametrize(
    ("lengths", "error", "match"),
    [
        ([1.5, 2.0], TypeError, "lengths should hold integers \\(token counts\\), but got lengths of dtype float64"),
        ([[1, 2], [3, 4]], ValueError, "lengths should be a 1-D sequence of integers, but got lengths with shape"),
        ([], ValueError, "lengths should hold at least one length"),
        (None, TypeError, "lengths should be a 1-D sequence of integers, but got lengths=None"),
    ],
    ids=["float", "2d", "empty", "none"],
)
def test_bad_lengths_fail_at_the_one_step_naming_lengths(lengths: Any, error: type[Exception], match: str) -> None:
    """What the samplers said of bad lengths, LengthsInput.of says, once, before any sampler work."""
    with pytest.raises(error, match=match):
        LengthsInput.of(lengths)
    with pytest.raises(error, match=match):
        BucketBatchSampler(lengths, max_tokens=8, num_replicas=1, rank=0)


def test_negative_lengths_are_refused_where_they_are_read() -> None:
    """A negative length is found by the one check of the values, naming its position."""
    resolved = LengthsInput.of([3, -1, 2])
    with pytest.raises(ValueError, match=r"lengths should hold non-negative integers, but got lengths\[1\]=-1"):
        resolved.value_range()
