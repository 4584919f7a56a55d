"""The node cache's prefetch: background threads fetch the shards the plan reads next, in its order.

The plan drives the cache (NOTE [ Locality-aware shuffle ]): :meth:`ShardCache.follow` receives
the shards in the order the plan will read them; ``prefetch_threads`` background threads download
them in that order, several at once (an object store answers each request after tens of
milliseconds, so one download at a time leaves its bandwidth idle), as far ahead as the budget
holds: a shard is fetched only where the room it takes comes from shards the plan reads later, or
never (``budget.has_room``). The Parquet shards whose rows a pass reads first have their footers
and those rows' row groups fetched before any whole shard (NOTE [ Head first ] in ``head.py``).

A :class:`Prefetch` belongs to one cache in one process: it holds the queue, the threads, the
plan's generation, the heads promised and the shards in flight, and fetches through the few
operations the cache lends it (:class:`Storage`). A copy of the cache in a DataLoader worker
(pickled, or forked) has no threads and no queue: it starts its own when it follows a plan.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..._core import threads
from . import budget as budgeting
from . import head as heads
from .fetch import Busy, Derived, is_local, shard_key
from .formats import ShardError

_RETRY = 0.05  # seconds the prefetch thread waits for new work before trying a busy shard again
_Item = tuple[str, int, "str | None", int]  # a shard to prefetch: url, size, version, generation of the plan
Head = tuple[str, int, "str | None", "Sequence[int]"]  # a shard the plan reads first: url, size, version, its rows


class Storage(Protocol):
    """What the prefetch uses of its cache (:class:`~shardwise.data.sharded.cache.ShardCache`): its settings,
    where it keeps a shard, its two locks and the four operations a prefetch needs."""

    directory: Path
    budget_bytes: int | None
    timeout: float
    prefetch_threads: int
    errors: dict[str, str]
    mutex: threading.Lock  # guards the cache's counters and the prefetch's in-flight shards
    serial: threading.RLock  # held while a derived file is made under a budget (readers take it too)

    def name(self, url: str, derived: Derived | None = None, version: str | None = None) -> str: ...

    def kept(self, url: str, derived: Derived | None = None, version: str | None = None) -> Path: ...

    def filesystem(self, url: str) -> Any: ...

    def fetch_now(self, url: str, size: int, derived: Derived | None, version: str | None) -> str: ...

    def kept_size(self, size: int, derived: Derived | None) -> int: ...

    def room_for(self, key: str, nbytes: int, inflight: Mapping[str, int]) -> bool: ...

    def add_fetched(self, nbytes: int) -> None: ...


class Prefetch:
    """The threads that fetch, for ``cache``, the shards the plan it follows reads next (one a cache and process)."""

    def __init__(self, cache: Storage) -> None:
        self.cache = cache
        self._derived: Derived | None = None  # what the threads keep of each shard (the plan's choice)
        self._generation = 0  # of the plan followed: queued items of an older one are dropped
        self._turn = threading.Lock()  # derived files under a budget: made in the plan's order (_loop)
        self._queue: queue.Queue[_Item | None] | None = None
        self._threads: list[threading.Thread] = []
        self._heads: dict[str, threading.Event] = {}  # url -> set once its first pieces are fetched (or failed)
        self._inflight: dict[str, int] = {}  # shard key -> bytes the threads are downloading now (under cache.mutex)
        threads.reset_in_child(self, type(self)._forked)

    def _forked(self) -> None:
        # In a forked child (a DataLoader worker): the parent's prefetch threads are not copied, and a
        # lock or queue one of them held at the fork would stay held here. This process starts its own
        # threads, with its own locks, when it follows a plan (the cache makes its own locks anew too).
        self._turn, self._queue, self._threads, self._inflight, self._heads = threading.Lock(), None, [], {}, {}

    def running(self) -> bool:
        """Whether this process's threads serve a plan (none before it follows one, after :meth:`close`, or forked)."""
        return self._queue is not None and all(thread.is_alive() for thread in self._threads)

    def follow(self, shards: Sequence[tuple[str, int, str | None]], derived: Derived | None,
               head: Sequence[Head]) -> None:
        """Prefetch ``shards`` (what the cache keeps of the plan, in its reading order) instead of the previous list.

        ``derived`` and ``head``: as :meth:`ShardCache.follow` takes them; the heads are promised before this returns.
        """
        self._derived = derived
        cache = self.cache
        if not shards or not cache.prefetch_threads:
            return
        firsts = [item for item in head
                  if item[1] > heads.SMALL and not is_local(item[0]) and not self._whole(item[0], item[2])]
        for url, _, version, rows in firsts:  # before any reader can ask: a reader of these rows waits for them
            heads.promise(cache.kept(url, None, version), rows)
        pending = self._queue
        if pending is None or not self.running():
            self.close()  # threads of a parent process do not survive a fork: start this process's own
            pending = self._queue = queue.Queue()
            self._threads = [threads.start(self._loop, pending, name=f"shardwise-prefetch-{i}")
                             for i in range(cache.prefetch_threads)]  # fmt: skip
        self._generation += 1  # the new plan supersedes what is still queued or put off
        generation = self._generation
        while not pending.empty():
            try:
                pending.get_nowait()
            except queue.Empty:  # pragma: no cover - raced with the thread
                break
        for url, size, version, rows in firsts:  # pieces, a small part of each shard: a thread each, at once
            done = self._heads[url] = threading.Event()
            threads.start(self._fetch_head, (url, size, version, tuple(rows)), done, name="shardwise-head")
        budget = cache.budget_bytes
        planned = 0
        for url, size, version in shards:
            planned += size
            if budget is not None and planned > budget:
                break  # prefetching beyond the budget would evict what is read sooner
            pending.put((url, size, version, generation))

    def close(self) -> None:
        """Stop the threads (they also stop with the process: they are daemons)."""
        if self._queue is not None:
            for _ in self._threads:
                self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=self.cache.timeout)
        self._threads, self._queue = [], None

    def _whole(self, url: str, version: str | None) -> bool:
        """Whether shard ``url`` is in the cache whole (downloaded, or derived as this process keeps it)."""
        if self.cache.kept(url, None, version).exists():
            return True
        return self._derived is not None and self.cache.kept(url, self._derived, version).exists()

    def _loop(self, pending: queue.Queue[_Item | None]) -> None:
        # A shard whose lock another process of the node holds (its prefetch or a reader fetching
        # it) is put off, not waited for: the node's ranks follow the same plan, and would
        # otherwise download one shard at a time, each waiting on the same lock in turn.
        put_off: list[_Item] = []
        while True:
            # A derived file's size is known only once it is made: under a budget, this process makes
            # one at a time, so that the room each download sees is what is really kept, and in the plan's
            # order: the thread that takes the next shard keeps the turn until it holds cache.serial (threads
            # waiting on it got it in any order, and a shard read later, made first, was evicted by
            # the sooner ones made after it: fetched twice).
            serial = self._derived is not None and self.cache.budget_bytes is not None
            with self._turn if serial else contextlib.nullcontext():
                try:
                    item = pending.get(timeout=_RETRY if put_off else None)
                except queue.Empty:
                    item = put_off.pop(0)  # nothing new: try again what was busy (by now, likely fetched)
                if item is not None and serial:
                    self.cache.serial.acquire()
            if item is None:
                return
            try:
                if self._fetch_ahead(item):
                    put_off.append(item)
            except Exception as error:  # any error (aiohttp's, botocore's): the thread must go on
                # Recorded, not raised: the reader fetches the shard itself and raises a ShardError naming it.
                self._record(item[0], error)
            finally:
                if serial:
                    self.cache.serial.release()

    def _fetch_head(self, head: Head, done: threading.Event) -> None:
        """Fetch a shard's footer and the row groups of the rows the plan reads first (NOTE [ Head first ])."""
        url, size, version, rows = head
        cache = self.cache
        final = cache.kept(url, None, version)
        derived = None if self._derived is None else cache.kept(url, self._derived, version)
        try:
            cache.add_fetched(heads.fetch_pieces(cache.filesystem(url), url, size, version, rows, final,
                                                 cache.timeout, derived))
        except Exception as error:  # recorded; the promise is settled: its readers fetch the shard whole
            self._record(url, error)
        finally:
            done.set()

    def _fetch_ahead(self, item: _Item) -> bool:
        """Prefetch one shard if it fits the budget; True: put it off (another thread or process has it)."""
        url, size, version, generation = item
        if generation != self._generation:
            return False  # the plan moved on: a newer list is queued
        head = self._heads.pop(url, None)
        cache = self.cache
        if head is not None:  # its pieces first, then the rest (download.download): no byte fetched twice
            head.wait(cache.timeout)
        key = shard_key(cache.name(url))
        reserved: Path | None = None
        # Under a budget, the room is checked and reserved under the node's lock: the node's ranks prefetch at once.
        room = budgeting.room_lock(cache.directory, cache.timeout) if cache.budget_bytes is not None else None
        with cache.mutex, room or contextlib.nullcontext():
            if key in self._inflight:
                return True
            kept = cache.kept_size(size, self._derived)
            if not cache.room_for(key, kept, self._inflight):  # it would evict a shard read sooner
                return False
            self._inflight[key] = kept
            if room is not None:
                reserved = budgeting.reserve(cache.directory, key, kept)
        try:
            # A failure here is not lost: the reader fetches the shard again and raises naming the sample.
            cache.fetch_now(url, size, self._derived, version)
        except Busy:  # another process holds its lock
            return True
        except (ShardError, OSError, ValueError) as error:
            self._record(url, error)
        finally:
            with cache.mutex:
                del self._inflight[key]
            if reserved is not None:
                reserved.unlink(missing_ok=True)
        return False

    def _record(self, url: str, error: Exception) -> None:
        """Keep the last error met on ``url`` in the cache's ``errors`` (the reader fetches it again, and raises)."""
        self.cache.errors[url] = f"{type(error).__name__}: {error}"
