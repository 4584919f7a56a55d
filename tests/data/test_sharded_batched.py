"""``ShardedSource.__getitems__``: a batch read shard by shard returns what reading sample by sample returns."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from shardwise.data.sharded import OutputFormat, ShardCache, ShardedSource, ShardError
from shardwise.data.sharded.rows import table_rows
from shardwise.samplers.locality import LocalitySampler
from tests.data.shards import write_shards
from tests.s3_server import make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SIZES = [37, 5, 60, 23, 41]  # uneven shards
TOTAL = sum(SIZES)
BUCKET = "batched"


def _table(first: int, count: int) -> Any:
    ids = np.arange(first, first + count)
    tokens = [list(range(int(i % 7))) for i in ids]
    return pa.table({"id": ids, "text": ["w" * int(i % 17 + 1) for i in ids], "tokens": tokens})


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The same samples as local Parquet, Arrow IPC and WebDataset shards."""
    written = write_shards(tmp_path_factory.mktemp("batched"), SIZES, _table)
    return {suffix: [str(path) for path in paths] for suffix, paths in written.items()}


def _source(shards: dict[str, list[str]], suffix: str, tmp_path: Path, **kwargs: Any) -> ShardedSource:
    return ShardedSource(shards[suffix], cache=ShardCache(tmp_path / "cache"), index_dir=tmp_path / "index", **kwargs)


@pytest.mark.parametrize("suffix", ["parquet", "arrow", "tar"])
def test_a_batch_is_the_samples_one_by_one(shards: dict[str, list[str]], tmp_path: Path, suffix: str) -> None:
    """Shuffled ids across every shard, repeats included, a list or a numpy array: same rows, same order."""
    source = _source(shards, suffix, tmp_path, open_shards=2)  # fewer open shards than a batch touches
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.permutation(TOTAL), rng.integers(0, TOTAL, size=50)])
    expected = [source[int(i)] for i in ids]
    assert len({source.shard_of(int(i)) for i in ids[:32]}) > 2
    assert source.__getitems__(ids.tolist()) == expected
    assert source.__getitems__(ids) == expected
    for start in range(0, len(ids), 32):
        assert source.__getitems__(ids[start : start + 32].tolist()) == expected[start : start + 32]
    assert source.__getitems__([]) == []
    key = "id" if suffix != "tar" else "__key__"
    assert [row[key] for row in expected[:3]] == [
        int(i) if suffix != "tar" else f"s{int(i):06d}" for i in ids[:3]
    ]


def test_a_bad_index_raises_what_one_by_one_raises(shards: dict[str, list[str]], tmp_path: Path) -> None:
    """An index out of range, negative or not an integer: the very error ``source[i]`` raises."""
    source = _source(shards, "parquet", tmp_path)
    for bad in (TOTAL, -1, 2.5):
        with pytest.raises(Exception) as one:
            source[bad]  # type: ignore[index]
        with pytest.raises(type(one.value), match=str(one.value).replace("(", r"\(").replace(")", r"\)")):
            source.__getitems__([0, 3, bad])  # type: ignore[list-item]


def _plain(value: Any) -> Any:
    """An array, tensor or numpy scalar as the Python value ``"python"`` gives."""
    return value.tolist() if isinstance(value, (np.ndarray, np.generic, torch.Tensor)) else value


def _typed(row: dict[str, Any], output: str, suffix: str) -> dict[str, Any]:
    """``row`` as Python values, after checking each value has ``output``'s type (numbers and lists of numbers)."""
    numeric = {"numpy": (np.ndarray, np.generic), "torch": (torch.Tensor,), "python": (int, list)}[output]
    for key, value in row.items():
        if suffix == "tar":
            assert isinstance(value, (bytes, str)), (key, value)
        elif key in ("id", "tokens"):
            assert isinstance(value, numeric), (output, key, value)
            if output != "python":
                assert value.ndim == (1 if key == "tokens" else 0)
        else:
            assert isinstance(value, str), (key, value)  # strings stay Python strings in every format
    return {key: _plain(value) for key, value in row.items()}


@pytest.mark.parametrize("suffix", ["parquet", "arrow", "tar"])
@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_each_output_format_is_the_python_rows_converted(shards: dict[str, list[str]], tmp_path: Path, suffix: str,
                                                         output: str) -> None:
    """``output_format`` and ``with_format``: by ``__getitem__`` and ``__getitems__``, the python rows, converted."""
    python = _source(shards, suffix, tmp_path, open_shards=2)
    built = _source(shards, suffix, tmp_path, open_shards=2, output_format=output)
    copied = python.with_format(output)
    assert built.output_format is copied.output_format is OutputFormat(output)
    assert python.output_format is OutputFormat.PYTHON  # with_format leaves the source as it was
    ids = np.random.default_rng(1).permutation(TOTAL)[:70].tolist()
    expected = python.__getitems__(ids)
    for source in (built, copied):
        assert [_typed(row, output, suffix) for row in source.__getitems__(ids)] == expected
        assert [_typed(source[i], output, suffix) for i in ids[:20]] == expected[:20]
    if suffix != "tar":
        row = built.__getitems__([40])[0]
        assert row["tokens"].dtype == (np.int64 if output == "numpy" else torch.int64)
        row["tokens"][0] = 99  # writable, and a copy: the shard's rows are unchanged
        assert built[40]["tokens"][0] == 0
    assert repr(built).endswith(f"output_format={output!r})")
    if suffix != "tar":  # only numbers and lists of numbers: rows are cut from numpy views of each shard
        numbers = _source(shards, suffix, tmp_path, open_shards=2, output_format=output, columns=["tokens", "id"])
        narrow_source = _source(shards, suffix, tmp_path, open_shards=2, columns=["tokens", "id"])
        narrow = narrow_source.__getitems__(ids)

        def narrow_row(i: int) -> dict[str, Any]:
            return narrow_source[i]

        assert [_typed(row, output, suffix) for row in numbers.__getitems__(ids)] == narrow
        assert [_typed(numbers[i], output, suffix) for i in ids[:20]] == narrow[:20]
        # Parquet: compacted to one chunk a column; an Arrow file of several record batches stays mapped, uncopied
        assert all((reader.numeric is not None) == (suffix == "parquet" or reader.table.column(0).num_chunks == 1)
                   for reader in numbers._readers.values())
        # one batch from a shard read from views (shard 1: 5 rows, one chunk) and one read with take (shard 0)
        assert [_typed(row, output, suffix) for row in numbers.__getitems__([38, 0, 39])] == [narrow_row(i)
                                                                                          for i in (38, 0, 39)]
        assert numbers._readers[1].numeric is not None
        assert (numbers._readers[0].numeric is None) == (suffix == "arrow")
        assert all(reader.numeric is None for reader in built._readers.values())  # strings: Arrow's take
        row = numbers[40]
        row["tokens"][0] = 99
        assert numbers[40]["tokens"][0] == 0 and list(row) == ["tokens", "id"]


def test_output_formats_of_every_column_kind() -> None:
    """Numbers, lists (variable, large, fixed size), strings, missing values, sliced tables: the python rows, typed."""
    table = pa.table({
        "i": pa.array([1, None, 3, 4, 5]), "u16": pa.array([1, 2, 3, 4, 5], type=pa.uint16()),
        "f16": pa.array([1.5] * 5, type=pa.float16()), "b": pa.array([True, None, False, True, True]),
        "s": ["a", "b", None, "d", "e"],
        "ints": pa.array([[1], None, [2, 3], [], [4]]), "holes": pa.array([[1], None, [2, None], [], [3]]),
        "large": pa.array([[1, 2]] * 5, type=pa.large_list(pa.int8())),
        "fixed": pa.array([[1.0, 2.0]] * 5, type=pa.list_(pa.float32(), 2)),
        "nested": pa.array([[[1]], [[2, 3]], [], [[4]], [[5]]]),
    })
    for part in (table, table.slice(2, 3), table.slice(1, 0), table.take(pa.array([4, 0, 1]))):
        python = part.to_pylist()
        for output in OutputFormat:
            rows = table_rows(part, output)
            assert [{key: _plain(value) for key, value in row.items()} for row in rows] == python
    numpy, torch_rows = table_rows(table, OutputFormat.NUMPY), table_rows(table, OutputFormat.TORCH)
    assert type(numpy[0]["i"]) is np.int64 and numpy[1]["i"] is None and numpy[1]["ints"] is None
    assert numpy[0]["fixed"].dtype == np.float32 and numpy[0]["large"].dtype == np.int8
    assert numpy[0]["b"].dtype == bool and isinstance(torch_rows[2]["ints"], torch.Tensor)
    assert numpy[2]["holes"] == [2, None] and numpy[0]["nested"] == [[1]] and numpy[0]["s"] == "a"


def test_a_bad_output_format_names_the_choices(shards: dict[str, list[str]], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="output_format should be one of 'python', 'numpy', 'torch', but got "
                                         "output_format='np'"):
        _source(shards, "parquet", tmp_path, output_format="np")
    with pytest.raises(ValueError, match="type should be one of 'python', 'numpy', 'torch', but got type='pandas'"):
        _source(shards, "parquet", tmp_path).with_format("pandas")


class _OneByOne(Dataset[dict[str, Any]]):
    """The source read sample by sample: the DataLoader's fetcher falls back to ``__getitem__``."""

    def __init__(self, source: ShardedSource) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.source[index]


class _OnlyBatched(ShardedSource):
    """A source that fails if a sample is read one by one: proves the workers call ``__getitems__``."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        raise AssertionError(f"sample {index} was read one by one")


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


@pytest.mark.parametrize(("suffix", "output", "columns"),
                         [("parquet", "numpy", ["id", "tokens"]), ("arrow", "torch", None), ("tar", "python", None)])
def test_dataloader_workers_read_batches_the_same(shards: dict[str, list[str]], tmp_path: Path, suffix: str,
                                                  output: str, columns: list[str] | None) -> None:
    """2 forked workers under a LocalitySampler: the batches are those of a one-by-one dataset, via __getitems__,
    in every output format (arrays and tensors cross from the workers intact; numbers only: cut from numpy views)."""
    source = _OnlyBatched(shards[suffix], cache=ShardCache(tmp_path / "cache"), index_dir=tmp_path / "index",
                          output_format=output, columns=columns)
    def sampler() -> LocalitySampler:  # a fresh one per loader: the same plan
        return LocalitySampler(source, window=2, num_replicas=2, rank=1, seed=4)

    batched = list(DataLoader(source, sampler=sampler(), batch_size=8, num_workers=2, collate_fn=_rows,
                              multiprocessing_context="fork", timeout=120))
    reference = ShardedSource(shards[suffix], cache=ShardCache(tmp_path / "cache"), index_dir=tmp_path / "index",
                              columns=columns)
    one_by_one = list(DataLoader(_OneByOne(reference), sampler=sampler(), batch_size=8, collate_fn=_rows))
    assert [[_typed(row, output, suffix) for row in batch] for batch in batched] == one_by_one
    assert sum(len(batch) for batch in batched) == len(sampler()) > 8


def test_parquet_rows_do_not_import_pandas(shards: dict[str, list[str]], tmp_path: Path) -> None:
    """Reading Parquet rows (what every fresh DataLoader worker does) never imports pandas (seconds per worker)."""
    code = (
        "import sys\n"
        "from shardwise.data.sharded import ShardCache, ShardedSource\n"
        f"source = ShardedSource({shards['parquet']!r}, cache=ShardCache({str(tmp_path / 'cache')!r}), index_dir=False)\n"
        "print('pyarrow' in sys.modules)\n"  # imported by the constructor: forked workers inherit it
        "for fmt in ('python', 'numpy', 'torch'):\n"
        "    rows = source.with_format(fmt)\n"
        "    assert rows.__getitems__([3, 50, 1])[1]['id'] == 50 and rows[7]['id'] == 7\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    with s3_endpoint() as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        yield {"endpoint": endpoint, "fs": fs}


def test_a_missing_shard_names_its_url_and_the_sample(s3: dict[str, Any], shards: dict[str, list[str]],
                                                     tmp_path: Path) -> None:
    """A shard deleted after indexing: the batch's error names the URL and the sample one by one would name."""
    fs = s3["fs"]
    for s in range(3):
        fs.put(shards["parquet"][s], f"{BUCKET}/gone/{s}.parquet")
    cache = ShardCache(tmp_path / "cache", storage_options=storage_options(s3["endpoint"]))
    source = ShardedSource(f"s3://{BUCKET}/gone/", cache=cache, index_dir=tmp_path / "index")
    assert source.__getitems__([0, 50])[1]["id"] == 50  # shards 0 and 2 are cached and open
    fs.rm(f"{BUCKET}/gone/1.parquet")
    batch = [0, 45, 39, 40, 2]  # 39, 40 and 45: shard 1 holds ids 37..41, so 45 is in shard 2 and 39 comes first
    with pytest.raises(ShardError) as one:
        [source[i] for i in batch]
    with pytest.raises(ShardError, match=rf"s3://{BUCKET}/gone/1.parquet \(needed for sample 39\) does not exist"):
        source.__getitems__(batch)
    assert str(one.value).startswith(f"shard s3://{BUCKET}/gone/1.parquet (needed for sample 39)")


def test_parquet_columns_are_kept_and_a_missing_one_is_refused(shards: dict[str, list[str]], tmp_path: Path) -> None:
    """``columns=`` selects the columns of a row; a column no shard has is refused at construction, naming it and
    the columns every shard has (it was caught at the first read, blaming a file)."""
    source = _source(shards, "parquet", tmp_path, columns=["tokens", "id"])
    assert source.__getitems__([40, 2]) == [{"tokens": [0, 1, 2, 3, 4], "id": 40}, {"tokens": [0, 1], "id": 2}]
    with pytest.raises(ValueError, match=r"columns=\['id', 'nope'\].*'nope'.*\['id', 'text', 'tokens'\]"):
        _source(shards, "parquet", tmp_path, columns=["id", "nope"])


def _same(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """The same rows: same keys in the same order, each value of the same type (and dtype), equal."""
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert list(row) == list(want)
        for key, value in row.items():
            other = want[key]
            assert type(value) is type(other), (key, type(value), type(other))
            if isinstance(value, (np.ndarray, np.generic, torch.Tensor)):
                assert value.dtype == other.dtype and value.shape == other.shape, key
            assert _plain(value) == _plain(other), key


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("decode", ["node", "worker"])
def test_batches_of_numeric_shards_are_the_samples_one_by_one(s3: dict[str, Any], shards: dict[str, list[str]],
                                                             tmp_path: Path, where: str, decode: str) -> None:
    """Numbers and lists of numbers, local or S3 Parquet (decoded by the node or the worker), in every output format:
    batches across shards (fewer open than a batch touches, then all open: one loop over the rows, no shard read
    apart) give the rows, types and dtypes that reading sample by sample gives."""
    urls = shards["parquet"]
    if where == "s3":
        for s, path in enumerate(urls):
            s3["fs"].put(path, f"{BUCKET}/numeric-{decode}/{s}.parquet")
        urls = [f"s3://{BUCKET}/numeric-{decode}/{s}.parquet" for s in range(len(SIZES))]
    cache = ShardCache(tmp_path / "cache", storage_options=storage_options(s3["endpoint"]) if where == "s3" else None)
    base = ShardedSource(urls, cache=cache, index_dir=tmp_path / "index", columns=["tokens", "id"], decode=decode)
    ids = np.concatenate([np.random.default_rng(2).permutation(TOTAL), [40, 40, 0]]).tolist()
    batches = [ids[start : start + 32] for start in range(0, len(ids), 32)]
    for output in ("numpy", "torch", "python"):
        one = base.with_format(output)
        one.open_shards = 1
        expected = [one[i] for i in ids]  # the per-sample path, one shard open at a time
        few = base.with_format(output)
        few.open_shards = 2  # fewer than a batch touches: shards opened, and evicted, within a batch
        _same([row for batch in batches for row in few.__getitems__(batch)], expected)
        many = base.with_format(output)
        for i in range(0, TOTAL, 20):
            many[i]  # every shard open
        if output != "python":  # an open numeric shard is never read apart (no take, no Arrow table)
            many._rows_of = None  # type: ignore[assignment,method-assign]
        _same([row for batch in batches for row in many.__getitems__(batch)], expected)
        if output != "python":
            row = many.__getitems__([40])[0]
            row["tokens"][0] = 99  # writable, and a copy: the shard's rows are unchanged
            assert many[40]["tokens"][0] == 0
