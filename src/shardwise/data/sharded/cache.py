"""The node cache: each remote shard is downloaded once per node, shared by every rank and worker.

A download (``download.download``) takes the shard's file lock (``filelock``), writes a temporary
file next to the final one, checks it against the shard's identity recorded at indexing (size and
ETag or modification time: a changed shard is a ``ShardError`` naming its URL, before any reader
opens it) and renames it into place: a reader sees a whole shard or none, and a download killed
halfway leaves only a temporary file that nobody opens (the next download overwrites it).
Transient errors are retried with bounded exponential backoff; a missing or changed shard fails
at once; every wait (the lock, the retries) is bounded, so a failure is an error, never a hang. A
local shard is read in place (or its derived file, below, made from it where it lies), its size and
modification time checked whenever it is opened.

A shard can be kept *derived* instead (:class:`Derived`: a Parquet shard decoded once into an
uncompressed Arrow IPC file that every worker memory-maps): the first process that needs it
fetches the shard (a local one is read where it lies), makes the derived file under that file's
lock and renames it into place. Its name carries the shard's version (``version``: a hash of its
ETag or modification time, from the caller) and a tag of how it is made, so a changed shard is
never read through a stale copy, downloaded or derived.

The plan drives the cache (NOTE [ Locality-aware shuffle ]): :meth:`ShardCache.follow` receives
the shards in the order the plan will read them; its prefetch (``prefetch``: ``prefetch_threads``
background threads) downloads them in that order, as far ahead as the budget holds; and when the
cache is over its byte budget the shards the plan will not read again this epoch are evicted first
(least recently used), then the ones it reads last (``budget``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..._core import threads
from ..._core.errors import check_int, check_path, check_seconds
from . import budget as budgeting
from . import head as heads
from .download import download, fetch
from .fetch import (
    PART,
    Derived,
    check_unchanged,
    complete,
    default_cache_dir,
    for_sample,
    is_local,
    local_path,
    locked,
    remove_leftovers,
    shard_key,
    touch,
)
from .formats import ShardError
from .prefetch import Head, Prefetch

__all__ = ["PART", "Derived", "Head", "ShardCache", "default_cache_dir", "is_local", "local_path"]

IN_MEMORY = 256 << 20
"""Bytes up to which a shard kept derived is fetched into memory and never written (larger: downloaded to disk)."""


class ShardCache:
    """Local copies of remote shards, one per node, within a byte budget, prefetched in plan order.

    Args:
        directory: where shards are kept (local disk, shared by the node's processes); default
            :func:`default_cache_dir`.
        budget_bytes: bytes of shards (and derived files) kept; ``None``: no limit. Hold at least the
            ``window + 6`` largest shards as kept (two windows with ``mixing="windows"``): a node then
            fetches each shard once an epoch (measured with 1 to 4 ranks a node: docs/sharded.md).
        retries: attempts after the first for a transient error.
        backoff: seconds before the first retry, doubled each time, at most 8 s.
        timeout: seconds to wait for another process's download of the same shard.
        prefetch_threads: downloads this process runs ahead of the readers at once, in plan order
            (each rank of a node has its own; 0: no prefetch, readers fetch what they open). Under
            a budget, files derived from shards (:class:`Derived`) are made one at a time: their
            size is known only once made, and the budget must see it before the next download.
        storage_options: passed to ``fsspec.filesystem`` (e.g. ``{"endpoint_url": ...}`` for S3).

    Its prefetch (:class:`~shardwise.data.sharded.prefetch.Prefetch`) fetches through :meth:`fetch_now`,
    :meth:`kept_size`, :meth:`room_for` and :meth:`add_fetched`, and shares its locks ``mutex`` and ``serial``.

    Example:
        >>> cache = ShardCache("shard-cache", budget_bytes=2 << 30)
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        budget_bytes: int | None = None,
        retries: int = 3,
        backoff: float = 0.5,
        timeout: float = 600.0,
        prefetch_threads: int = 4,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.directory = Path(check_path("directory", directory)) if directory is not None else default_cache_dir()
        self.budget_bytes = None if budget_bytes is None else check_int("budget_bytes", budget_bytes, minimum=1)
        self.retries = check_int("retries", retries, minimum=0)
        self.backoff = check_seconds("backoff", backoff)
        self.timeout = check_seconds("timeout", timeout, allow_zero=False)
        self.prefetch_threads = check_int("prefetch_threads", prefetch_threads, minimum=0)
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError("storage_options should be a dict of fsspec options or None, but got "
                            f"storage_options={storage_options!r} ({type(storage_options).__name__})")
        self.storage_options = dict(storage_options or {})
        self.fetched_bytes = 0  # bytes this process downloaded (the benchmark's bytes per node)
        self.errors: dict[str, str] = {}  # url -> the last error a prefetch thread met on it (the reader refetches)
        self._upcoming: dict[str, int] = {}  # shard key (_shard_key) -> rank in the plan's reading order
        self._pinned: dict[str, int] = {}  # shard key -> readers of this process between download and open
        self.mutex = threading.Lock()  # guards fetched_bytes, _made_*, and the prefetch's in-flight shards
        # Derived files under a budget: made one at a time (_get), and in the plan's order by the prefetch threads.
        self.serial = threading.RLock()
        self._made_bytes = self._made_from = 0  # bytes of the derived files this process made, and of their shards
        self._fs: dict[str, Any] = {}
        self._fs_pid = os.getpid()  # fsspec's async filesystems (s3, http) refuse use in a forked process
        self._prefetch = Prefetch(self)
        threads.reset_in_child(self, type(self)._forked)

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get a copy without the prefetch (its threads, its queue) or open filesystems.
        state = self.__dict__.copy()
        del state["mutex"], state["serial"], state["_prefetch"]
        state.update(_fs={}, _upcoming={}, _pinned={}, _fs_pid=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.mutex, self.serial = threading.Lock(), threading.RLock()
        self._prefetch = Prefetch(self)  # no threads until this process follows a plan
        threads.reset_in_child(self, type(self)._forked)

    def _forked(self) -> None:
        # In a forked child (a DataLoader worker): the parent's prefetch threads are not copied, and a
        # lock one of them held at the fork would stay held here (the worker's first download hung on
        # the mutex). The prefetch drops the parent's threads and queue itself (Prefetch._forked); this
        # process starts its own threads, with its own locks, when it follows a plan.
        self.mutex, self.serial = threading.Lock(), threading.RLock()

    def filesystem(self, url: str) -> Any:
        """The fsspec filesystem for ``url``'s protocol (one per protocol and process)."""
        import fsspec

        protocol = url.split("://", 1)[0] if "://" in url else "file"
        if self._fs_pid != os.getpid():  # a forked DataLoader worker: open its own filesystems
            self._fs, self._fs_pid = {}, os.getpid()
        fs = self._fs.get(protocol)
        if fs is None:
            options = self.storage_options if protocol not in ("file", "local") else {}
            fs = self._fs[protocol] = fsspec.filesystem(protocol, **options)
        return fs

    def name(self, url: str, derived: Derived | None = None, version: str | None = None) -> str:
        """The cached file's name: a hash of the URL, the shard's ``version`` if given, then the URL's
        file name (formats are told by suffix) or the derived file's tag.

        Everything the cache keeps of one shard starts with the same ``<hash>-`` (:func:`_shard_key`);
        a shard rewritten in place (another version) is another file, never its stale copy.
        """
        digest = hashlib.blake2b(url.encode(), digest_size=12).hexdigest()
        prefix = f"{digest}-{version}" if version else digest
        if derived is not None:
            return f"{prefix}-{derived.tag}"
        return f"{prefix}-{url.rstrip('/').rpartition('/')[2][-60:]}"

    def kept(self, url: str, derived: Derived | None = None, version: str | None = None) -> Path:
        """Where this cache keeps shard ``url`` whole (``derived``: the file derived from it), there yet or not."""
        return self.directory / self.name(url, derived, version)

    @contextlib.contextmanager
    def pinned(self, url: str) -> Iterator[None]:
        """Within the block, this process never evicts ``url``'s shard: a reader opens what it just fetched.

        (The prefetch thread's downloads evict too; another process of the node may still evict it,
        so a reader retries a shard that vanished before it was opened.)
        """
        name = shard_key(self.name(url))
        self._pinned[name] = self._pinned.get(name, 0) + 1
        try:
            yield
        finally:
            left = self._pinned.pop(name) - 1
            if left:
                self._pinned[name] = left

    def path(self, url: str, size: int, *, sample: int | None = None, derived: Derived | None = None,
             version: str | None = None) -> str:
        """A local path holding the whole shard ``url`` (``size`` bytes), downloading it if needed.

        With ``derived``, the path of the file derived from it (from a local shard where it lies), made if
        needed.
        ``version``: the shard's identity as indexed, hashed (``fetch.version_of``: URL, size, ETag or
        modification time). It names the copy, so that a shard rewritten at the same size is fetched
        again (:meth:`name`), and a download (or, local, the file opened) is checked against it.

        Raises:
            ShardError: the shard is missing, changed since ``version`` was taken, of another size,
                or could not be fetched after the retries (names the URL and ``sample``).
            OSError, ValueError: ``derived.make`` could not read the shard.
        """
        return self._get(url, size, sample, derived, version, wait=True)

    def fetch_now(self, url: str, size: int, derived: Derived | None, version: str | None) -> str:
        """:meth:`path` for the prefetch: never waits for another process's fetch of the same shard.

        Raises:
            fetch.Busy: another process of the node holds the shard's lock (the prefetch puts it off).
            ShardError, OSError, ValueError: as :meth:`path` (the prefetch records them in :attr:`errors`).
        """
        return self._get(url, size, None, derived, version, wait=False)

    def _get(self, url: str, size: int, sample: int | None, derived: Derived | None, version: str | None, *,
             wait: bool, keep_ledger: bool = False) -> str:
        """:meth:`path`; ``wait=False``: raise ``fetch.Busy`` at once if another process holds its lock;
        ``keep_ledger``: a download keeps the ledger of the shard's pieces (:meth:`_make` removes it)."""
        if is_local(url):
            path = local_path(url)
            if not os.path.isfile(path):
                raise ShardError(f"shard {url} {for_sample(sample)}does not exist (was it moved or deleted?)")
            check_unchanged(self.filesystem(url), url, version, sample)  # a stat: size and modification time
            if derived is None:
                return path  # read in place
        final = self.kept(url, derived, version)
        # A derived file is renamed into place whole: existing means complete.
        if final.exists() if derived is not None else complete(final, size):
            touch(final)
            return str(final)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            instead = ", or ShardedSource(decode=\"worker\") to read local Parquet in place" if is_local(url) else ""
            raise ShardError(f"shard {url} {for_sample(sample)}cannot be kept in the cache directory {self.directory} "
                             f"({error}): give ShardCache(directory=...) a folder this process can write (or set "
                             f"$SHARDWISE_SHARD_CACHE){instead}") from error
        with locked(final, url, sample, self.timeout if wait else None):
            if derived is not None:
                if not final.exists():  # another process may have made it while we waited
                    # One at a time in this process under a budget, readers and prefetch threads alike: each
                    # makes room for its own file only, so two made at once could pass the budget together.
                    with self.serial if self.budget_bytes is not None else contextlib.nullcontext():
                        self._make(url, size, sample, derived, version, final)
            elif not complete(final, size):
                self._download(url, final, size, sample, version, keep_ledger)
        self._evict(keep=final.name)
        return str(final)

    def _make(self, url: str, size: int, sample: int | None, derived: Derived, version: str | None,
              final: Path) -> None:
        """Make ``final`` from the shard (fetched into memory, or from its downloaded file); the caller holds
        ``final``'s lock."""
        shard = self.kept(url, None, version)
        part = final.with_name(f"{final.name}{PART}{os.getpid()}")
        try:
            if is_local(url):  # made from the file where it lies: nothing fetched, nothing deleted
                derived.make(local_path(url), str(part))
                self._place(part, final, size)
            elif size <= IN_MEMORY and not complete(shard, size):
                # In memory, never written: on disk, the shard would be written, synced, read back and deleted.
                # Meanwhile the rows its pieces hold are read from them (NOTE [ Head first ] in head.py).
                with locked(shard, url, sample, self.timeout):
                    data, copied = fetch(self.filesystem(url), url, shard, size, version, sample,
                                         retries=self.retries, backoff=self.backoff, timeout=self.timeout)
                    self.add_fetched(copied)
                    derived.make(memoryview(data), str(part))
                    del data
                    self._place(part, final, size)
                    remove_leftovers(shard)  # its pieces (sparse file, ledger): the derived file is in place
            else:
                # The ledger of the shard's pieces stays until the derived file is in place: the rows it
                # promised (a pass's first batch) are read from the whole shard meanwhile, others wait.
                self._get(url, size, sample, None, version, wait=True, keep_ledger=True)
                derived.make(str(shard), str(part))
                shard.unlink(missing_ok=True)  # the derived file stands for it from now on
                self._place(part, final, size)
                heads.ledger_path(shard).unlink(missing_ok=True)
        finally:
            part.unlink(missing_ok=True)
        remove_leftovers(final)

    def _place(self, part: Path, final: Path, size: int) -> None:
        """Rename the derived file ``part``, made from a shard of ``size`` bytes, into place as ``final``, room made
        first: the node's files never pass the budget, not even briefly."""
        made = os.stat(part).st_size
        with self.mutex:
            self._made_bytes += made
            self._made_from += size
        self._make_room(made, keep=final.name)
        os.replace(part, final)

    def kept_size(self, size: int, derived: Derived | None) -> int:
        """The bytes a shard of ``size`` bytes will take in the cache, kept as ``derived`` (the caller holds
        ``mutex``).

        A derived file's size is known only once made: it is estimated from the files this process has made so
        far (their bytes over their shards'; decoded Parquet is larger, a column subset smaller). Counting the
        shard's own size instead, the prefetch took room it did not have, and the file placed evicted a shard read
        sooner, fetched again later (1 rank, decoded files ~1.2x their Parquet: 1.14-1.17x the dataset fetched;
        ``tests/data/test_sharded_node_bytes.py``).
        """
        if derived is None or not self._made_from:
            return size
        return int(size * self._made_bytes / self._made_from)

    def _download(self, url: str, final: Path, size: int, sample: int | None, version: str | None,
                  keep_ledger: bool) -> None:
        self._make_room(size, keep=final.name)  # before the download is renamed into place (see _make)
        copied = download(self.filesystem(url), url, final, size, version, sample, retries=self.retries,
                          backoff=self.backoff, timeout=self.timeout, keep_ledger=keep_ledger)
        self.add_fetched(copied)

    def add_fetched(self, nbytes: int) -> None:
        """Count ``nbytes`` this process downloaded (:attr:`fetched_bytes`; readers and prefetch threads at once)."""
        with self.mutex:
            self.fetched_bytes += nbytes

    # -- the plan ------------------------------------------------------------------------------
    def follow(self, shards: Sequence[tuple[str, int, str | None]], derived: Derived | None = None,
               head: Sequence[Head] = ()) -> None:
        """The shards ``(url, size, version)`` the plan reads next, in order: prefetch them, keep them (remote
        ones; local ones too when a file is derived from each).

        Replaces the previous list: shards not in it are the first evicted. ``derived``: the file
        to keep in each shard's place (:class:`Derived`), made when the shard is prefetched.
        ``head``: Parquet shards ``(url, size, version, rows)`` whose ``rows`` the plan reads first
        (a pass's first batch): their footers and those rows' row groups are fetched before any
        whole shard, and readers of those rows wait for them, not for the whole shard (NOTE [ Head
        first ] in ``head.py``). Promised now, before this returns; ignored without prefetch threads.
        """
        # Local shards are read in place, unless a file is derived from each (decoded once a node, ahead too).
        kept = [shard for shard in shards if derived is not None or not is_local(shard[0])]
        self._upcoming = {shard_key(self.name(shard[0])): i for i, shard in enumerate(kept)}
        if self.budget_bytes is not None:  # the node's other ranks evict by it too
            budgeting.write_plan(self.directory, list(self._upcoming))
        self._prefetch.follow(kept, derived, head)

    def close(self) -> None:
        """Stop the prefetch threads (they also stop with the process: they are daemons)."""
        self._prefetch.close()

    def room_for(self, key: str, nbytes: int, inflight: Mapping[str, int]) -> bool:
        """Whether prefetching ``nbytes`` for shard ``key`` fits the budget (``budget.has_room``), ``inflight`` (shard
        key -> bytes) being fetched by this process meanwhile; the caller holds ``mutex``.

        Never for a shard the plan no longer lists: the plan moved on while the thread waited for the node's
        lock, and the node may have evicted the shard as read meanwhile (4 ranks a node, ``decode="worker"``:
        fetched again for nothing in one run of two, 1.11-1.15x the dataset).
        """
        if self.budget_bytes is None:
            return True
        if key not in self._upcoming:
            return False
        listed = budgeting.listing(self.directory)  # one scan of the directory, read three ways
        return budgeting.has_room(budgeting.cached_files(listed), key, nbytes, self.budget_bytes,
                                  budgeting.node_upcoming(listed, self._upcoming),
                                  budgeting.node_inflight(listed, inflight), self._pinned)

    def _evict(self, keep: str) -> None:  # keep: a file name
        """Bring the cache under its budget (``budget.evict``)."""
        self._make_room(0, keep)

    def _make_room(self, incoming: int, keep: str) -> None:  # keep: a file name
        """Evict until ``incoming`` more bytes (a file about to be renamed into place) fit the budget."""
        if self.budget_bytes is not None:
            listed = budgeting.listing(self.directory)
            budgeting.evict(budgeting.cached_files(listed), self.budget_bytes - incoming,
                            budgeting.node_upcoming(listed, self._upcoming), self._pinned, shard_key(keep))

