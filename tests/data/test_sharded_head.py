"""The first batch of a cold epoch needs a few row groups of its shards, not whole shards (NOTE [ Head first ]).

On moto's S3 server, with 2 forked DataLoader workers: a gate in the server holds every GET whose
body is larger than 64 KiB (a whole shard, most of the rest of one; a shard is ~0.7 MB) until the
first batch is delivered. The first batch must come while they are held, after fewer bytes than one shard; then
the epoch is read to its end, in the plan's order, every byte of the data fetched once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from shardwise.data.sharded import ShardCache, ShardedSource, ShardError
from shardwise.samplers.locality import LocalitySampler
from tests.s3_server import Gauge, make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SHARDS, ROWS, TOKENS, GROUP = 6, 2000, 64, 16  # ~0.5 MB a shard in 125 row groups of ~4 KB
BUCKET = "head"
HOLD = 10.0  # seconds a held GET waits for the gate before it is answered anyway


class Gate(Gauge):
    """The gauge of ``s3_endpoint`` that also holds large GET bodies until ``opened`` (at most ``HOLD`` s)."""

    def __init__(self) -> None:
        super().__init__()
        self.limit = 0  # bodies above this many bytes are held while the gate is closed
        self.opened = threading.Event()
        self.opened.set()
        self.waited_out = False  # a held body was answered because HOLD passed, not because the gate opened

    def count(self, body: list[bytes], environ: Any) -> list[bytes]:
        if sum(len(chunk) for chunk in body) > self.limit and not self.opened.wait(HOLD):
            self.waited_out = True
        return super().count(body, environ)


def _table(first: int, count: int) -> Any:
    tokens = np.random.default_rng(first).integers(0, 1 << 30, size=count * TOKENS, dtype=np.int32)
    offsets = pa.array(np.arange(count + 1, dtype=np.int32) * TOKENS)
    return pa.table({"id": np.arange(first, first + count), "tokens": pa.ListArray.from_arrays(offsets, tokens)})


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    local = tmp_path_factory.mktemp("head-shards")
    gate = Gate()
    with s3_endpoint(gauge=gate) as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        sizes = []
        for s in range(SHARDS):
            path = local / f"{s}.parquet"
            pq.write_table(_table(s * ROWS, ROWS), path, row_group_size=GROUP)
            fs.put(str(path), f"{BUCKET}/train/{s}.parquet")
            sizes.append(path.stat().st_size)
        yield {"endpoint": endpoint, "fs": fs, "gate": gate, "sizes": sizes, "local": local}


def _source(s3: dict[str, Any], tmp_path: Path, folder: str = "train") -> ShardedSource:
    cache = ShardCache(tmp_path / "cache", storage_options=storage_options(s3["endpoint"]))
    return ShardedSource(f"s3://{BUCKET}/{folder}/", cache=cache, index_dir=tmp_path / "index", output_format="numpy")


def _loader(source: ShardedSource) -> tuple[DataLoader[Any], list[int]]:
    sampler = LocalitySampler(source, num_replicas=1, rank=0, seed=0)  # the default plan: 6 streams here
    loader = DataLoader(source, sampler=sampler, batch_size=16, num_workers=2, collate_fn=lambda rows: rows,
                        multiprocessing_context="fork", timeout=60)
    # The same plan over the counts alone: iterating the source's sampler would start its prefetch.
    return loader, list(LocalitySampler(source.shard_sizes, num_replicas=1, rank=0, seed=0))


def test_the_first_batch_comes_while_every_whole_shard_is_held(s3: dict[str, Any], tmp_path: Path) -> None:
    """The first batch (rows of all 6 shards) after less than one shard's bytes; the epoch then whole and in order."""
    source = _source(s3, tmp_path)
    loader, expected = _loader(source)
    assert len({source.shard_of(i) for i in expected[:16]}) == SHARDS  # the first batch reads every shard
    gate: Gate = s3["gate"]
    gate.limit, gate.waited_out, before = 1 << 16, False, gate.sent  # a footer's read passes, whole shards are held
    gate.opened.clear()
    try:
        batches = iter(loader)
        first = next(batches)
        waited_out, at_first = gate.waited_out, gate.sent - before
    finally:
        gate.opened.set()
    ids = [int(row["id"]) for batch in [first, *batches] for row in batch]
    assert not waited_out, "the first batch waited for a whole shard"
    assert at_first < min(s3["sizes"])  # footers and a few row groups of each shard
    assert ids == expected
    shard, row = divmod(expected[0], ROWS)  # the first row, read from its shard's pieces, is the row written
    assert isinstance(first[0]["tokens"], np.ndarray)
    assert first[0]["tokens"].tolist() == _table(shard * ROWS, ROWS)["tokens"][row].as_py()
    assert gate.sent - before <= 1.05 * sum(s3["sizes"])  # the pieces are not fetched again with the rest
    # every shard decoded: no ledger of pieces is left (one stays while its shard is decoded)
    assert not [p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith(".partledger")]


def test_a_piece_of_the_first_row_group_brings_the_magic_before_it(s3: dict[str, Any], tmp_path: Path) -> None:
    """The 4 bytes before a shard's first row group (Parquet's magic) come in that row group's GET: the rest of the
    shard is then fetched without a request for 4 bytes, every byte once, and the shard is the one written."""
    from shardwise.data.sharded import head

    gate: Gate = s3["gate"]
    url, size, final = f"s3://{BUCKET}/train/0.parquet", s3["sizes"][0], tmp_path / "0.parquet"
    asked = len(gate.ranges)
    head.promise(final, [0])
    pieces = head.fetch_pieces(s3["fs"], url, size, None, [0], final, timeout=10)
    data, rest = head.fetch_whole(s3["fs"], url, final, size, timeout=10)
    assert bytes(data) == (s3["local"] / "0.parquet").read_bytes()
    assert pieces + rest == size
    assert len(gate.ranges) - asked == 3  # the footer, the first row group with the magic, the rest
    assert "bytes=0-3" not in gate.ranges[asked:]


def test_pieces_another_process_fetched_or_a_shard_decoded_take_no_request(s3: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    """Pieces asked for again (another rank promised the same rows) or of a shard whose decoded file is in place
    (another rank made it first): no request at all, not even the check; nothing left behind for the latter."""
    from shardwise.data.sharded import head
    from shardwise.data.sharded.fetch import identity, version_of

    gate: Gate = s3["gate"]
    fs, url, size = s3["fs"], f"s3://{BUCKET}/train/1.parquet", s3["sizes"][1]
    version = version_of(identity(url, fs.info(url)))
    final = tmp_path / "1.parquet"
    head.promise(final, [5])
    assert head.fetch_pieces(fs, url, size, version, [5], final, timeout=10) > 0
    before = sum(gate.requests.values())
    head.promise(final, [5])
    assert head.fetch_pieces(fs, url, size, version, [5], final, timeout=10) == 0
    assert sum(gate.requests.values()) == before
    final, derived = tmp_path / "other" / "1.parquet", tmp_path / "other" / "1.arrow"
    derived.parent.mkdir()
    derived.touch()
    head.promise(final, [5])
    assert head.fetch_pieces(fs, url, size, version, [5], final, timeout=10, derived=derived) == 0
    assert sum(gate.requests.values()) == before
    assert not head.sparse_path(final).exists()


def test_a_shard_rewritten_before_its_pieces_are_fetched_is_refused(s3: dict[str, Any], tmp_path: Path) -> None:
    """Rewritten after indexing (another content and ETag): ShardError naming it before any of its rows is served."""
    fs = s3["fs"]
    for s in range(SHARDS):
        fs.put(str(s3["local"] / f"{s}.parquet"), f"{BUCKET}/changed/{s}.parquet")
    source = _source(s3, tmp_path, "changed")
    loader, expected = _loader(source)
    rewritten = source.shard_of(expected[0])
    path = tmp_path / "new.parquet"
    pq.write_table(_table(10**6, ROWS), path, row_group_size=GROUP)
    fs.put(str(path), f"{BUCKET}/changed/{rewritten}.parquet")
    with pytest.raises(ShardError, match=f"shard s3://{BUCKET}/changed/{rewritten}.parquet .*changed since it was"):
        next(iter(loader))


def test_a_shard_whole_but_not_yet_decoded_serves_only_the_rows_promised(tmp_path: Path) -> None:
    """While the decoded file is made, the promised rows (a pass's first) come from the whole Parquet; any other
    row waits for the decoded file (read here, each batch would decode its rows' row groups, ~100x the rows)."""
    from shardwise.data.sharded import early, head

    final, derived = tmp_path / "shard.parquet", tmp_path / "shard.arrow"
    pq.write_table(_table(0, ROWS), final, row_group_size=GROUP)
    head.promise(final, [3, 40])
    rows = early.early_rows(final, derived, [40, 3], None, ROWS, timeout=5)
    assert rows is not None and rows["id"].to_pylist() == [40, 3]
    assert early.early_rows(final, derived, [3, 41], None, ROWS, timeout=5) is None  # 41 not promised: wait
    assert early.early_rows(final, None, [3], None, ROWS, timeout=5) is None  # nothing derived: the shard whole
    derived.touch()
    assert early.early_rows(final, derived, [3], None, ROWS, timeout=5) is None  # decoded: read it
