"""``download.download``: transient errors (OSError, timeouts, the storage clients' transport errors) are retried;
any other error is raised as it is, at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import botocore.exceptions
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from shardwise.data.sharded import ShardError
from shardwise.data.sharded.download import download, transient_errors

DATA = b"shard bytes " * 100


class _Failing(MemoryFileSystem):
    """fsspec's in-memory filesystem whose ``get_file`` raises the errors given, one a call, before it works."""

    def __init__(self, errors: list[BaseException]) -> None:
        super().__init__(skip_instance_cache=True)
        self.store = {}  # its own store, not the class-wide one
        self.errors, self.calls = list(errors), 0

    def get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        super().get_file(rpath, lpath, **kwargs)


def _filesystem(errors: list[BaseException]) -> _Failing:
    fs = _Failing(errors)
    fs.pipe_file("memory://bucket/shard.parquet", DATA)
    return fs


def test_client_errors_that_are_no_oserror_are_retried(tmp_path: Path) -> None:
    """aiohttp's and botocore's transport errors and a timeout (none an OSError on 3.10) are retried, then it works."""
    errors: list[BaseException] = [aiohttp.ServerDisconnectedError(), asyncio.TimeoutError(),
                                   botocore.exceptions.EndpointConnectionError(endpoint_url="http://gone")]
    assert not any(isinstance(error, OSError) for error in errors[:1] + errors[2:])
    assert {aiohttp.ClientError, botocore.exceptions.BotoCoreError} <= set(transient_errors())
    fs = _filesystem(errors)
    final = tmp_path / "shard.parquet"
    assert download(fs, "memory://bucket/shard.parquet", final, len(DATA), None, 3, retries=3, backoff=0.001) == len(DATA)
    assert fs.calls == 4 and final.read_bytes() == DATA


def test_a_programming_error_is_neither_retried_nor_wrapped(tmp_path: Path) -> None:
    """A TypeError in the client (a bug, a bad argument) is raised as it is after one call (it was retried 4 times
    and reported as a ShardError 'could not fetch shard')."""
    fs = _filesystem([TypeError("get_file() got an unexpected keyword argument 'chunk'")])
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk'"):
        download(fs, "memory://bucket/shard.parquet", tmp_path / "shard.parquet", len(DATA), None, 3, retries=3,
                 backoff=0.001)
    assert fs.calls == 1
    assert list(tmp_path.iterdir()) == []  # no temporary file left
    fs = _filesystem([aiohttp.ClientPayloadError("truncated")] * 2)
    with pytest.raises(ShardError, match=r"could not fetch shard memory://bucket/shard.parquet \(needed for sample 3\) "
                                         r"after 2 attempts: truncated"):
        download(fs, "memory://bucket/shard.parquet", tmp_path / "shard.parquet", len(DATA), None, 3, retries=1,
                 backoff=0.001)
