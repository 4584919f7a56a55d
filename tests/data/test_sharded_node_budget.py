"""The node's ranks share one cache budget: a rank ahead of another never evicts a shard the other still reads.

Against moto's S3 server, two real processes on one cache directory: the other rank (a spawned
process) still reads shard 0; this rank is done with it and prefetches shard 3. Under a budget of
3.5 shards, fetching shard 3 would evict shard 0, which the other rank would then fetch again.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardwise.data.sharded import ShardCache
from tests.s3_server import make_bucket, s3_endpoint, storage_options

SIZE = 10_000  # bytes a shard
BUCKET = "budget"
URLS = [f"s3://{BUCKET}/{s}.bin" for s in range(4)]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_endpoint() as url:
        fs = make_bucket(url, BUCKET)
        for s in range(4):
            fs.pipe(f"{BUCKET}/{s}.bin", bytes([s]) * SIZE)
        yield url


@contextlib.contextmanager
def _other_rank(target: Callable[..., None], directory: Path, endpoint: str) -> Iterator[None]:
    """``target(directory, endpoint, ready, done)`` in a spawned process (another rank of the node) while the block
    runs, once it is ready."""
    context = mp.get_context("spawn")
    ready, done = context.Event(), context.Event()
    other = context.Process(target=target, args=(str(directory), endpoint, ready, done), daemon=True)
    other.start()
    try:
        assert ready.wait(60), "the other rank did not start"
        yield
    finally:
        done.set()
        other.join(30)
        if other.is_alive():
            other.kill()


def _behind(directory: str, endpoint: str, ready: Any, done: Any) -> None:
    """The rank behind: has shards 0-2 in the cache and still reads shard 0 first; stays until ``done``."""
    cache = ShardCache(directory, budget_bytes=int(3.5 * SIZE), prefetch_threads=0,
                       storage_options=storage_options(endpoint))
    for url in URLS[:3]:
        cache.path(url, SIZE)
    cache.follow([(url, SIZE, None) for url in URLS])
    ready.set()
    done.wait(60)


def test_a_rank_ahead_keeps_the_shards_a_rank_behind_still_reads(endpoint: str, tmp_path: Path) -> None:
    """This rank is done with shard 0; the other process still reads it: prefetching shard 3 does not evict it."""
    with _other_rank(_behind, tmp_path, endpoint):
        cache = ShardCache(tmp_path, budget_bytes=int(3.5 * SIZE), prefetch_threads=1,
                           storage_options=storage_options(endpoint))
        cache.follow([(url, SIZE, None) for url in URLS[1:]])  # shards 1, 2, 3: done with shard 0
        cache.close()  # the prefetch thread finishes what it took
        kept = {path.name.partition("-")[0] for path in tmp_path.iterdir() if path.suffix == ".bin"}
        assert cache.name(URLS[0]).partition("-")[0] in kept  # not evicted: the other rank reads it next
        assert cache.name(URLS[3]).partition("-")[0] not in kept  # no room for it until shard 0 is done
        assert cache.fetched_bytes == 0


def _prefetching(directory: str, endpoint: str, ready: Any, done: Any) -> None:
    """Another rank of the node, prefetching shard 0 (the soonest it reads): its reservation published as its
    prefetch thread publishes one while it fetches; stays until ``done``."""
    from shardwise.data.sharded import budget
    from shardwise.data.sharded.fetch import shard_key

    cache = ShardCache(directory, budget_bytes=int(3.5 * SIZE), prefetch_threads=0,
                       storage_options=storage_options(endpoint))
    cache.follow([(url, SIZE, None) for url in URLS])  # its reading order: shard 0 first
    budget.reserve(Path(directory), shard_key(cache.name(URLS[0])), SIZE)
    ready.set()
    done.wait(60)


def test_a_shard_another_rank_is_prefetching_takes_its_room(endpoint: str, tmp_path: Path) -> None:
    """Another process of the node is fetching shard 0, read before shard 3: with shards 1 and 2 kept, a budget of
    3.5 shards has no room for shard 3 (each rank saw room for its own prefetches only: the node's ranks placed
    their shards at once and evicted shards still read; 4 ranks a node fetched up to 1.23x the dataset). Once that
    process is gone, its reservation no longer counts and is removed."""
    from shardwise.data.sharded import budget

    with _other_rank(_prefetching, tmp_path, endpoint):
        cache = ShardCache(tmp_path, budget_bytes=int(3.5 * SIZE), prefetch_threads=1,
                           storage_options=storage_options(endpoint))
        for url in URLS[1:3]:
            cache.path(url, SIZE)
        cache.follow([(url, SIZE, None) for url in URLS[1:]])  # shards 1, 2, 3
        cache.close()
        kept = {path.name.partition("-")[0] for path in tmp_path.iterdir() if path.suffix == ".bin"}
        assert cache.name(URLS[3]).partition("-")[0] not in kept  # shard 0's room is taken
        assert cache.fetched_bytes == 2 * SIZE
        assert len(budget.node_inflight(budget.listing(tmp_path), {})) == 1
    assert budget.node_inflight(budget.listing(tmp_path), {}) == {}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(budget.FETCHING)]


def test_the_orders_and_reservations_of_ended_processes_are_removed(tmp_path: Path) -> None:
    """A killed rank's ``.plan-<pid>`` and ``.fetching-<pid>-...`` stay in the cache directory: the next budget check
    of the node removes them and ranks nothing by them; a live process's order counts and stays."""
    import os
    import subprocess
    import sys

    from shardwise.data.sharded import budget

    ended = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                               text=True, check=True).stdout)  # fmt: skip
    live = os.getppid()  # alive for the whole test, and not this process (whose own order is never read back)
    (tmp_path / f"{budget.PLAN}{ended}").write_text("aaa\nbbb")
    (tmp_path / f"{budget.PLAN}{live}").write_text("ccc")
    (tmp_path / f"{budget.FETCHING}{ended}-ddd-100").touch()
    listed = budget.listing(tmp_path)
    assert budget.node_upcoming(listed, {}) == {"ccc": 0}
    assert budget.node_inflight(listed, {}) == {}
    assert sorted(os.listdir(tmp_path)) == [f"{budget.PLAN}{live}"]
