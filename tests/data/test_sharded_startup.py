"""What a ShardedSource costs at start-up on a real S3 server: a listing a folder, not a HEAD a shard.

Every rank builds its source, and each source takes every shard's identity (URL, size, ETag) to
check the node's index against (``metadata.stat_shards``). One ``HEAD`` a shard, in a row, is 1e5
round trips a rank at 1e5 shards; a listing reports size and ETag of 1,000 objects a request.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardwise.data.sharded import ShardCache, ShardedSource, ShardError
from shardwise.data.sharded.fetch import identity
from shardwise.data.sharded.metadata import IDENTITIES, LISTED, SHARED_FOR, stat_shards
from tests.data.shards import put_parquet_shards
from tests.s3_server import Gauge, make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")
pytest.importorskip("s3fs")
BUCKET = "startup"


def _table(first: int, count: int) -> Any:
    return pa.table({"id": list(range(first, first + count))})


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    gauge = Gauge()
    with s3_endpoint(gauge=gauge) as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        local = tmp_path_factory.mktemp("shards")
        # Two folders of 2 * LISTED shards each, and one of LISTED - 1 (below the listing threshold).
        for folder, count in (("a", 2 * LISTED), ("b", 2 * LISTED), ("few", LISTED - 1)):
            (local / folder).mkdir()
            put_parquet_shards(fs, local / folder, f"{BUCKET}/{folder}/{{s}}.parquet", [3] * count, _table)
        yield {"endpoint": endpoint, "fs": fs, "gauge": gauge}


def _urls(folder: str, count: int) -> list[str]:
    return [f"s3://{BUCKET}/{folder}/{s}.parquet" for s in range(count)]


def _source(s3: dict[str, Any], tmp_path: Path, urls: list[str]) -> ShardedSource:
    cache = ShardCache(tmp_path / "cache", prefetch_threads=0, storage_options=storage_options(s3["endpoint"]))
    return ShardedSource(urls, cache=cache, index_dir=tmp_path / "index")


def test_a_rank_lists_each_folder_once_instead_of_a_head_a_shard(s3: dict[str, Any], tmp_path: Path) -> None:
    """The second source on a node (the index built): 2 listings and 2 HEADs for 32 shards in 2 folders, not 32 HEADs."""
    urls = _urls("a", 2 * LISTED) + _urls("b", 2 * LISTED)
    first = _source(s3, tmp_path, urls)  # builds the node's index (reads every footer)
    gauge = s3["gauge"]
    before = dict(gauge.requests)
    second = _source(s3, tmp_path, urls)
    spent = {method: count - before.get(method, 0) for method, count in gauge.requests.items()}
    assert spent.get("LIST") == 2, spent
    assert spent.get("HEAD") == 2, spent  # one a folder: the listing checked against info once
    assert spent.get("GET", 0) == 0, spent  # the index is the node's: no footer read again
    assert second.data_fingerprint == first.data_fingerprint
    assert [second[i]["id"] for i in (0, 47, 48, 95)] == [0, 47, 0, 47]  # ids start again in each folder


def _start(rank: int, world_size: int, endpoint: str, cache_dir: str, index_dir: str, urls: list[str] | str) -> str:
    """One rank of a node: build the source (its shards' identities taken at start-up); its data fingerprint."""
    cache = ShardCache(cache_dir, prefetch_threads=0, storage_options=storage_options(endpoint))
    return ShardedSource(urls, cache=cache, index_dir=index_dir).data_fingerprint


def test_the_ranks_of_a_node_list_each_folder_once_between_them(s3: dict[str, Any], tmp_path: Path) -> None:
    """Two real ranks of a node (one cache directory), the index built: 2 listings and 2 HEADs for 32 shards in 2
    folders between them, not per rank (was 4 and 4: each rank listed every folder); they agree on the data."""
    from shardwise.tools.launch import run_distributed

    urls = _urls("a", 2 * LISTED) + _urls("b", 2 * LISTED)
    first = ShardedSource(urls, cache=ShardCache(tmp_path / "other-node", prefetch_threads=0,
                                                 storage_options=storage_options(s3["endpoint"])),
                          index_dir=tmp_path / "index")  # builds the index, on another node's cache: not shared here
    gauge = s3["gauge"]
    before = dict(gauge.requests)
    fingerprints = run_distributed(_start, 2, s3["endpoint"], str(tmp_path / "cache"), str(tmp_path / "index"), urls,
                                   timeout=120)  # fmt: skip
    spent = {method: count - before.get(method, 0) for method, count in gauge.requests.items()}
    assert spent.get("LIST") == 2 and spent.get("HEAD") == 2 and spent.get("GET", 0) == 0, spent
    assert fingerprints == [first.data_fingerprint] * 2


def test_the_ranks_of_a_node_list_a_folder_url_once_between_them(s3: dict[str, Any], tmp_path: Path) -> None:
    """Given a folder, two real ranks of a node find its shards and take their identities once between them: 3
    listings and 1 HEAD (each rank sent 3 and 1 before: the folder's test, its listing, the identities')."""
    from shardwise.tools.launch import run_distributed

    folder = f"s3://{BUCKET}/a/"
    options = storage_options(s3["endpoint"])
    first = ShardedSource(folder, cache=ShardCache(tmp_path / "other-node", prefetch_threads=0, storage_options=options),
                          index_dir=tmp_path / "index")  # fmt: skip
    gauge = s3["gauge"]
    before = dict(gauge.requests)
    fingerprints = run_distributed(_start, 2, s3["endpoint"], str(tmp_path / "cache"), str(tmp_path / "index"), folder,
                                   timeout=120)  # fmt: skip
    spent = {method: count - before.get(method, 0) for method, count in gauge.requests.items()}
    assert fingerprints == [first.data_fingerprint] * 2
    assert spent.get("LIST") == 3 and spent.get("HEAD") == 1 and spent.get("GET", 0) == 0, spent


def test_identities_are_shared_only_with_live_processes_of_the_same_job(s3: dict[str, Any], tmp_path: Path) -> None:
    """A source built again in the same process lists again (a shard may have changed); so does one whose
    identities came from a process that has ended, or were written too long ago."""
    urls = _urls("a", 2 * LISTED)
    _source(s3, tmp_path, urls)
    written = next((tmp_path / "cache").glob(f"{IDENTITIES}*"))
    assert written.name.startswith(".") and not written.name.endswith(".lock")  # never taken for a shard
    gauge = s3["gauge"]
    for change in ("none", "ended", "old"):
        if change != "none":
            held = json.loads(written.read_text())
            held["pid"] = _ended_pid() if change == "ended" else os.getppid()  # the parent: shared, but for its age
            written.write_text(json.dumps(held))
            if change == "old":
                os.utime(written, (time.time() - SHARED_FOR - 1,) * 2)
        before = dict(gauge.requests)
        _source(s3, tmp_path, urls)
        spent = {method: count - before.get(method, 0) for method, count in gauge.requests.items()}
        assert spent.get("LIST") == 1 and spent.get("HEAD") == 1, (change, spent)


def _ended_pid() -> int:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return int(done.stdout)


def test_the_listing_reports_every_shard_as_info_does(s3: dict[str, Any]) -> None:
    """Same (URL, size, ETag) from the listing as from a HEAD each: a download checked against it is not refused."""
    import s3fs

    fs = s3fs.S3FileSystem(**storage_options(s3["endpoint"]))
    urls = _urls("a", 2 * LISTED) + _urls("few", LISTED - 1)
    assert stat_shards(urls, lambda url: fs) == [identity(url, fs.info(url)) for url in urls]


def test_a_shard_the_listing_lacks_is_a_shard_error_naming_it(s3: dict[str, Any], tmp_path: Path) -> None:
    missing = f"s3://{BUCKET}/a/gone.parquet"
    with pytest.raises(ShardError, match=f"shard {missing} does not exist"):
        _source(s3, tmp_path, [*_urls("a", LISTED), missing])


def test_a_few_shards_of_a_folder_cost_a_head_each_and_no_listing(s3: dict[str, Any], tmp_path: Path) -> None:
    """Below LISTED shards a folder is not listed (it may hold far more objects than the shards asked for)."""
    urls = _urls("few", LISTED - 1)
    _source(s3, tmp_path, urls)
    gauge = s3["gauge"]
    before = dict(gauge.requests)
    _source(s3, tmp_path, urls)
    spent = {method: count - before.get(method, 0) for method, count in gauge.requests.items()}
    assert spent.get("LIST", 0) == 0, spent
    assert spent.get("HEAD") == LISTED - 1, spent


def test_an_http_folder_listed_as_a_web_page_falls_back_to_a_head_a_shard(tmp_path: Path) -> None:
    """http.server lists the folder as HTML (no sizes, no ETags): every identity is the one info reports."""
    import functools
    import http.server
    import threading

    import fsspec

    from tests.data.test_sharded_http import RangeHandler

    pq = pytest.importorskip("pyarrow.parquet")
    for s in range(LISTED + 1):
        pq.write_table(_table(3 * s, 3), tmp_path / f"{s}.parquet")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        urls = [f"http://127.0.0.1:{server.server_address[1]}/{s}.parquet" for s in range(LISTED + 1)]
        fs = fsspec.filesystem("http")
        assert stat_shards(urls, lambda url: fs) == [identity(url, fs.info(url)) for url in urls]
        source = ShardedSource(urls, cache=ShardCache(tmp_path / "cache", prefetch_threads=0),
                               index_dir=tmp_path / "index")
        assert [source[i]["id"] for i in (0, 3 * LISTED + 2)] == [0, 3 * LISTED + 2]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
