"""The ragged store's format: round trips, plain .npy files, dtypes and feature shapes, empty stores, targets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from shardwise import RaggedArray, RaggedWriter
from shardwise.data.ragged import MANIFEST, OFFSETS, VALUES
from tests.data.ragged.stores import _leftovers, _samples


def test_module_examples_run() -> None:
    """The Example sections of RaggedArray, RaggedWriter and pad_collate run as written."""
    import doctest

    from shardwise.data import collate
    from shardwise.data.ragged import reader, writer

    for module in (reader, writer, collate):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_round_trip_keeps_every_sample_lengths_and_layout(store: RaggedArray, arrays: list) -> None:
    """Every sample reads back equal, with its dtype, feature shape, length and offset."""
    assert len(store) == len(arrays)
    assert store.dtype == np.float32
    assert store.feature_shape == (3,)
    assert store.total_rows == sum(len(a) for a in arrays)
    assert store.lengths.tolist() == [len(a) for a in arrays]
    assert store.offsets.tolist() == [0, *np.cumsum([len(a) for a in arrays]).tolist()]
    for i, array in enumerate(arrays):
        assert store[i].dtype == array.dtype
        np.testing.assert_array_equal(store[i], array)
    for got, array in zip(store, arrays, strict=True):
        np.testing.assert_array_equal(got, array)
    assert store.nbytes == store.total_rows * 3 * 4


def test_files_are_plain_npy_readable_by_numpy_alone(store: RaggedArray, arrays: list) -> None:
    """values.npy and offsets.npy load with np.load; the manifest is JSON naming format and version."""
    values = np.load(store.path / VALUES)
    offsets = np.load(store.path / OFFSETS)
    assert offsets.dtype == np.int64
    assert offsets.shape == (len(arrays) + 1,)
    for i, array in enumerate(arrays):
        np.testing.assert_array_equal(values[offsets[i] : offsets[i + 1]], array)
    manifest = json.loads((store.path / MANIFEST).read_text())
    assert manifest["format"] == "shardwise.ragged"
    assert manifest["version"] == 1
    assert manifest["num_samples"] == len(arrays)
    assert manifest["files"][VALUES]["bytes"] == os.path.getsize(store.path / VALUES)


@pytest.mark.parametrize(
    ("dtype", "features"),
    [(np.float16, ()), (np.int64, (2, 2)), (np.bool_, (5,)), (np.uint8, (0,)), (np.complex64, (1,))],
)
def test_round_trip_for_dtypes_and_feature_shapes(tmp_path: Path, dtype: type, features: tuple) -> None:
    """Any numeric dtype and row shape, including 1-D samples and zero-width rows, reads back equal."""
    arrays = _samples(20, features, dtype)
    store = RaggedArray.write(tmp_path / "s", arrays)
    assert store.feature_shape == features
    for i, array in enumerate(arrays):
        np.testing.assert_array_equal(store[i], array)
        assert store.tensor(i).shape == array.shape


def test_empty_iterable_writes_a_valid_empty_store(tmp_path: Path) -> None:
    """No samples: a store of length 0 that opens, with the given or default dtype and feature shape."""
    empty = RaggedArray.write(tmp_path / "e", iter([]))
    assert (len(empty), empty.total_rows, empty.dtype, empty.feature_shape) == (0, 0, np.float64, ())
    assert empty.lengths.shape == (0,)
    assert empty.__getitems__([]) == []
    typed = RaggedArray.write(tmp_path / "t", [], dtype=np.int16, feature_shape=(4,))
    reopened = RaggedArray(typed.path)
    assert (reopened.dtype, reopened.feature_shape, len(reopened)) == (np.int16, (4,), 0)
    assert np.load(typed.path / VALUES).shape == (0, 4)
    with pytest.raises(IndexError, match="is empty"):
        empty[0]


def test_zero_row_samples_only(tmp_path: Path) -> None:
    """A store whose samples all have zero rows has no values bytes and still reads."""
    store = RaggedArray.write(tmp_path / "z", [np.zeros((0, 2), np.float32)] * 3)
    assert store.lengths.tolist() == [0, 0, 0]
    assert store[2].shape == (0, 2)
    assert store.tensor(1).shape == (0, 2)
    store.verify()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": object}, TypeError, r"dtype should be a numeric numpy dtype .*, but got dtype=<class 'object'>"),
        ({"dtype": "U3"}, TypeError, r"dtype should be a numeric numpy dtype"),
        ({"dtype": "not a dtype"}, TypeError, r"dtype should be a numeric numpy dtype"),
        ({"dtype": ">f4"}, TypeError, r"dtype should be in native byte order, but got dtype='>f4'"),
        ({"feature_shape": 3}, TypeError, r"feature_shape should be a tuple of non-negative integers"),
        ({"feature_shape": (3, -1)}, TypeError, r"feature_shape should be a tuple of non-negative integers"),
        ({"overwrite": 1}, TypeError, r"overwrite should be True or False, but got overwrite=1"),
    ],
)
def test_bad_writer_arguments_fail_at_construction(tmp_path: Path, kwargs: dict, error: type, match: str) -> None:
    """Writer arguments are checked before anything is created."""
    with pytest.raises(error, match=match):
        RaggedWriter(tmp_path / "s", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_existing_path_needs_overwrite_and_overwrite_spares_other_directories(tmp_path: Path, arrays: list) -> None:
    """An existing store is replaced only with overwrite=True; a directory that is not a store never is."""
    RaggedArray.write(tmp_path / "s", arrays)
    with pytest.raises(FileExistsError, match=r"already exists; pass overwrite=True"):
        RaggedArray.write(tmp_path / "s", arrays[:3])
    replaced = RaggedArray.write(tmp_path / "s", arrays[:3], overwrite=True)
    assert len(replaced) == 3
    assert _leftovers(tmp_path) == []
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"is not a ragged store or an empty directory"):
        RaggedArray.write(precious, arrays, overwrite=True)
    assert (precious / "thesis.tex").read_text() == "keep me"
