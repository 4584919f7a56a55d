"""RaggedArray: zero-copy reads, indices, pickling, workers, verify(), opening, larger than memory, 4 ranks."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from shardwise import BucketBatchSampler, PadCollate, RaggedArray, RaggedStoreError, ShardedSampler
from shardwise._core.files import sampled_crc
from shardwise.data.ragged import MANIFEST, OFFSETS, VALUES
from tests.data.ragged.stores import _run_limited

ROOT = Path(__file__).resolve().parents[3]


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
