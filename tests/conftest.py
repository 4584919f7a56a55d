"""Suite-wide settings: the shared index cache and the node cache live in per-run temporary directories, never in
~/.cache."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_index_cache() -> Iterator[None]:
    """Samplers built without ``cache_dir`` and sources without a ``ShardCache`` (and spawned ranks, which inherit
    the variables) share run-local caches: the index cache, and the node cache of shards and their decoded files."""
    names = [name for name in ("SHARDWISE_CACHE_DIR", "SHARDWISE_SHARD_CACHE") if not os.environ.get(name)]
    paths = {name: tempfile.mkdtemp(prefix=f"{name.lower()}-") for name in names}
    os.environ.update(paths)
    try:
        yield
    finally:
        for name, path in paths.items():
            os.environ.pop(name, None)
            shutil.rmtree(path, ignore_errors=True)
