"""The node cache's prefetch threads against an S3 endpoint that answers each request after a delay.

Real object stores take tens of milliseconds to a first byte; moto's server on 127.0.0.1 is made to
wait ``LATENCY`` seconds a request (``tests/s3_server.py``), and counts the GETs it answers at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardwise.data.sharded import ShardCache, ShardError
from shardwise.data.sharded.cache import Derived
from tests.data.shards import put_parquet_shards
from tests.s3_server import Gauge, make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")

LATENCY = 0.3
SIZES = [40] * 8
BUCKET = "slow"


def _table(first: int, count: int) -> Any:
    return pa.table({"id": np.arange(first, first + count)})


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The endpoint, its gauge, and the shards as ``(url, size, version)``."""
    local = tmp_path_factory.mktemp("shards")
    gauge = Gauge()
    with s3_endpoint(latency=LATENCY, gauge=gauge) as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        put_parquet_shards(fs, local, f"{BUCKET}/p/{{s:02d}}.parquet", SIZES, _table)
        shards = [(f"s3://{BUCKET}/p/{s:02d}.parquet", (local / f"{s}.parquet").stat().st_size, None)
                  for s in range(len(SIZES))]  # fmt: skip
        yield {"endpoint": endpoint, "gauge": gauge, "shards": shards}


def _arrived(cache: ShardCache, shards: list[tuple[str, int, None]]) -> int:
    return sum((cache.directory / cache.name(url)).exists() for url, _, _ in shards)


@pytest.mark.parametrize("threads", [1, 4])
def test_prefetch_threads_download_that_many_shards_at_once(slow: dict[str, Any], tmp_path: Path,
                                                            threads: int) -> None:  # fmt: skip
    """``prefetch_threads=k``: the server answers k of the plan's shards at once, never more, until all arrive."""
    cache = ShardCache(tmp_path / "cache", prefetch_threads=threads, storage_options=storage_options(slow["endpoint"]))
    gauge: Gauge = slow["gauge"]
    gauge.peak = 0
    cache.follow(slow["shards"])
    deadline = time.monotonic() + 30
    while _arrived(cache, slow["shards"]) < len(SIZES) and time.monotonic() < deadline:
        time.sleep(0.02)
    cache.close()
    assert _arrived(cache, slow["shards"]) == len(SIZES)
    assert gauge.peak == threads
    assert cache.fetched_bytes == sum(size for _, size, _ in slow["shards"])


def test_no_prefetch_threads_fetches_only_what_is_read(slow: dict[str, Any], tmp_path: Path) -> None:
    """``prefetch_threads=0``: following the plan downloads nothing; a reader still fetches its shard."""
    cache = ShardCache(tmp_path / "cache", prefetch_threads=0, storage_options=storage_options(slow["endpoint"]))
    gauge: Gauge = slow["gauge"]
    gauge.peak = 0
    cache.follow(slow["shards"])
    time.sleep(3 * LATENCY)  # long enough for a prefetch thread to have fetched a shard
    assert gauge.peak == 0 and _arrived(cache, slow["shards"]) == 0
    url, size, _ = slow["shards"][5]
    assert Path(cache.path(url, size)).stat().st_size == size
    assert _arrived(cache, slow["shards"]) == 1


GROWTH = 5  # the derived file is this many times the shard (as an uncompressed decode of a Parquet shard can be)


def _inflate(shard: str | memoryview, output: str) -> None:
    """A derived file ``GROWTH`` times the shard's size (module level: picklable)."""
    data = bytes(shard) if isinstance(shard, memoryview) else Path(shard).read_bytes()
    Path(output).write_bytes(data * GROWTH)


def _prefetched(slow: dict[str, Any], directory: Path, budget: int, kept: int) -> tuple[ShardCache, list[Path]]:
    """A cache under ``budget`` (4 prefetch threads) that followed every shard, derived; closed once its first
    ``kept`` derived files are in place and one more download, wrongly started, would have arrived. Returns it
    and the derived files' paths, in plan order."""
    derived = Derived("inflated", _inflate)
    cache = ShardCache(directory, budget_bytes=budget, prefetch_threads=4, storage_options=storage_options(slow["endpoint"]))
    cache.follow(slow["shards"], derived)
    names = [cache.kept(url, derived) for url, _, _ in slow["shards"]]
    deadline = time.monotonic() + 30
    while not all(name.exists() for name in names[:kept]) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(3 * LATENCY)
    cache.close()
    return cache, names


def test_derived_files_under_a_budget_are_made_one_at_a_time(slow: dict[str, Any], tmp_path: Path) -> None:
    """Under a budget, derived files (larger than their shard, size unknown until made) are prefetched one at a time.

    The budget holds three derived files. Four threads fetching at once would each see room (the others'
    files not made yet), overshoot, and evict a shard the plan reads sooner; one at a time, the first
    three shards of the plan are kept and nothing else is fetched.
    """
    size = slow["shards"][0][1]
    gauge: Gauge = slow["gauge"]
    gauge.peak = 0
    cache, names = _prefetched(slow, tmp_path / "cache", 3 * GROWTH * size + size // 2, 3)
    assert [name.exists() for name in names] == [True] * 3 + [False] * 5
    shards_kept = [p for p in cache.directory.iterdir() if p.suffix != ".lock" and not p.name.startswith(".")]
    assert sum(p.stat().st_size for p in shards_kept) <= cache.budget_bytes  # (.plan-<pid>: this process's order)
    assert gauge.peak == 1


def test_the_room_a_derived_file_takes_is_counted_from_the_files_made(slow: dict[str, Any], tmp_path: Path) -> None:
    """The budget holds two derived files and two shards more: the third derived file does not fit.

    Counted at its shard's size, it seemed to fit: it was fetched, made, and its placing evicted the
    second shard, which the plan reads sooner (fetched again later). Counted at what the files made so
    far grew to (``GROWTH`` times their shards), it is not fetched until there is room; and the four
    threads make them in the plan's order (waiting on one lock, they took it in any order: later shards first).
    """
    shards = slow["shards"]
    cache, names = _prefetched(slow, tmp_path / "cache", 2 * GROWTH * shards[0][1] + 2 * shards[0][1], 2)
    assert [name.exists() for name in names] == [True] * 2 + [False] * 6
    assert cache.fetched_bytes == shards[0][1] + shards[1][1]  # the two kept, once each, nothing else


def test_a_client_error_neither_kills_the_prefetch_nor_escapes_the_reader(tmp_path: Path) -> None:
    """A server gone (botocore's EndpointConnectionError: no OSError): recorded by the thread, a ShardError for the reader."""
    from tests.s3_server import free_port

    options = storage_options(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    options["config_kwargs"] = {**options["config_kwargs"], "retries": {"max_attempts": 1}}
    cache = ShardCache(tmp_path / "cache", retries=0, storage_options=options)
    url = f"s3://{BUCKET}/gone.parquet"
    cache.follow([(url, 1000, None)])
    deadline = time.monotonic() + 30
    while url not in cache.errors and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "could not fetch shard" in cache.errors[url]
    assert cache._prefetch.running()  # still serving the plan
    with pytest.raises(ShardError, match=rf"could not fetch shard {url} \(needed for sample 7\) after 1 attempts"):
        cache.path(url, 1000, sample=7)
    cache.close()
