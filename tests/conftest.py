"""Suite-wide settings: the shared index cache lives in a per-run temporary directory, never in ~/.cache."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_index_cache() -> Iterator[None]:
    """Samplers built without ``cache_dir`` (and spawned ranks, which inherit the variable) share one run-local cache."""
    if os.environ.get("SHARDWISE_CACHE_DIR"):
        yield
        return
    path = tempfile.mkdtemp(prefix="shardwise-test-cache-")
    os.environ["SHARDWISE_CACHE_DIR"] = path
    try:
        yield
    finally:
        os.environ.pop("SHARDWISE_CACHE_DIR", None)
        shutil.rmtree(path, ignore_errors=True)
