"""A shard rewritten after indexing, at the same byte size and row count, is refused before any of its samples is served.

On moto's S3 server (another ETag) and on local disk (another modification time), mid-epoch: the
samples read before the rewrite are the indexed ones, and the first batch that needs the rewritten
shard raises ``ShardError`` naming its URL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from shardwise.data.sharded import ShardCache, ShardedSource, ShardError
from shardwise.data.sharded.metadata import EXPANDED, IDENTITIES
from shardwise.samplers.locality import LocalitySampler
from tests.s3_server import make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SIZES = [24, 24, 24]
STARTS = np.cumsum([0, *SIZES])
NEW = 1000  # the rewritten shard's ids start here: any served id >= NEW came from the new content
BUCKET = "changed"


def _write(path: Path, first: int, count: int) -> None:
    """Fixed-width ids, no compression, dictionary or statistics: another ``first`` gives the same byte size."""
    pq.write_table(pa.table({"id": np.arange(first, first + count)}), path, compression="none",
                   use_dictionary=False, write_statistics=False)


def _shards(root: Path) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"{s}.parquet" for s in range(len(SIZES))]
    for path, first, count in zip(paths, STARTS, SIZES, strict=False):
        _write(path, int(first), count)
    return paths


def _rewritten(root: Path, shard: int) -> Path:
    """Shard ``shard``'s new content (ids from ``NEW``) at the same byte size, in a file of its own."""
    path = root / f"new-{shard}.parquet"
    _write(path, NEW, SIZES[shard])
    assert path.stat().st_size == (root / f"{shard}.parquet").stat().st_size
    return path


def _read_until_error(source: ShardedSource, rewrite: Any, workers: int = 0) -> tuple[list[int], ShardError]:
    """Shard order (no shuffle, no prefetch), batches of 8: ``rewrite()`` after the first batch; the ids served, the error."""
    sampler = LocalitySampler(source, shuffle=False, num_replicas=1, rank=0)
    loader = DataLoader(source, sampler=sampler, batch_size=8, collate_fn=lambda rows: rows, num_workers=workers,
                        multiprocessing_context="fork" if workers else None, timeout=60 if workers else 0)
    served: list[int] = []
    with pytest.raises(ShardError) as raised:
        for step, batch in enumerate(loader):
            served.extend(int(row["id"]) for row in batch)
            if step == 0:
                rewrite()
    return served, raised.value


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with s3_endpoint() as endpoint:
        yield {"endpoint": endpoint, "fs": make_bucket(endpoint, BUCKET)}


@pytest.mark.parametrize("decode", ["node", "worker"])
def test_a_shard_rewritten_on_s3_mid_epoch_is_refused(s3: dict[str, Any], tmp_path: Path, decode: str) -> None:
    """Same size, same rows, another ETag: ShardError naming the URL; every sample served is an indexed one."""
    fs = s3["fs"]
    for s, path in enumerate(_shards(tmp_path / "local")):
        fs.put(str(path), f"{BUCKET}/{decode}/{s}.parquet")
    cache = ShardCache(tmp_path / "cache", prefetch_threads=0, storage_options=storage_options(s3["endpoint"]))
    source = ShardedSource(f"s3://{BUCKET}/{decode}/", cache=cache, index_dir=tmp_path / "index", decode=decode)
    served, error = _read_until_error(
        source, lambda: fs.put(str(_rewritten(tmp_path / "local", 2)), f"{BUCKET}/{decode}/2.parquet"))
    assert f"shard s3://{BUCKET}/{decode}/2.parquet (needed for sample {STARTS[2]}) changed since it was indexed" \
        in str(error)
    assert served == list(range(STARTS[2]))  # shards 0 and 1 whole, nothing of the new shard 2
    left = [name for name in os.listdir(tmp_path / "cache")
            if not name.startswith((IDENTITIES, EXPANDED))]  # what the node's ranks share at start-up: kept
    assert not any(name.startswith(".") or ".part" in name for name in left), left


def test_a_local_shard_rewritten_mid_epoch_is_refused_in_a_worker(tmp_path: Path) -> None:
    """Same size, same rows, another modification time (replaced, as writers do): refused by the worker that opens it."""
    paths = _shards(tmp_path / "local")
    source = ShardedSource([str(p) for p in paths], index_dir=tmp_path / "index", open_shards=1)
    before = paths[2].stat().st_mtime_ns

    def rewrite() -> None:  # the workers have batches 1-4 (ids up to 39) in hand: shard 2 starts at 48
        os.replace(_rewritten(tmp_path / "local", 2), paths[2])
        assert paths[2].stat().st_mtime_ns != before

    served, error = _read_until_error(source, rewrite, workers=2)
    assert f"shard {paths[2]} (needed for sample {STARTS[2]}) changed since it was indexed" in str(error)
    assert served == list(range(STARTS[2]))  # nothing of the rewritten shard reached a batch
    assert ShardedSource([str(p) for p in paths], index_dir=tmp_path / "index")[STARTS[2]]["id"] == NEW  # indexed anew
