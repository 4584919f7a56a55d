"""Suite-wide settings: the shared index cache and the node cache live in per-run temporary directories, never in
~/.cache."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

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


@pytest.fixture(scope="session")
def lightning_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One pair of gloo ranks for the Lightning fits of tests/integrations/test_lightning.py,
    tests/contract/test_crash_resume.py and tests/integrations/test_skip_ledger.py (``ranks``: per rank, what
    each returned), each in a folder of its own (``directories``)."""
    from tests.integrations.test_lightning import lightning_ranks as run

    names = ("lightning", "crash_resume", "skip")
    directories = {name: tmp_path_factory.mktemp(f"lightning-{name}") for name in names}
    return {"ranks": run({name: str(path) for name, path in directories.items()}), "directories": directories}
