"""Parquet shards decoded once per node (``ShardedSource(decode="node")``), against a real S3 endpoint.

The cache keeps each remote Parquet shard as an uncompressed Arrow file that every rank and worker
of the node memory-maps: made by one process, never half-visible, never stale after the shard
changes, counted in the byte budget.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from shardwise.data.sharded import ShardCache, ShardedSource, ShardError
from shardwise.data.sharded.cache import Derived
from shardwise.data.sharded.formats import decode_parquet
from shardwise.samplers.locality import LocalitySampler
from shardwise.tools.launch import run_distributed
from tests.data.shards import put_parquet_shards
from tests.s3_server import make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SIZES = [40, 7, 55, 23, 31]
TOTAL = sum(SIZES)
BUCKET = "decoded"


def _table(first: int, count: int, scale: int = 1) -> Any:
    ids = np.arange(first, first + count)
    tokens = [list(range(int(i) % 11)) for i in ids]
    return pa.table({"id": ids, "tokens": tokens, "text": [f"sample {i * scale}" for i in ids]})


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    local = tmp_path_factory.mktemp("parquet")
    with s3_endpoint() as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        put_parquet_shards(fs, local, f"{BUCKET}/train/shard-{{s}}.parquet", SIZES, _table, row_group_size=8)
        yield {"endpoint": endpoint, "fs": fs, "local": local}


def _source(s3: dict[str, Any], cache_dir: Path, prefix: str = "train", **kwargs: Any) -> ShardedSource:
    cache = kwargs.pop("cache", None) or ShardCache(cache_dir, storage_options=storage_options(s3["endpoint"]))
    return ShardedSource(f"s3://{BUCKET}/{prefix}/", cache=cache, index_dir=cache_dir.parent / "index", **kwargs)


def _files(directory: Path) -> dict[str, Any]:
    """``{name: stat}`` of the cache's whole files (no locks, temporary files or ``.plan-<pid>`` orders).

    The prefetch thread evicts while this looks: a file listed may be gone when its size is read.
    """
    files = {}
    for path in directory.iterdir():
        if path.suffix != ".lock" and ".part" not in path.name and not path.name.startswith("."):
            with contextlib.suppress(FileNotFoundError):
                files[path.name] = path.stat()
    return files


def _read_all(rank: int, world_size: int, endpoint: str, cache_dir: str, workers: int) -> dict[str, Any]:
    """One rank of a node: read its share of an epoch through a DataLoader; what it downloaded."""
    cache = ShardCache(cache_dir, storage_options=storage_options(endpoint))
    source = ShardedSource(f"s3://{BUCKET}/train/", cache=cache, index_dir=Path(cache_dir).parent / "index",
                           output_format="numpy")
    sampler = LocalitySampler(source, window=2, seed=1)
    loader = DataLoader(source, sampler=sampler, batch_size=8, num_workers=workers, collate_fn=lambda rows: rows,
                        multiprocessing_context="fork" if workers else None)
    rows = [row for batch in loader for row in batch]
    assert all(list(row["tokens"]) == list(range(int(row["id"]) % 11)) for row in rows)
    return {"ids": [int(row["id"]) for row in rows], "fetched": cache.fetched_bytes}


def test_ranks_of_a_node_share_one_decoded_copy(s3: dict[str, Any], tmp_path: Path) -> None:
    """3 real ranks with 2 workers each, one cache: every shard downloaded once, kept as one Arrow file, no Parquet left.

    A second epoch on the node reads the decoded files where they are: nothing is downloaded or made again.
    """
    cache_dir = tmp_path / "cache"
    reports = run_distributed(_read_all, 3, s3["endpoint"], str(cache_dir), 2, timeout=240)
    assert sorted(set(i for r in reports for i in r["ids"])) == list(range(TOTAL))
    # Workers download in their own processes: a rank's fetched_bytes misses them, so count the files.
    files = _files(cache_dir)
    assert len(files) == len(SIZES) and all(name.endswith(".arrow") for name in files)
    made = {name: stat.st_ino for name, stat in files.items()}  # reading touches them: the times change
    again = run_distributed(_read_all, 2, s3["endpoint"], str(cache_dir), 0, timeout=240)
    assert sum(r["fetched"] for r in again) == 0  # a shard is made again only from a new download
    assert {name: stat.st_ino for name, stat in _files(cache_dir).items()} == made


def test_decoded_rows_equal_the_workers_own_decoding(s3: dict[str, Any], tmp_path: Path) -> None:
    """decode="node" and decode="worker" serve the same rows, in every output format and for a column subset."""
    for output in ("python", "numpy", "torch"):
        node = _source(s3, tmp_path / "node", output_format=output, columns=["id", "tokens"])
        worker = _source(s3, tmp_path / "worker", output_format=output, columns=["id", "tokens"], decode="worker")
        ids = [0, 39, 40, 47, 100, 154, TOTAL - 1]
        for a, b in zip(node.__getitems__(ids), worker.__getitems__(ids), strict=True):
            assert a.keys() == b.keys() == {"id", "tokens"}
            assert int(a["id"]) == int(b["id"]) and list(a["tokens"]) == list(b["tokens"])
    assert all(name.endswith(".arrow") for name in _files(tmp_path / "node"))
    assert all(name.endswith(".parquet") for name in _files(tmp_path / "worker"))


def test_a_changed_shard_is_never_read_through_a_stale_decoded_copy(s3: dict[str, Any], tmp_path: Path) -> None:
    """A shard rewritten on S3 (new ETag): a new source decodes it again and serves the new rows."""
    fs = s3["fs"]
    for s in range(2):
        fs.put(str(s3["local"] / f"{s}.parquet"), f"{BUCKET}/changing/shard-{s}.parquet")
    before = _source(s3, tmp_path / "cache", "changing")
    assert before[3]["text"] == "sample 3"
    rewritten = tmp_path / "rewritten.parquet"
    pq.write_table(_table(0, SIZES[0], scale=10), rewritten)
    fs.put(str(rewritten), f"{BUCKET}/changing/shard-0.parquet")
    after = _source(s3, tmp_path / "cache", "changing")
    assert after[3]["text"] == "sample 30"
    assert len([name for name in _files(tmp_path / "cache") if name.endswith(".arrow")]) == 2


@pytest.mark.parametrize("decode", ["node", "worker"])
def test_a_shard_rewritten_at_the_same_size_is_fetched_again(s3: dict[str, Any], tmp_path: Path, decode: str) -> None:
    """Same URL, same byte count, new rows (new ETag): a new source reads the new rows, for both decode paths.

    (The cache used to name its copy by the URL and check only the size: decode="worker" served the old rows.)
    """
    fs = s3["fs"]
    url = f"{BUCKET}/same-size-{decode}/shard-0.parquet"
    files = []
    for offset in (0, 1000):
        path = tmp_path / f"ids-{offset}.parquet"
        pq.write_table(pa.table({"id": np.arange(offset, offset + 20)}), path, compression="none",
                       use_dictionary=False, write_statistics=False)
        files.append(path)
    assert files[0].stat().st_size == files[1].stat().st_size
    fs.put(str(files[0]), url)
    before = _source(s3, tmp_path / "cache", f"same-size-{decode}", decode=decode)
    assert before[3]["id"] == 3
    fs.put(str(files[1]), url)
    after = _source(s3, tmp_path / "cache", f"same-size-{decode}", decode=decode)
    assert after[3]["id"] == 1003


def _decode_in_child(cache_dir: str, endpoint: str, url: str, size: int) -> None:
    ShardCache(cache_dir, storage_options=storage_options(endpoint)).path(url, size, derived=Derived("t.arrow", decode_parquet))


def test_a_decoder_killed_with_sigkill_leaves_nothing_visible(s3: dict[str, Any], tmp_path: Path) -> None:
    """A process SIGKILLed while writing the decoded file: no decoded file appears; the next reader makes a whole one."""
    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": np.arange(6_000_000, dtype=np.int64)}), big, compression="none")
    url = f"s3://{BUCKET}/big/shard-0.parquet"
    s3["fs"].put(str(big), url)
    size = big.stat().st_size
    cache_dir = tmp_path / "cache"
    process = mp.get_context("spawn").Process(target=_decode_in_child, args=(str(cache_dir), s3["endpoint"], url, size))
    process.start()

    def decoding() -> bool:
        return cache_dir.exists() and any(p.name.endswith(".part" + str(process.pid)) and "t.arrow" in p.name
                                          for p in cache_dir.iterdir())

    deadline = time.monotonic() + 60
    while not decoding() and process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.001)
    process.kill()
    process.join(10)
    assert decoding(), "the decode finished before it could be killed"
    assert not any(name.endswith("t.arrow") for name in _files(cache_dir))
    cache = ShardCache(cache_dir, storage_options=storage_options(s3["endpoint"]))
    path = cache.path(url, size, derived=Derived("t.arrow", decode_parquet))
    with pa.memory_map(path) as mapped:
        table = pa.ipc.open_file(mapped).read_all()
    assert table.num_rows == 6_000_000 and table.column("id")[5_999_999].as_py() == 5_999_999
    assert not any(".part" in p.name for p in cache_dir.iterdir())


def test_corrupt_shard_fails_naming_url_and_sample_and_leaves_no_file(s3: dict[str, Any], tmp_path: Path) -> None:
    """A shard whose pages are garbled (its footer intact): the decode fails naming the URL and sample; nothing is kept."""
    fs = s3["fs"]
    data = (s3["local"] / "0.parquet").read_bytes()
    fs.pipe(f"{BUCKET}/corrupt/shard-0.parquet", data[:4] + b"\xff" * 64 + data[68:])
    source = _source(s3, tmp_path / "cache", "corrupt")
    with pytest.raises(ShardError, match=rf"s3://{BUCKET}/corrupt/shard-0.parquet \(needed for sample 4\) is not a"):
        source[4]
    assert not any(name.endswith(".arrow") for name in _files(tmp_path / "cache"))


def test_the_budget_counts_decoded_files(s3: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a budget of two decoded shards, a whole epoch stays in it and is read right.

    The files are counted after every sample read and right after every file is renamed into the
    cache (in any thread): a file made visible before the ones it replaces are evicted passes the
    budget for a moment, which a count between samples sees only sometimes.
    """
    probe = _source(s3, tmp_path / "probe")
    for first in np.cumsum(SIZES) - SIZES:
        probe[int(first)]
    budget = sum(sorted(stat.st_size for stat in _files(tmp_path / "probe").values())[-2:])
    tight = tmp_path / "tight"
    seen = [0]

    def count() -> None:
        seen[0] = max(seen[0], sum(stat.st_size for stat in _files(tight).values()))

    replace = os.replace

    def counted_replace(src: Any, dst: Any) -> None:
        replace(src, dst)
        if Path(dst).parent == tight:
            count()

    monkeypatch.setattr(os, "replace", counted_replace)
    cache = ShardCache(tight, budget_bytes=budget, storage_options=storage_options(s3["endpoint"]))
    source = _source(s3, tmp_path, cache=cache)
    sampler = LocalitySampler(source, window=1, num_replicas=1, rank=0, seed=4)
    for i in sampler:
        assert source[i]["id"] == i
        count()
    cache.close()
    assert 0 < seen[0] <= budget


def test_a_reader_and_a_prefetch_thread_make_decoded_files_one_at_a_time(s3: dict[str, Any], tmp_path: Path) -> None:
    """Under a budget, a reader's decode waits for the prefetch thread's (each makes room for its own file only: two
    made at once passed the budget together, as test_the_budget_counts_decoded_files saw now and then)."""
    import threading

    making, most, met = [0], [0], threading.Barrier(2)
    lock = threading.Lock()

    def slow_decode(shard: str, output: str) -> None:
        with lock:
            making[0] += 1
            most[0] = max(most[0], making[0])
        with contextlib.suppress(threading.BrokenBarrierError):
            met.wait(timeout=1.5)  # the other maker, if both make at once (one at a time: it never comes)
        decode_parquet(shard, output)
        with lock:
            making[0] -= 1

    urls = [f"s3://{BUCKET}/train/shard-{s}.parquet" for s in range(len(SIZES))]
    sizes = [int(s3["fs"].info(url)["size"]) for url in urls]
    derived = Derived("slow.arrow", slow_decode)
    cache = ShardCache(tmp_path, budget_bytes=10 * sum(sizes), prefetch_threads=1,
                       storage_options=storage_options(s3["endpoint"]))
    cache.follow([(urls[0], sizes[0], None)], derived)  # the prefetch thread decodes shard 0 ...
    deadline = time.monotonic() + 10
    while making[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert making[0] == 1
    cache.path(urls[2], sizes[2], derived=derived)  # ... while this reader needs shard 2
    cache.close()
    assert most[0] == 1
    assert all((tmp_path / cache.name(url, derived)).exists() for url in (urls[0], urls[2]))


def _seen_making(shard: str | memoryview, output: str) -> None:
    """decode_parquet, recording what it was given and which files the cache held meanwhile (module level: picklable)."""
    directory = Path(output).parent
    _MADE.append((type(shard).__name__, sorted(p.name for p in directory.iterdir())))
    decode_parquet(shard, output)


_MADE: list[tuple[str, list[str]]] = []


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_shard_kept_decoded_is_fetched_into_memory_never_written(
        s3: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory: bool) -> None:
    """A shard up to cache.IN_MEMORY bytes is decoded from its bytes: the Parquet is never on the node's disk (it was
    written, synced, read back and deleted: twice the disk writes of its decoded file). A larger one is downloaded
    and decoded from its file, as before; both serve the same rows, and leave only the decoded file."""
    from shardwise.data.sharded import cache as caching

    if not in_memory:
        monkeypatch.setattr(caching, "IN_MEMORY", 0)
    _MADE.clear()
    urls = [f"s3://{BUCKET}/train/shard-{s}.parquet" for s in range(2)]
    sizes = [int(s3["fs"].info(url)["size"]) for url in urls]
    derived = Derived("seen.arrow", _seen_making)
    cache = ShardCache(tmp_path, storage_options=storage_options(s3["endpoint"]))
    for url, size in zip(urls, sizes, strict=True):
        table = pa.ipc.open_file(cache.path(url, size, derived=derived)).read_all()
        first = sum(SIZES[: urls.index(url)])
        assert table["id"].to_pylist() == list(range(first, first + SIZES[urls.index(url)]))
    kinds = {kind for kind, _ in _MADE}
    parquet_seen = [name for _, names in _MADE for name in names if name.endswith(".parquet")]
    if in_memory:
        assert kinds == {"memoryview"} and parquet_seen == []
    else:
        assert kinds == {"str"} and len(parquet_seen) == 2
    assert sorted(_files(tmp_path)) == sorted(cache.name(url, derived) for url in urls)
    assert not [p.name for p in tmp_path.iterdir() if ".part" in p.name and not p.name.endswith(".lock")]
    assert cache.fetched_bytes == sum(sizes)


@pytest.mark.parametrize("pooled", [True, False])
def test_a_shard_is_decoded_into_its_own_pool_else_the_default(
        s3: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pooled: bool) -> None:
    """The decode allocates from pyarrow's jemalloc pool where it has one (in the default pool, the decodes of a
    cold epoch cost ~2.5x the CPU), the process's default pool untouched; where the pooled reader cannot be made,
    the default one decodes the same rows."""
    from shardwise.data.sharded import formats

    pool = formats.decode_pool()
    if pool is None:
        pytest.skip("this pyarrow has no jemalloc pool")
    if not pooled:
        import pyarrow._parquet

        def refused(*args: Any, **kwargs: Any) -> Any:
            raise TypeError("no memory_pool here")

        monkeypatch.setattr(pyarrow._parquet, "ParquetReader", refused)
    path = s3["local"] / "2.parquet"
    default = pa.default_memory_pool().backend_name
    allocated: list[int] = []
    original = formats._parquet_table

    def watched(source: Any, columns: Any, memory: Any = None) -> Any:
        before = pool.bytes_allocated()
        table = original(source, columns, memory)
        allocated.append(pool.bytes_allocated() - before)  # the table alive: its buffers are counted by their pool
        return table

    monkeypatch.setattr(formats, "_parquet_table", watched)
    for source in (str(path), memoryview(path.read_bytes())):
        decode_parquet(source, str(tmp_path / "out.arrow"), columns=["id", "tokens"])
        table = pa.ipc.open_file(str(tmp_path / "out.arrow")).read_all()
        assert table["id"].to_pylist() == list(range(sum(SIZES[:2]), sum(SIZES[:3])))
    assert pa.default_memory_pool().backend_name == default
    assert all((grown > 0) is pooled for grown in allocated) and len(allocated) == 2
