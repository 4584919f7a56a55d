"""The node cache's byte budget: what a prefetch may take room from, and what is evicted first.

The plan gives every shard a rank in its reading order (``upcoming``: shard key -> rank; a shard
absent from it is not read again this epoch). The node's ranks share one cache and read the same
shards at about the same time, each at its own pace: each process that follows a plan writes its
reading order to the cache directory (``write_plan``), and the ranks used are the node's
(``node_upcoming``: the soonest any live process reads each shard), so that a rank ahead of the
others never evicts a shard a rank behind it still reads (with one rank's order alone, 4 ranks a
node fetched 1.13x the dataset under the minimum budget, ``bench/bench_sharded_sources.py``). A
prefetch may make room only by evicting shards the plan reads later than the one fetched (or never);
eviction takes the shards the plan no longer reads first (least recently used first), then the ones
it reads last. Shards pinned by a reader between its download and its open are never evicted by this
process. A prefetch counts the shards every process of the node is prefetching (``reserve``,
``node_inflight``: an empty file a prefetch, checked and made under the node's ``room_lock``). Pure
functions over the directory listing (``listing``: one ``os.scandir`` a budget check, read three ways);
:class:`~shardwise.data.sharded.cache.ShardCache` and its prefetch (``prefetch.Prefetch``) hold the state.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from filelock import FileLock

from .fetch import shard_key, temporary

PLAN = ".plan-"  # a process's reading order, one file a process that follows a plan: .plan-<pid>
FETCHING = ".fetching-"  # a prefetch under way: .fetching-<pid>-<shard key>-<bytes>, an empty file
Listing = list[os.DirEntry[str]]  # the cache directory's entries, read once (listing)


class Cached(NamedTuple):
    """A whole shard (or derived file) in the cache directory."""

    key: str  # fetch.shard_key of its name: the same for every file kept of one shard
    path: str
    size: int
    used: float  # last access time


def listing(directory: Path) -> Listing:
    """The entries of the cache ``directory`` (none before it exists).

    A budget check reads the directory three ways (:func:`cached_files`, :func:`node_upcoming`,
    :func:`node_inflight`): they share this one ``os.scandir`` instead of one each.
    """
    if not directory.is_dir():
        return []
    with os.scandir(directory) as entries:
        return list(entries)


def cached_files(listed: Listing) -> list[Cached]:
    """Every whole shard or derived file of the cache directory's :func:`listing` (no locks, no files being written)."""
    # Other processes of the node evict too: a file may vanish between listing and stat.
    files: list[Cached] = []
    for entry in listed:
        if temporary(entry.name):
            continue
        with contextlib.suppress(FileNotFoundError):
            stat = entry.stat()
            files.append(Cached(shard_key(entry.name), entry.path, stat.st_size, stat.st_atime))
    return files


def has_room(files: list[Cached], key: str, size: int, budget: int, upcoming: Mapping[str, int],
             inflight: Mapping[str, int], pinned: Collection[str]) -> bool:
    """Whether ``size`` more bytes for shard ``key`` fit ``budget`` by evicting only shards read after it (or never).

    ``inflight``: shard key -> bytes being downloaded now; those read sooner count at their size.
    """
    never = len(upcoming)
    rank = upcoming.get(key, never)
    kept = sum(f.size for f in files
               if f.key != key and f.key not in inflight and (upcoming.get(f.key, never) < rank or f.key in pinned))
    flying = sum(nbytes for other, nbytes in inflight.items() if upcoming.get(other, never) < rank)
    return kept + flying + size <= budget


def evict(files: list[Cached], budget: int, upcoming: Mapping[str, int], pinned: Collection[str], keep: str) -> None:
    """Delete files until ``files`` fit ``budget``: shards not read again first (oldest), then the latest read.

    ``keep`` (a shard key) and ``pinned`` shards stay.
    """
    total = sum(f.size for f in files)
    if total <= budget:
        return
    never = len(upcoming)
    for f in sorted(files, key=lambda f: (-upcoming.get(f.key, never), f.used)):
        if total <= budget:
            break
        if f.key == keep or f.key in pinned:
            continue
        Path(f.path).unlink(missing_ok=True)  # readers that opened or mapped it keep their copy
        total -= f.size


@contextlib.contextmanager
def room_lock(directory: Path, timeout: float) -> Iterator[None]:
    """The node's lock on its prefetch reservations: a process checks for room and reserves it atomically, so
    that two processes never both take the same room (each saw the other's shard not yet fetched)."""
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory / ".room.lock"), timeout=timeout):
        yield


def reserve(directory: Path, key: str, size: int) -> Path:
    """Publish that this process is prefetching shard ``key`` (``size`` bytes) to the node's other processes."""
    path = directory / f"{FETCHING}{os.getpid()}-{key}-{size}"
    path.touch()
    return path


def node_inflight(listed: Listing, own: Mapping[str, int]) -> dict[str, int]:
    """``own`` (shard key -> bytes this process is prefetching) with every other live process's reservations
    (in the cache directory's :func:`listing`).

    Without them, each rank of a node saw room for its own prefetches only: 4 ranks a node fetched
    up to 1.23x the dataset under the minimum budget, placing shards at once and so evicting shards
    the plan still read (``bench/bench_sharded_sources.py``, about one run in four). A reservation of
    a process that is gone is removed.
    """
    merged = dict(own)
    for entry in listed:
        if not entry.name.startswith(FETCHING):
            continue
        pid, _, rest = entry.name[len(FETCHING):].partition("-")
        key, _, size = rest.partition("-")
        if not pid.isdigit() or not size.isdigit() or int(pid) == os.getpid():
            continue
        if not alive(int(pid)):  # killed while prefetching: nothing will come of it
            Path(entry.path).unlink(missing_ok=True)
            continue
        merged[key] = max(merged.get(key, 0), int(size))
    return merged


def write_plan(directory: Path, keys: list[str]) -> None:
    """Publish this process's reading order (shard keys, soonest first) to the node's other processes."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{PLAN}{os.getpid()}"
    part = path.with_name(path.name + ".part")
    part.write_text("\n".join(keys))
    os.replace(part, path)  # readers see a whole order or the previous one


def node_upcoming(listed: Listing, own: Mapping[str, int]) -> dict[str, int]:
    """``own`` with every shard any other live process of the node reads sooner ranked as that process ranks it
    (their plans in the cache directory's :func:`listing`)."""
    merged = dict(own)
    for entry in listed:
        if not entry.name.startswith(PLAN) or ".part" in entry.name:
            continue
        pid = int(entry.name[len(PLAN):]) if entry.name[len(PLAN):].isdigit() else -1
        if pid == os.getpid():
            continue
        if not alive(pid):  # its process is gone: its order is removed (a process of the node writes only its own)
            if pid > 0:
                Path(entry.path).unlink(missing_ok=True)
            continue
        with contextlib.suppress(FileNotFoundError):
            for rank, key in enumerate(Path(entry.path).read_text().split()):
                if rank < merged.get(key, rank + 1):
                    merged[key] = rank
    return merged


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this node runs (a plan file of an exited process is ignored)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
