"""A shard's identity and the cache directory's file rules (the download itself: ``download.py``).

A shard's *identity* is ``(url, size, version)``, the version its ETag (object stores) or
modification time (local and other filesystems), as ``fsspec``'s ``info`` reports them.
``ShardedSource`` records it at indexing; :func:`version_of` hashes it to the 16 hex digits the
cache names its copy by. A shard is checked against it whenever it is fetched or opened:

- remote: the download (one streamed ``GET``) is followed by one ``HEAD`` (``info``, listing
  cache dropped). A shard rewritten before or during the ``GET`` reports another ETag or size
  there, so the copy is refused before anything reads it; a shard rewritten after the ``HEAD``
  was downloaded whole as indexed. (fsspec's ``get_file`` returns no response headers, and
  ``s3fs`` splits a large object into ranged ``GET`` s, so the ETag of the ``GET`` itself is not
  at hand for every filesystem; the ``HEAD`` costs one round trip a download.)
- local: ``info`` (a ``stat``: size and modification time) before the shard is opened.

A changed identity is a :class:`~shardwise.data.sharded.formats.ShardError` naming the URL, never
retried; a transient error (a truncated download, a connection reset) is retried with backoff
(``download.transient_errors``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .formats import ShardError

PART = ".part"

Identity = tuple[str, int, str]
"""``(url, size in bytes, version)``: what the index records of a shard, and what a fetch is checked against."""


def identity(url: str, info: dict[str, Any]) -> Identity:
    """A shard's identity from fsspec's ``info`` of it: the version is the ETag, else the modification time."""
    version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or ""
    return (url, int(info["size"]), str(version))


def version_of(shard: Identity) -> str:
    """16 hex digits hashing a shard's identity: the cache names its copies by it."""
    digest = hashlib.blake2b(json.dumps(list(shard)).encode(), digest_size=8).digest()
    return f"{int.from_bytes(digest, 'little'):016x}"


def is_local(url: str) -> bool:
    """Whether ``url`` is a path on this node (no protocol, or ``file://``)."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """The path of a local URL."""
    return url[len("file://") :] if url.startswith("file://") else url


def for_sample(sample: int | None) -> str:
    """``"(needed for sample 12) "``, or nothing: the part of an error that names the sample."""
    return "" if sample is None else f"(needed for sample {sample}) "


def check_unchanged(fs: Any, url: str, version: str | None, sample: int | None) -> None:
    """Raise :class:`ShardError` if shard ``url`` is no longer the one indexed (``version``: :func:`version_of`).

    ``None``: nothing recorded, nothing checked. Cost: one ``info`` (a ``HEAD`` remote, a ``stat`` local).
    """
    if version is None:
        return
    with contextlib.suppress(Exception):  # a listing cached by fs.find would answer with the old ETag
        fs.invalidate_cache(url)
    try:
        info = fs.info(url)
    except FileNotFoundError as error:
        raise ShardError(f"shard {url} {for_sample(sample)}does not exist (was it moved or deleted?)") from error
    check_identity(url, info, version, sample)


def check_identity(url: str, info: dict[str, Any], version: str, sample: int | None) -> None:
    """Raise :class:`ShardError` if ``info`` (fsspec's, of shard ``url`` now) is not the identity ``version`` hashes."""
    now = identity(url, info)
    if version_of(now) != version:
        raise ShardError(
            f"shard {url} {for_sample(sample)}changed since it was indexed (now {now[1]} bytes, version "
            f"{now[2]!r}): its samples are not the ones the index counted, so none is served; build the "
            "ShardedSource again to read the new data"
        )


def shard_key(name: str) -> str:
    """What every file the cache keeps of one shard starts with (the hash of its URL)."""
    return name.partition("-")[0]


def remove_leftovers(final: Path, keep: Path | None = None) -> None:
    """Delete the temporary files of ``final`` that killed processes left (the caller holds its lock), but ``keep``.

    A name prefix, not a glob: a shard's file name may hold ``[`` or ``*``.
    """
    prefix = final.name + PART
    kept = None if keep is None else keep.name
    for entry in os.scandir(final.parent):
        if entry.name.startswith(prefix) and entry.name != kept:
            Path(entry.path).unlink(missing_ok=True)


def temporary(name: str) -> bool:
    """Whether a cache directory entry is a lock or a file being written (never a shard to read or count)."""
    return name.endswith(".lock") or PART in name or name.startswith(".")  # .plan-<pid>: budget.write_plan


def complete(path: Path, size: int) -> bool:
    """Whether ``path`` exists with ``size`` bytes."""
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


def touch(path: Path) -> None:
    """Mark ``path`` as just used (eviction is least recently used first)."""
    # Evicted by another process meanwhile: the reader's open fails and it fetches the shard again.
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)


@dataclasses.dataclass(frozen=True)
class Derived:
    """A file the cache keeps in place of a shard, made from it once per node.

    Attributes:
        tag: names what the file is made from and how (a changed shard or option makes another
            tag, hence another file): letters, digits, ``_`` and ``.``.
        make: ``make(shard, output_path)`` writes the file from ``shard``, the path of the whole
            shard or (one up to ``cache.IN_MEMORY`` bytes, never written to disk) a ``memoryview`` of
            its bytes; picklable: DataLoader workers call it. ``OSError`` and ``ValueError`` mean the
            shard is unreadable.
    """

    tag: str
    make: Callable[[str | memoryview, str], None]


def default_cache_dir() -> Path:
    """``$SHARDWISE_SHARD_CACHE``, else ``$XDG_CACHE_HOME/shardwise/shards``, else ``~/.cache/shardwise/shards``."""
    explicit = os.environ.get("SHARDWISE_SHARD_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardwise" / "shards"


class Busy(Exception):
    """Another process holds the shard's lock (raised instead of waiting: the prefetch thread moves on)."""


@contextlib.contextmanager
def locked(final: Path, url: str, sample: int | None, timeout: float | None) -> Iterator[None]:
    """Hold ``final``'s file lock: wait at most ``timeout`` s (then a ShardError); ``None``: not at all (Busy)."""
    lock = FileLock(str(final) + ".lock", timeout=0 if timeout is None else timeout)
    try:
        lock.acquire()
    except Timeout as error:
        if timeout is None:
            raise Busy(url) from error
        raise ShardError(
            f"shard {url} {for_sample(sample)}was being downloaded by another process for more than "
            f"{timeout:g} s; raise ShardCache(timeout=...) or remove the stale lock {final}.lock"
        ) from error
    try:
        yield
    finally:
        lock.release()
