"""DataLoader workers forked again and again while shardwise's threads start, work and end in the parent.

The parent's sharded cache follows a plan and stops (its prefetch threads start, scan the cache
under their mutex, and end) and a build heartbeat starts and ends, in a loop, while the main
thread forks two DataLoader workers a round (``multiprocessing_context="fork"``) that each download
a shard through the same cache. Before ``shardwise._core.threads``, a worker forked while a prefetch
thread held the cache's mutex hung at its first download (at ``with self._mutex``, now ``self.mutex``, in
``ShardCache._download``): on CPython 3.11.7 this test failed in each of 10 runs, at its first or
second round; it passed in 20 of 20 after.

Bounded: at most ``ROUNDS`` rounds or ``SECONDS`` seconds, a hung worker is a DataLoader timeout of
``HANG`` seconds, and pytest's timeout backs them up.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from shardwise.data.sharded.cache import ShardCache
from shardwise.data.sharded.fetch import identity, version_of
from shardwise.index.progress import Heartbeat, set_progress

fsspec = pytest.importorskip("fsspec")

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="forks DataLoader workers"),
    # Python 3.12+ warns on every fork of a process with threads; this test forks one on purpose.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

ROUNDS, SECONDS, HANG = 16, 8.0, 5
SIZE = 100  # bytes a shard
CACHED = 32  # shards the parent's plan follows (already in the cache: its threads only check the budget)
FILLER = 300  # other files in the cache folder: each budget check scans them, holding the cache's mutex


class _Downloads(Dataset[torch.Tensor]):
    """Each sample downloads a shard the cache has not seen (another URL a process and index)."""

    def __init__(self, cache: ShardCache, root: str) -> None:
        self.cache, self.root = cache, root

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        url = f"{self.root}/fresh-{os.getpid():x}-{index}.bin"  # written here: fsspec's memory is per process
        memory = fsspec.filesystem("memory")
        memory.pipe(url, bytes(SIZE))
        path = self.cache.path(url, SIZE, version=version_of(identity(url, memory.info(url))))
        return torch.tensor(os.path.getsize(path))


@pytest.fixture
def shards() -> Iterator[str]:
    """A folder of ``memory://`` shards (fsspec's in-process filesystem, which forked workers inherit)."""
    root = f"memory://fork-{uuid.uuid4().hex}"
    memory = fsspec.filesystem("memory")
    for s in range(CACHED):
        memory.pipe(f"{root}/s{s}.bin", bytes(SIZE))
    yield root
    memory.rm(root, recursive=True)


def test_workers_forked_while_our_threads_start_work_and_end_never_hang(shards: str, tmp_path: Path) -> None:
    """Every round's workers finish: none inherits a lock held by a thread of ours, or forks mid start or end."""
    cache = ShardCache(tmp_path / "cache", budget_bytes=10**9, prefetch_threads=4)
    plan = [(f"{shards}/s{s}.bin", SIZE, None) for s in range(CACHED)]
    for url, size, version in plan:
        cache.path(url, size, version=version)
    for i in range(FILLER):
        (tmp_path / "cache" / f"filler{i:04d}-f.bin").touch()

    stop = threading.Event()
    churned = {"cycles": 0}

    def churn() -> None:  # the parent's side: threads of ours start, work and end, over and over
        while not stop.is_set():
            with Heartbeat("the fork test"):
                cache.follow(plan)
                time.sleep(0.002)
                cache.close()
            churned["cycles"] += 1

    set_progress(True)  # the heartbeat starts its thread only when progress is shown
    driver = threading.Thread(target=churn, daemon=True)  # the test's own thread, not one of shardwise's
    driver.start()
    rounds: list[list[int]] = []
    try:
        deadline = time.monotonic() + SECONDS
        # at least 3 rounds however loaded the machine (each bounded by HANG, the test by its timeout)
        while len(rounds) < ROUNDS and (time.monotonic() < deadline or len(rounds) < 3):
            loader = DataLoader(_Downloads(cache, shards), num_workers=2, multiprocessing_context="fork",
                                timeout=HANG)  # fmt: skip
            try:
                rounds.append([int(size) for batch in loader for size in batch])
            except RuntimeError as error:  # the DataLoader's timeout: a worker hung
                pytest.fail(f"round {len(rounds) + 1}: a forked worker hung ({error})")
    finally:
        stop.set()
        driver.join(10)
        cache.close()
        set_progress(None)
    assert len(rounds) >= 3, f"only {len(rounds)} rounds ran in {SECONDS} s"
    assert all(sizes == [SIZE] * 4 for sizes in rounds)
    # the churn ran while the workers forked (its pace beside the rounds' is the scheduler's: CI saw 15 for 16 rounds)
    assert churned["cycles"] >= 3, churned
