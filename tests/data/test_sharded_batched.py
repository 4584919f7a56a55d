"""``ShardedSource.__getitems__``: a batch read shard by shard returns what reading sample by sample returns."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset

from shardwise.data.sharded import ShardCache, ShardedSource, ShardError
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


@pytest.mark.parametrize("suffix", ["parquet", "tar"])
def test_dataloader_workers_read_batches_the_same(shards: dict[str, list[str]], tmp_path: Path, suffix: str) -> None:
    """2 forked workers under a LocalitySampler: the batches are those of a one-by-one dataset, via __getitems__."""
    source = _OnlyBatched(shards[suffix], cache=ShardCache(tmp_path / "cache"), index_dir=tmp_path / "index")
    def sampler() -> LocalitySampler:  # a fresh one per loader: the same plan
        return LocalitySampler(source, window=2, num_replicas=2, rank=1, seed=4)

    batched = list(DataLoader(source, sampler=sampler(), batch_size=8, num_workers=2, collate_fn=_rows,
                              multiprocessing_context="fork", timeout=120))
    reference = ShardedSource(shards[suffix], cache=ShardCache(tmp_path / "cache"), index_dir=tmp_path / "index")
    one_by_one = list(DataLoader(_OneByOne(reference), sampler=sampler(), batch_size=8, collate_fn=_rows))
    assert batched == one_by_one
    assert sum(len(batch) for batch in batched) == len(sampler()) > 8


def test_parquet_rows_do_not_import_pandas(shards: dict[str, list[str]], tmp_path: Path) -> None:
    """Reading Parquet rows (what every fresh DataLoader worker does) never imports pandas (seconds per worker)."""
    code = (
        "import sys\n"
        "from shardwise.data.sharded import ShardCache, ShardedSource\n"
        f"source = ShardedSource({shards['parquet']!r}, cache=ShardCache({str(tmp_path / 'cache')!r}), index_dir=False)\n"
        "assert source.__getitems__([3, 50, 1])[1]['id'] == 50 and source[7]['id'] == 7\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


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
    """``columns=`` selects the columns of a row; a column no shard has fails naming the shard, sample and column."""
    source = _source(shards, "parquet", tmp_path, columns=["tokens", "id"])
    assert source.__getitems__([40, 2]) == [{"tokens": [0, 1, 2, 3, 4], "id": 40}, {"tokens": [0, 1], "id": 2}]
    missing = _source(shards, "parquet", tmp_path, columns=["id", "nope"])
    with pytest.raises(ShardError, match=rf"shard {shards['parquet'][1]} \(needed for sample 40\) .*nope"):
        missing.__getitems__([40, 2])
