"""RaggedArray and RaggedWriter: round trips, zero-copy reads, atomic writes, refusing damaged stores."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from shardwise import BucketBatchSampler, PadCollate, RaggedArray, RaggedStoreError, RaggedWriter, ShardedSampler
from shardwise._core.files import sampled_crc
from shardwise.data.ragged import MANIFEST, OFFSETS, VALUES

ROOT = Path(__file__).resolve().parents[1]


def _samples(n: int = 50, features: tuple[int, ...] = (3,), dtype: type = np.float32, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 12, n)
    rows[:2] = 0  # zero-row samples at the start are legal
    return [(rng.standard_normal((int(r), *features)) * 100).astype(dtype) for r in rows]


@pytest.fixture
def arrays() -> list:
    return _samples()


@pytest.fixture
def store(tmp_path: Path, arrays: list) -> RaggedArray:
    return RaggedArray.write(tmp_path / "store", arrays)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _rewrite_manifest(path: Path, **changes: object) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest.update(changes)
    (path / MANIFEST).write_text(json.dumps(manifest))


def _rewrite_offsets(path: Path, edit) -> None:
    """Change the offsets in place and fix their checksum, so only the structural check can object."""
    offsets = np.load(path / OFFSETS)
    edit(offsets)
    np.save(path / OFFSETS, offsets)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"][OFFSETS]["crc32"] = zlib.crc32(offsets.tobytes())
    (path / MANIFEST).write_text(json.dumps(manifest))


# -- round trip ----------------------------------------------------------------------------------


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


def test_writer_accepts_tensors_and_lists(tmp_path: Path) -> None:
    """CPU tensors and nested lists are samples too; their dtype must still match."""
    with RaggedWriter(tmp_path / "s") as writer:
        writer.append(torch.ones(2, 3, dtype=torch.float64))
        writer.append([[1.0, 2.0, 3.0]])
        assert (writer.num_samples, writer.total_rows) == (2, 3)
    store = RaggedArray(tmp_path / "s")
    assert store.dtype == np.float64
    assert store[1].tolist() == [[1.0, 2.0, 3.0]]


def test_writer_keeps_offsets_beyond_its_buffer(tmp_path: Path) -> None:
    """More samples than the writer buffers offsets for: every offset reaches the file."""
    n = (1 << 16) + 5
    store = RaggedArray.write(tmp_path / "s", (np.full((i % 3, 1), i, np.int32) for i in range(n)))
    assert len(store) == n
    assert store.lengths.tolist() == [i % 3 for i in range(n)]
    assert store[n - 1].tolist() == [[n - 1]] * ((n - 1) % 3)


def test_progress_bar_shows_samples_written(tmp_path: Path, arrays: list, capsys: pytest.CaptureFixture) -> None:
    """progress=True draws a tqdm bar counting samples."""
    RaggedArray.write(tmp_path / "s", arrays, progress=True)
    assert f"{len(arrays)}/{len(arrays)}" in capsys.readouterr().err


def test_progress_without_tqdm_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tqdm installed, progress=True names the extra to install and leaves nothing behind."""
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r"pip install 'shardwise\[progress\]'"):
        RaggedArray.write(tmp_path / "s", [np.zeros((1, 1))], progress=True)
    assert not (tmp_path / "s").exists()
    assert _leftovers(tmp_path) == []


# -- reading -------------------------------------------------------------------------------------


def test_item_is_a_read_only_view_of_the_mapping(store: RaggedArray) -> None:
    """store[i] shares memory with the mapped values and refuses writes."""
    item = store[int(np.flatnonzero(store.lengths)[0])]
    assert np.shares_memory(item, store.values)
    assert not item.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        item[...] = 0


def test_tensor_shares_the_mapped_pages_without_warning(store: RaggedArray, arrays: list) -> None:
    """store.tensor(i) is the same memory as store[i], built without torch's non-writable warning."""
    a, b, c = np.flatnonzero(store.lengths)[[0, 1, -1]].tolist()
    for i in (a, b, c):
        tensor = store.tensor(i)
        assert tensor.data_ptr() == store[i].ctypes.data
        assert torch.equal(tensor, torch.from_numpy(arrays[i]))
    batch = store.tensors([c, a, c])
    assert [t.data_ptr() for t in batch] == [store[c].ctypes.data, store[a].ctypes.data, store[c].ctypes.data]


def test_tensor_keeps_the_mapping_alive(tmp_path: Path, arrays: list) -> None:
    """A tensor outlives the store object that made it."""
    store = RaggedArray.write(tmp_path / "s", arrays)
    tensor = store.tensor(9)
    del store
    assert torch.equal(tensor, torch.from_numpy(arrays[9]))


def test_getitems_returns_views_in_order(store: RaggedArray, arrays: list) -> None:
    """__getitems__ gives the samples of a batch in its order, repeats included, from lists or arrays."""
    indices = [4, 0, 49, 4, 13]
    for batch in (store.__getitems__(indices), store.__getitems__(np.array(indices, dtype=np.int32))):
        assert len(batch) == len(indices)
        for got, i in zip(batch, indices, strict=True):
            np.testing.assert_array_equal(got, arrays[i])
            assert np.shares_memory(got, store.values) or got.size == 0


@pytest.mark.parametrize("index", [-1, -50, 50, 10**12])
def test_out_of_range_index_is_refused(store: RaggedArray, index: int) -> None:
    """Negative and past-the-end indices raise IndexError naming the index and the valid range."""
    kind = "negative" if index < 0 else "past the end"
    with pytest.raises(IndexError, match=rf"index {index} is out of range for a store of 50 samples \(0..49; {kind}"):
        store[index]
    with pytest.raises(IndexError, match=rf"index {index} is out of range"):
        store.tensor(index)
    with pytest.raises(IndexError, match=rf"index {index} is out of range"):
        store.__getitems__([0, index])


@pytest.mark.parametrize("index", [True, 1.0, "1", slice(0, 2), None])
def test_non_integer_index_is_refused(store: RaggedArray, index: object) -> None:
    """Indices that are not integers (bool included) raise TypeError pointing to __getitems__."""
    with pytest.raises(TypeError, match=r"index should be an integer, but got index=.*__getitems__"):
        store[index]


@pytest.mark.parametrize("indices", [[1.5, 2.0], [[1, 2]], ["a"]])
def test_bad_batch_of_indices_is_refused(store: RaggedArray, indices: object) -> None:
    """__getitems__ wants a 1-D sequence of integers."""
    with pytest.raises(TypeError, match=r"indices should be a 1-D sequence of integers"):
        store.__getitems__(indices)


def test_lengths_are_read_only_and_feed_a_batch_sampler(store: RaggedArray) -> None:
    """lengths is an int64 array from the offsets, read-only, usable by samplers."""
    lengths = store.lengths
    assert lengths.dtype == np.int64
    assert not lengths.flags.writeable
    assert not np.shares_memory(lengths, store.values)
    assert lengths is store.lengths


def test_pickle_carries_the_path_not_the_data(tmp_path: Path) -> None:
    """A pickled store is a few hundred bytes whatever its size, and reopens the same data."""
    store = RaggedArray.write(tmp_path / "s", [np.ones((1000, 64), np.float32)] * 20)
    blob = pickle.dumps(store)
    assert len(blob) < 500 < store.nbytes
    copy = pickle.loads(blob)
    assert copy.path == store.path
    assert copy.manifest == store.manifest
    np.testing.assert_array_equal(copy[19], store[19])


def test_reopening_after_unpickle_rechecks_the_store(store: RaggedArray) -> None:
    """A store damaged between pickling and unpickling is refused in the worker, not read as garbage."""
    blob = pickle.dumps(store)
    with open(store.path / VALUES, "r+b") as file:
        file.truncate(os.path.getsize(store.path / VALUES) - 4)
    with pytest.raises(RaggedStoreError, match="truncated"):
        pickle.loads(blob)


def test_dataloader_spawned_workers_read_every_sample_once(store: RaggedArray, arrays: list) -> None:
    """Two spawned DataLoader workers (the store pickled to them) with PadCollate cover the store once."""
    batches = list(BatchSampler(ShardedSampler(store, num_replicas=1, rank=0, seed=3), batch_size=8, drop_last=False))
    loader = DataLoader(
        store, batch_sampler=batches, collate_fn=PadCollate(padding_value=-1.0), num_workers=2,
        multiprocessing_context="spawn",
    )  # fmt: skip
    seen: Counter = Counter()
    for (data, lengths, mask), indices in zip(loader, batches, strict=True):
        for b, i in enumerate(indices):
            np.testing.assert_array_equal(data[b, : lengths[b]].numpy(), arrays[i])
            assert int(mask[b].sum()) == len(arrays[i])
            seen[i] += 1
    assert seen == Counter(range(len(arrays)))


# -- writing: validation and atomicity -----------------------------------------------------------


def test_dtype_that_differs_names_the_sample(tmp_path: Path) -> None:
    """A sample whose dtype differs from the store's fails naming its index and where the dtype came from."""
    samples = [np.zeros((2, 3), np.float32), np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float64)]
    with pytest.raises(TypeError, match=r"sample 2 has dtype float64, but the store holds float32 \(set by sample 0\)"):
        RaggedArray.write(tmp_path / "s", samples)
    with pytest.raises(TypeError, match=r"sample 0 has dtype float32, but the store holds float16 \(set by the dtype"):
        RaggedArray.write(tmp_path / "s", samples, dtype=np.float16)
    assert not (tmp_path / "s").exists()
    assert _leftovers(tmp_path) == []


def test_feature_shape_that_differs_names_the_sample(tmp_path: Path) -> None:
    """A sample whose row shape differs fails naming its index, its shape and the store's."""
    samples = [np.zeros((2, 3)), np.zeros((0, 3)), np.zeros((4, 2))]
    with pytest.raises(ValueError, match=r"sample 2 has shape \(4, 2\), so feature shape \(2,\), but the store holds "
                       r"rows of shape \(3,\) \(set by sample 0\)"):  # fmt: skip
        RaggedArray.write(tmp_path / "s", samples)
    with pytest.raises(ValueError, match=r"sample 0 .* \(set by the feature_shape argument\)"):
        RaggedArray.write(tmp_path / "s", samples, feature_shape=(4,))
    with pytest.raises(ValueError, match=r"sample 1 is a scalar, but every sample needs a rows axis"):
        RaggedArray.write(tmp_path / "s", [np.zeros(2), np.float64(1.0)])
    assert _leftovers(tmp_path) == []


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


def test_sample_of_unsupported_dtype_is_refused(tmp_path: Path) -> None:
    """A first sample of strings or objects names itself."""
    with pytest.raises(TypeError, match=r"sample 0's dtype should be a numeric numpy dtype"):
        RaggedArray.write(tmp_path / "s", [np.array(["a", "b"])])


def test_failure_in_the_iterable_leaves_nothing(tmp_path: Path) -> None:
    """An exception raised by the samples' iterable leaves no store and no temporary directory."""

    def broken():
        yield np.zeros((3, 2))
        raise OSError("disk of the source went away")

    with pytest.raises(OSError, match="went away"):
        RaggedArray.write(tmp_path / "s", broken())
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


def test_closed_writer_refuses_more_samples(tmp_path: Path) -> None:
    """append after close raises instead of corrupting the finished store."""
    writer = RaggedWriter(tmp_path / "s")
    writer.append(np.zeros((1, 1)))
    writer.close()
    with pytest.raises(ValueError, match="is closed"):
        writer.append(np.zeros((1, 1)))
    assert len(RaggedArray(tmp_path / "s")) == 1


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    """abort() deletes everything written so far."""
    writer = RaggedWriter(tmp_path / "s")
    writer.append(np.zeros((5, 1)))
    writer.abort()
    assert list(tmp_path.iterdir()) == []


_CRASH = """
import os, sys
import numpy as np
from shardwise import RaggedWriter
writer = RaggedWriter(sys.argv[1])
for i in range(100):
    writer.append(np.full((i, 4), i, np.float32))
writer._values.flush()
os._exit(3)  # killed mid-write: no close, no cleanup
"""


def test_crash_mid_write_never_leaves_a_store_that_opens(tmp_path: Path) -> None:
    """A process killed while writing leaves no store at the path, and its partial directory does not open."""
    result = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path / "s")], check=False)
    assert result.returncode == 3
    assert not (tmp_path / "s").exists()
    (partial,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert partial.name.startswith(".s.") and partial.name.endswith(".partial")
    assert (partial / VALUES).stat().st_size > 0
    with pytest.raises(RaggedStoreError, match=r"is not a finished ragged store: manifest.json is missing"):
        RaggedArray(partial)


def _write_until_killed(path: str, ready: Any) -> None:
    writer = RaggedWriter(path, overwrite=True)
    for i in range(50):
        writer.append(np.full((i, 4), i, np.float32))
    writer._values.flush()
    ready.set()
    time.sleep(60)  # killed long before


def _partials(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.endswith(".partial"))


def test_writer_killed_by_sigkill_leaves_a_partial_the_next_writer_removes(tmp_path: Path) -> None:
    """A writer killed by SIGKILL leaves its .partial directory; the next writer to that path removes it."""
    context = multiprocessing.get_context("fork")  # no re-import of torch: the child only writes
    ready = context.Event()
    child = context.Process(target=_write_until_killed, args=(str(tmp_path / "s"), ready))
    child.start()
    try:
        assert ready.wait(60)
        (stale,) = _partials(tmp_path)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    finally:
        child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert (tmp_path / stale / VALUES).stat().st_size > 0  # nearly the size of the store, and nobody owns it
    with RaggedWriter(tmp_path / "s") as writer:
        assert stale not in _partials(tmp_path)  # gone as soon as the next writer starts
        writer.append(np.ones((2, 4), np.float32))
    assert RaggedArray(tmp_path / "s").lengths.tolist() == [2]
    assert _leftovers(tmp_path) == []


def test_a_live_writers_partial_is_never_removed(tmp_path: Path) -> None:
    """A second writer to the same path leaves the first's directory alone; each publishes, the last one wins."""
    first = RaggedWriter(tmp_path / "s", overwrite=True)
    first.append(np.zeros((1, 2), np.float32))
    second = RaggedWriter(tmp_path / "s", overwrite=True)
    assert first._tmp.is_dir() and len(_partials(tmp_path)) == 2
    second.append(np.zeros((3, 2), np.float32))
    second.close()
    first.close()
    assert RaggedArray(tmp_path / "s").lengths.tolist() == [1]
    assert _leftovers(tmp_path) == []


def _race(path: str, start: Any, worker: int) -> None:
    start.wait(60)
    for round_ in range(3):
        RaggedArray.write(path, [np.full((worker + 1, 2), round_, np.int16)] * 20, overwrite=True)


def test_racing_writers_remove_stale_partials_once_and_both_publish(tmp_path: Path) -> None:
    """Two writers racing over 30 dead writers' leftovers remove every one, never each other's, and both publish."""
    for k in range(30):
        stem = tmp_path / f".s.dead{k:02d}"
        (tmp_path / f"{stem.name}.partial").mkdir()
        (tmp_path / f"{stem.name}.partial" / VALUES).write_bytes(b"x" * 1000)
        if k % 3:  # a dead writer's lock file, unlocked; every third has none, as an older release left them
            (tmp_path / f"{stem.name}.partial.lock").touch()
    (tmp_path / ".s.dead99.old").mkdir()  # a finished replace's copy of the previous store, owner gone
    context = multiprocessing.get_context("fork")
    start = context.Event()
    racers = [context.Process(target=_race, args=(str(tmp_path / "s"), start, w)) for w in range(2)]
    for racer in racers:
        racer.start()
    start.set()
    for racer in racers:
        racer.join(120)
    assert [racer.exitcode for racer in racers] == [0, 0]
    store = RaggedArray(tmp_path / "s")
    store.verify()
    assert store.lengths.tolist() in ([1] * 20, [2] * 20)
    assert _leftovers(tmp_path) == []


def test_verify_detects_a_file_truncated_or_replaced_after_open(tmp_path: Path) -> None:
    """verify() names a values file truncated, or an offsets file replaced, since open, without touching the mapping."""
    store = RaggedArray.write(tmp_path / "s", [np.ones((4096, 4), np.float32)] * 4)
    store.verify()
    with open(tmp_path / "s" / VALUES, "r+b") as file:
        file.truncate(4096)
    with pytest.raises(RaggedStoreError, match=r"values.npy is 4096 bytes, but the manifest says \d+: the file was truncated "
                       r"since this store was opened \(reading a mapped page past its new end kills the process"):  # fmt: skip
        store.verify()
    other = RaggedArray.write(tmp_path / "t", [np.ones((1, 4), np.float32)] * 4)
    shutil.copy(tmp_path / "s" / OFFSETS, tmp_path / "t.offsets")
    os.replace(tmp_path / "t.offsets", tmp_path / "t" / OFFSETS)  # same bytes, another file
    with pytest.raises(RaggedStoreError, match=r"offsets.npy was replaced since this store was opened"):
        other.verify()


def _read_after_truncation(path: str) -> None:
    faulthandler.disable()  # pytest's would print a stack dump for the expected SIGBUS
    store = RaggedArray(path)
    with open(Path(path) / VALUES, "r+b") as file:
        file.truncate(4096)
    os._exit(0 if float(store[3].sum()) >= 0 else 1)  # reads pages past the new end


def test_reading_a_mapping_truncated_underneath_dies_with_sigbus(tmp_path: Path) -> None:
    """What docs/ragged-store.md warns of: a mapped page past a truncated file's end is SIGBUS, not an exception."""
    RaggedArray.write(tmp_path / "s", [np.ones((4096, 4), np.float32)] * 4)
    child = multiprocessing.get_context("fork").Process(target=_read_after_truncation, args=(str(tmp_path / "s"),))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGBUS


# -- opening damaged or mismatched stores --------------------------------------------------------


def _truncate(name: str, nbytes: int):
    def damage(path: Path) -> None:
        with open(path / name, "r+b") as file:
            file.truncate(os.path.getsize(path / name) - nbytes)

    return damage


def _cut_header(path: Path) -> None:
    with open(path / VALUES, "r+b") as file:
        file.truncate(50)


def _append_bytes(path: Path) -> None:
    with open(path / VALUES, "ab") as file:
        file.write(b"\0" * 12)


def _flip_first_value_byte(path: Path) -> None:
    header = json.loads((path / MANIFEST).read_text())["files"][VALUES]["header_bytes"]
    with open(path / VALUES, "r+b") as file:
        file.seek(header)
        byte = file.read(1)
        file.seek(header)
        file.write(bytes([byte[0] ^ 0xFF]))


def _shift_one_offset(path: Path) -> None:
    """Move one sample boundary by a row: still monotonic, so only the checksum can tell."""
    offsets = np.load(path / OFFSETS)
    k = int(np.flatnonzero(np.diff(offsets) >= 2)[0]) + 1
    header = os.path.getsize(path / OFFSETS) - offsets.nbytes
    with open(path / OFFSETS, "r+b") as file:
        file.seek(header + 8 * k)
        file.write(np.int64(offsets[k] + 1).tobytes())


def _swap_offsets(path: Path) -> None:
    def edit(offsets: np.ndarray) -> None:
        offsets[10], offsets[11] = offsets[11] + 1, offsets[10]

    _rewrite_offsets(path, edit)


def _shift_last_offset(path: Path) -> None:
    def edit(offsets: np.ndarray) -> None:
        offsets[-1] -= 1

    _rewrite_offsets(path, edit)


def _replace_values_with_other_dtype(path: Path) -> None:
    values = np.load(path / VALUES)
    np.save(path / VALUES, values.view(np.int32))


DAMAGE = {
    "missing manifest": (lambda p: (p / MANIFEST).unlink(), r"manifest.json is missing"),
    "missing values": (lambda p: (p / VALUES).unlink(), r"values.npy is missing from the ragged store"),
    "missing offsets": (lambda p: (p / OFFSETS).unlink(), r"offsets.npy is missing from the ragged store"),
    "truncated values": (_truncate(VALUES, 4), r"values.npy is \d+ bytes, but the manifest says \d+: the file is trunc"),
    "truncated offsets": (_truncate(OFFSETS, 8), r"offsets.npy is \d+ bytes, .*: the file is truncated"),
    "values header cut": (_cut_header, r"values.npy is not a readable .npy file"),
    "values too long": (_append_bytes, r"values.npy is \d+ bytes, .*: the file is longer than written"),
    "values corrupted": (_flip_first_value_byte, r"values.npy fails its sampled checksum"),
    "offsets corrupted": (_shift_one_offset, r"offsets.npy fails its checksum"),
    "offsets not monotonic": (_swap_offsets, r"offsets.npy decreases at sample 10 \(offset \d+ then \d+\)"),
    "offsets end early": (_shift_last_offset, r"offsets.npy ends at \d+, but the store has total_rows=\d+"),
    "values of another dtype": (_replace_values_with_other_dtype, r"values.npy holds int32 .*but the manifest says float32"),
    "other version": (lambda p: _rewrite_manifest(p, version=2), r"has version=2, but this shardwise reads version 1"),
    "other format": (lambda p: _rewrite_manifest(p, format="zarr"), r"has format='zarr', but RaggedArray reads format"),
    "bad field": (lambda p: _rewrite_manifest(p, num_samples="50"), r"field 'num_samples' should be a int"),
    "bad dtype field": (lambda p: _rewrite_manifest(p, dtype="O"), r"dtype should be a numeric numpy dtype"),
    "not json": (lambda p: (p / MANIFEST).write_text("{'format':"), r"manifest.json is not valid JSON"),
    "json list": (lambda p: (p / MANIFEST).write_text("[]"), r"manifest.json should hold a JSON object"),
    "no file entry": (lambda p: _rewrite_manifest(p, files={}), r"has no entry for 'values.npy' under 'files'"),
}  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_store_is_refused_with_what_is_wrong(store: RaggedArray, damage: str) -> None:
    """Every kind of damage is named when opening; nothing is ever read as garbage."""
    break_it, match = DAMAGE[damage]
    break_it(store.path)
    with pytest.raises(RaggedStoreError, match=match):
        RaggedArray(store.path)


def test_store_of_other_dtype_or_feature_shape_than_asked_is_refused(store: RaggedArray) -> None:
    """dtype= and feature_shape= at open state what the caller expects; a mismatch is named."""
    assert RaggedArray(store.path, dtype="float32", feature_shape=(3,)).dtype == np.float32
    with pytest.raises(RaggedStoreError, match=r"holds dtype float32, but dtype=float64 was asked"):
        RaggedArray(store.path, dtype=np.float64)
    with pytest.raises(RaggedStoreError, match=r"holds rows of shape \(3,\), but feature_shape=\(4,\) was asked"):
        RaggedArray(store.path, feature_shape=(4,))


def test_missing_or_file_path_is_refused(tmp_path: Path) -> None:
    """A path that does not exist, or is a file, is named."""
    with pytest.raises(FileNotFoundError, match=r"path should be a ragged store directory, but got path='.*nowhere', which does not exist"):
        RaggedArray(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"path should be a ragged store directory, but got path='.*file', which is a file"):
        RaggedArray(tmp_path / "file")


def test_verify_finds_corruption_the_sampled_check_misses(tmp_path: Path) -> None:
    """A byte changed between the sampled blocks opens, but verify() reads every byte and refuses it."""
    store = RaggedArray.write(tmp_path / "s", [np.zeros((1000, 64), np.float32)] * 10)
    store.verify()
    middle = store.manifest["files"][VALUES]["header_bytes"] + 4096 * 16 + 100
    with open(store.path / VALUES, "r+b") as file:
        file.seek(middle)
        file.write(b"\x07")
    reopened = RaggedArray(store.path)
    with pytest.raises(RaggedStoreError, match=r"values.npy fails its checksum"):
        reopened.verify()


# -- larger than what the process may allocate ---------------------------------------------------


def _seal(path: Path) -> None:
    """Write the manifest for values.npy and offsets.npy made with numpy alone (as any tool could)."""
    values = np.load(path / VALUES, mmap_mode="r")
    offsets = np.load(path / OFFSETS)
    entries = {}
    for name, array in ((VALUES, values), (OFFSETS, offsets)):
        size = os.path.getsize(path / name)
        header = size - array.nbytes
        crc = 0
        with open(path / name, "rb") as file:
            file.seek(header)
            while chunk := file.read(1 << 24):
                crc = zlib.crc32(chunk, crc)
        entries[name] = {"bytes": size, "header_bytes": header, "crc32": crc}
    entries[VALUES]["sampled_crc32"] = sampled_crc(
        path / VALUES, entries[VALUES]["header_bytes"], entries[VALUES]["bytes"]
    )
    manifest = {
        "format": "shardwise.ragged", "version": 1, "dtype": values.dtype.str, "feature_shape": list(values.shape[1:]),
        "num_samples": len(offsets) - 1, "total_rows": int(values.shape[0]), "files": entries,
    }  # fmt: skip
    (path / MANIFEST).write_text(json.dumps(manifest))


_LIMITED = """
import os, resource, sys
import numpy as np
import torch
from shardwise import RaggedArray, RaggedWriter, pad_collate

torch.set_num_threads(1)

def status(key):
    with open("/proc/self/status") as file:
        return next(int(line.split()[1]) * 1024 for line in file if line.startswith(key + ":"))

headroom = int(sys.argv[2])
# RLIMIT_DATA caps private writable memory (heap, anonymous mmaps), never read-only file mappings.
limit = status("VmData") + headroom
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
anon_before = status("RssAnon")
size = int(sys.argv[3])
try:
    np.ones(size, np.uint8)
except MemoryError:
    pass
else:
    raise SystemExit("the limit does not bite: this process could allocate the whole store")
if sys.argv[1] == "read":
    store = RaggedArray(sys.argv[4])
    assert store.nbytes >= size, (store.nbytes, size)
    total, rows = 0.0, 0
    order = np.argsort(store.lengths, kind="stable")
    for start in range(0, len(store), 8):
        batch = pad_collate(store.__getitems__(order[start:start + 8]))
        total += float(batch.data[:, 0, 0].sum())
        rows += int(batch.lengths.sum())
    expected = float(np.arange(len(store)).sum())
    assert rows == store.total_rows and total == expected, (rows, total, expected)
else:
    with RaggedWriter(sys.argv[4]) as writer:
        for i in range(size // (1 << 20) + 8):
            writer.append(np.full((1 << 18,), i, np.float32))
grown = status("RssAnon") - anon_before
assert grown < headroom, grown
print("anon growth MB", grown >> 20)
"""


def _run_limited(mode: str, headroom: int, size: int, path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LIMITED), mode, str(headroom), str(size), str(path)],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_store_larger_than_the_process_may_allocate_is_read_whole(tmp_path: Path) -> None:
    """A 512 MB store reads end to end under RLIMIT_DATA allowing 96 MB more, where copying it would fail.

    Method: the store is a sparse file (one non-zero row per sample, a few MB on disk). A child
    process caps its data segment with RLIMIT_DATA (Linux >= 4.7 counts private writable mappings:
    heap and anonymous memory) at its current size + 96 MB, checks that allocating the store's size
    raises MemoryError, then reads every sample through __getitems__ + pad_collate. RLIMIT_AS would
    not do: it counts the read-only file mapping too, and the mapping is the point. The mapped pages
    are page cache, shared and reclaimable; the child also checks its anonymous RSS grew < 96 MB.
    """
    path = tmp_path / "big"
    path.mkdir()
    n, features = 1024, 256
    rng = np.random.default_rng(1)
    lengths = rng.integers(256, 768, n)  # ~512 rows of 1 KiB each: ~512 MB
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = np.lib.format.open_memmap(path / VALUES, mode="w+", dtype=np.float32, shape=(int(offsets[-1]), features))
    values[offsets[:-1], 0] = np.arange(n)  # touches one page per sample; the rest stays a hole
    values.flush()
    del values
    np.save(path / OFFSETS, offsets)
    _seal(path)
    size = 400 << 20
    assert RaggedArray(path).nbytes > size
    assert os.stat(path / VALUES).st_blocks * 512 < 64 << 20  # sparse: small on disk
    _run_limited("read", 96 << 20, size, path)


def test_writer_memory_stays_bounded(tmp_path: Path) -> None:
    """Writing more data than the process may allocate streams it: RLIMIT_DATA at current + 48 MB, 200 MB written."""
    _run_limited("write", 48 << 20, 192 << 20, tmp_path / "w")
    assert RaggedArray(tmp_path / "w").nbytes > 192 << 20
    shutil.rmtree(tmp_path / "w")  # 200 MB of real data: do not leave it in pytest's kept directories


# -- the 4-rank example --------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_example_four_ranks_read_every_sample_once_in_equal_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/ragged_bucket_ddp.py on 4 gloo ranks x 2 workers: equal steps, the plan dealt by position, each sample once."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import ragged_bucket_ddp as example

    store = example.write_store(tmp_path / "store", num_samples=300)
    reports = example.run(store.path, world_size=4)
    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    assert len({r["steps"] for r in reports}) == 1
    assert all(r["steps"] == r["len"] == len(r["batches"]) for r in reports)
    plan = list(BucketBatchSampler(store.lengths, max_tokens=example.MAX_TOKENS, seed=0, num_replicas=1, rank=0))
    dealt: dict[int, list[int]] = {}
    for report in reports:
        for k, batch in enumerate(report["batches"]):
            position = report["rank"] + 4 * k
            assert batch == plan[position % len(plan)]
            dealt[position] = batch
    assert sorted(dealt) == list(range(len(dealt)))
    assert len(plan) <= len(dealt) < len(plan) + 4  # padding wraps at most W - 1 batches
    once = Counter(i for position in range(len(plan)) for i in dealt[position])
    assert once == Counter(range(len(store)))
