"""Sharded sources over http:// against a real HTTP server on 127.0.0.1 (python's http.server, with Range)."""

from __future__ import annotations

import http.server
import io
import os
import re
import threading
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardwise.data.sharded import ShardCache, ShardedSource, ShardError
from shardwise.samplers.locality import LocalitySampler
from shardwise.tools.launch import run_distributed

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("aiohttp")  # fsspec's HTTPFileSystem

SIZES = [37, 5, 60, 23, 41, 12, 50]  # 7 uneven shards: 7 % 2 is not 0
TOTAL = sum(SIZES)
RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """http.server's static files, plus single byte ranges (fsspec reads Parquet footers and blocks by range)."""

    def send_head(self) -> Any:
        wanted = self.headers.get("Range")
        path = self.translate_path(self.path)
        if wanted is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        match = RANGE.fullmatch(wanted.strip())
        if match is None or match.groups() == ("", ""):
            self.send_error(416, f"unsupported Range {wanted!r}")
            return None
        first, last = match.groups()
        start = max(0, size - int(last)) if first == "" else int(first)
        end = size - 1 if first == "" or last == "" else min(int(last), size - 1)
        if start >= size or start > end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return None
        with open(path, "rb") as file:
            file.seek(start)
            body = file.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, format: str, *args: Any) -> None:  # one line per request otherwise
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Seven Parquet shards in a folder, served over HTTP on 127.0.0.1 (a free port) for the module."""
    root = tmp_path_factory.mktemp("http-shards")
    first = 0
    for s, size in enumerate(SIZES):
        ids = np.arange(first, first + size)
        table = pa.table({"id": ids, "text": ["w" * int(i % 17 + 1) for i in ids]})
        pq.write_table(table, root / f"shard-{s:02d}.parquet", row_group_size=16)
        first += size
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(RangeHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield {"root": root, "base": base, "names": [f"shard-{s:02d}.parquet" for s in range(len(SIZES))]}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _rank_main(rank: int, world_size: int, base: str, root: str, names: list[str], tmp: str) -> dict[str, Any]:
    """One gloo rank: the same LocalitySampler plan over the http:// source and the local one, row by row."""
    remote = ShardedSource([f"{base}/{name}" for name in names], cache=ShardCache(Path(tmp) / "cache"),
                           index_dir=Path(tmp) / f"index-{rank}")
    local = ShardedSource([os.path.join(root, name) for name in names], index_dir=Path(tmp) / f"local-{rank}")
    plans = [list(LocalitySampler(source, window=3, seed=11)) for source in (remote, local)]
    rows = [remote[i] for i in plans[0]]
    return {"plans": plans, "rows": rows, "expected": [local[i] for i in plans[1]],
            "fetched": remote.cache.fetched_bytes, "sizes": remote.shard_sizes.tolist()}


def test_http_shards_serve_the_local_samples_on_two_ranks(served: dict[str, Any], tmp_path: Path) -> None:
    """Two real gloo ranks, LocalitySampler over http:// URLs: the plan and every row equal the local shards'."""
    reports = run_distributed(_rank_main, 2, served["base"], str(served["root"]), served["names"], str(tmp_path),
                              timeout=240)
    for report in reports:
        assert report["sizes"] == SIZES  # counts from the Parquet footers, read by range over HTTP
        assert report["plans"][0] == report["plans"][1]
        assert report["rows"] == report["expected"]
        assert all(row["id"] == i for row, i in zip(report["rows"], report["plans"][0], strict=True))
    assert len(reports[0]["plans"][0]) == len(reports[1]["plans"][0]) == -(-TOTAL // 2)
    seen = Counter(i for report in reports for i in report["plans"][0])
    assert set(seen) == set(range(TOTAL)) and sum(seen.values()) - TOTAL < 2  # only the last step's padding
    shard_bytes = sum((served["root"] / name).stat().st_size for name in served["names"])
    assert sum(report["fetched"] for report in reports) == shard_bytes  # each shard downloaded once on the node


def test_a_missing_http_shard_names_the_url(served: dict[str, Any], tmp_path: Path) -> None:
    """A 404 at construction names the URL; a shard gone after indexing names the URL and the sample."""
    url = f"{served['base']}/no-such-shard.parquet"
    with pytest.raises(ShardError, match=rf"shard {re.escape(url)} does not exist"):
        ShardedSource([f"{served['base']}/{served['names'][0]}", url], index_dir=tmp_path / "index",
                      cache=ShardCache(tmp_path / "cache"))
    copy = served["root"] / "copy-of-1.parquet"
    copy.write_bytes((served["root"] / served["names"][1]).read_bytes())
    first = f"{served['base']}/{served['names'][0]}"
    source = ShardedSource([first, f"{served['base']}/{copy.name}"], index_dir=tmp_path / "index",
                           cache=ShardCache(tmp_path / "cache"))
    assert source[0]["id"] == 0
    copy.unlink()
    with pytest.raises(ShardError, match=rf"shard {re.escape(served['base'])}/copy-of-1.parquet "
                                         rf"\(needed for sample {SIZES[0]}\) does not exist"):
        source[SIZES[0]]


def test_forked_workers_read_remote_shards(served: dict[str, Any], tmp_path: Path) -> None:
    """DataLoader workers forked (Linux's default, torchrun's) after the main process used the http filesystem.

    fsspec's async filesystems raise "This class is not fork-safe" when an instance crosses a fork;
    each worker must open its own.
    """
    from torch.utils.data import DataLoader

    source = ShardedSource([f"{served['base']}/{name}" for name in served["names"]], index_dir=tmp_path / "index",
                           cache=ShardCache(tmp_path / "cache"))
    assert source[0]["id"] == 0  # the main process fetched shard 0 and holds a filesystem
    plan = list(LocalitySampler(SIZES, window=2, num_replicas=1, rank=0, seed=4))  # no prefetching:
    loader = DataLoader(source, sampler=plan, batch_size=8, num_workers=2, multiprocessing_context="fork")  # workers fetch
    ids = [int(i) for batch in loader for i in batch["id"]]
    assert ids == plan
    assert sorted(ids) == list(range(TOTAL))
