"""A sharded dataset's metadata: the shard URLs, each shard's identity, and its counts and columns, once per node.

The per-shard sample counts (and a length or label column, if asked) come from the shards'
metadata (Parquet footers, Arrow IPC record-batch headers, tar member names) and are kept in the
shared index cache (``shardwise.index.build_or_open``), keyed by every shard's identity (URL,
size, ETag or modification time: ``fetch.identity``): a changed shard is read again, an unchanged
dataset costs a listing of each folder of remote shards (``stat_shards``: ~100 requests at 1e5
shards) or one ``HEAD`` (local: ``stat``) a shard, once for the ranks of a node that start together
(the first lists, the others read what it found in the node cache's directory).

Cost at indexing (16 shards at a time: :data:`READERS`): a Parquet shard's footer (one or two
ranged reads); an Arrow IPC or WebDataset shard read whole once. A length or label column is
read whole, its own column chunks only (Parquet): an integer column costs its own bytes, but the
lengths of a list or string column (token ids, text) cost that column's bytes, most of a dataset
of token ids; store lengths as an integer column where start-up reads matter.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from ..._core.errors import check_iterable
from ..._core.foreign import private
from ..._core.threads import KernelThreads
from ...index import build_or_open
from ...index.cache import CacheDir
from .budget import alive
from .fetch import Identity, identity, is_local
from .formats import Format, ShardError, format_of, read_column, shard_facts

KIND = "sharded-meta"
_STRIP_PROTOCOL = private("fsspec", "_strip_protocol")  # a URL as the filesystem's listing names it


def expand_urls(urls: object, storage_options: dict[str, Any], shared: Path | None = None) -> list[str]:
    """A list of shard URLs from a list, a glob (``s3://bucket/train-*.parquet``) or a folder.

    ``shared`` (the node cache's directory): a remote folder or glob is listed once for the ranks of a
    node that start together (:func:`node_once`), not once a rank.
    """
    if isinstance(urls, (str, os.PathLike)):
        text = os.fspath(urls)
        if shared is not None and "://" in text and not is_local(text):
            found: list[str] = node_once(shared, EXPANDED, [text, storage_options],
                                         lambda: _expand(text, storage_options))  # fmt: skip
            return found
        return _expand(text, storage_options)
    listed = [os.fspath(u) for u in check_iterable("urls", urls, of="shard URLs")]
    if not listed or not all(isinstance(u, str) and u for u in listed):
        raise ValueError(f"urls should be a non-empty list of shard URLs, but got urls={urls!r}")
    return listed


def _expand(text: str, storage_options: dict[str, Any]) -> list[str]:
    """The shard URLs of the folder or glob ``text`` (or ``[text]``, a shard)."""
    import fsspec

    fs, _, paths = fsspec.get_fs_token_paths(text, storage_options=storage_options)
    protocol = text.split("://", 1)[0] + "://" if "://" in text else ""
    if len(paths) == 1 and fs.isdir(paths[0]):
        paths = sorted(p for p in fs.find(paths[0]) if format_of(p) is not None)
    elif len(paths) == 1 and format_of(paths[0]) is None and not fs.exists(paths[0]):
        # Neither a folder nor a shard file: without this, the next error would be about format=.
        raise ValueError(
            f"urls should name shard files, a glob or a folder, but urls={text!r} does not exist; check the "
            "path (and storage_options for a remote one)"
        )
    found = [protocol + p if protocol and not p.startswith(protocol) else p for p in paths]
    if not found:
        raise ValueError(f"urls should name shard files, but urls={text!r} matched none (.parquet, .arrow, .tar)")
    return found


LISTED = 8
"""Remote shards in one folder from which one listing of it stands for their ``HEAD`` s (:func:`stat_shards`)."""


SHARED_FOR = 120.0
"""Seconds a node's identities (:func:`stat_shards` with ``shared``) stand for the other ranks of the node's job."""


def stat_shards(urls: list[str], filesystem: Callable[[str], Any], shared: Path | None = None) -> list[Identity]:
    """Every shard's identity ``(url, size, version)``, as ``info`` reports it; with ``shared`` (the node cache's
    directory), taken once for the ranks of a node that start together (:func:`_node_identities`).

    A folder holding :data:`LISTED` or more remote shards is listed (``ls``, detail: size and ETag
    of up to 1,000 objects a request on S3) instead of one ``HEAD`` a shard: 1e5 shards cost ~100
    requests a rank, not 1e5 in a row. The listing is trusted only where it reports the same
    identity as ``info`` for the folder's first shard (one ``HEAD``); a shard it does not list, and
    every shard of a filesystem without listings, costs its own ``info``. Local shards: a ``stat``
    each. The listing is dropped from the filesystem's cache afterwards (a dict an object). A folder
    holding far more objects than the shards asked for costs its whole listing (1,000 a request).
    """
    if shared is not None and not all(is_local(url) for url in urls):
        return _node_identities(urls, filesystem, shared)
    listed: dict[str, Identity] = {}
    folders: dict[str, list[str]] = {}
    for url in urls:
        if not is_local(url):
            folders.setdefault(url.rpartition("/")[0], []).append(url)
    for folder, members in folders.items():
        if len(members) >= LISTED:
            listed.update(_listed(folder, members, filesystem))
    return [listed.get(url) or _stat(url, filesystem) for url in urls]


IDENTITIES = ".identities-"
"""The node cache's file of the identities a process took: ``.identities-<hash of the URLs>`` (a dot: never a shard)."""
EXPANDED = ".urls-"
"""The node cache's file of the shard URLs a folder or glob expanded to: ``.urls-<hash of it and the options>``."""


def _node_identities(urls: list[str], filesystem: Callable[[str], Any], directory: Path) -> list[Identity]:
    """:func:`stat_shards` once for the ranks of a node that start together: one listing and one ``HEAD`` a node.

    Every rank of a node lists the shards' folders at start-up otherwise: R ranks a node, R times the
    requests (~100 a rank at 1e5 shards, on storage that bills and throttles them). The ranks then agree
    on every shard's version even when a shard is rewritten while they start (:func:`node_once`).
    """
    stats = node_once(directory, IDENTITIES, urls, lambda: stat_shards(urls, filesystem))
    return [(str(url), int(size), str(version)) for url, size, version in stats]


def node_once(directory: Path, prefix: str, key: object, compute: Callable[[], Any]) -> Any:
    """``compute()`` (JSON data) once for the ranks of a node that start together: the first takes the file lock
    ``directory/<prefix><hash of key>.lock``, computes and writes the result there; the others wait for the lock
    and read it.

    A process reads another's result only when it is fresh: written less than :data:`SHARED_FOR`
    seconds ago by a live process of the same job (the same parent process, as torchrun's, Slurm's and
    ``mp.spawn``'s ranks have, or this process's parent, as Lightning's ranks other than 0 have), never
    its own (a source built again asks storage again) nor a finished run's. Only the hash of ``key`` is
    written (it may hold credentials). A directory that cannot be written, or a lock held too long,
    leaves this process to compute by itself.
    """
    try:
        digest = hashlib.blake2b(json.dumps(key, sort_keys=True, default=repr).encode(), digest_size=12).hexdigest()
    except (TypeError, ValueError):
        return compute()
    path = directory / f"{prefix}{digest}"
    lock = FileLock(str(path) + ".lock")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=SHARED_FOR)
    except (OSError, Timeout):
        return compute()
    try:
        found = _fresh(path, digest)
        if found is not None:
            return found
        value = compute()
        part = path.with_name(f"{path.name}.part{os.getpid()}")
        with contextlib.suppress(OSError):  # not shared then: each rank asks storage, as without a cache directory
            part.write_text(json.dumps({"pid": os.getpid(), "parent": os.getppid(), "key": digest, "value": value}))
            os.replace(part, path)
        return value
    finally:
        lock.release()


def _fresh(path: Path, digest: str) -> Any:
    """What ``path`` holds if another live process of this job wrote it for ``digest`` moments ago, else ``None``."""
    try:
        if time.time() - path.stat().st_mtime >= SHARED_FOR:
            return None
        written = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid = written.get("pid")
    if (not isinstance(pid, int) or pid == os.getpid() or not alive(pid) or written.get("key") != digest
            or (written.get("parent") != os.getppid() and pid != os.getppid())):  # fmt: skip
        return None
    return written.get("value")


def _stat(url: str, filesystem: Callable[[str], Any]) -> Identity:
    try:
        info = filesystem(url).info(url)
    except FileNotFoundError as error:
        raise ShardError(f"shard {url} does not exist; check urls and storage_options") from error
    return identity(url, info)


def _listed(folder: str, members: list[str], filesystem: Callable[[str], Any]) -> dict[str, Identity]:
    """The identities of ``members`` (URLs in ``folder``) that one listing of the folder reports as ``info`` would."""
    fs = filesystem(members[0])
    try:
        fs.invalidate_cache(folder)  # a listing cached earlier would report old ETags
        entries = fs.ls(folder, detail=True)
    except Exception:  # a shortcut: any failure (HTTP without an index page, a client's own error type, no
        return {}  # permission to list) falls back to one info a shard
    finally:
        fs.invalidate_cache(folder)
    by_name = {entry.get("name"): entry for entry in entries if isinstance(entry, dict)}
    found: dict[str, Identity] = {}
    for url in members:
        entry = by_name.get(getattr(fs, _STRIP_PROTOCOL)(url))
        if entry is not None and entry.get("type") == "file" and entry.get("size") is not None:
            found[url] = identity(url, entry)
    first = members[0]
    checked = _stat(first, filesystem)
    if found.get(first) != checked:  # another version field than info's: trust info alone (the first is taken)
        return {first: checked}
    return found


def read_metadata(stats: list[Identity], fmt: Format, length_column: str | None, label_column: str | None,
                  filesystem: Callable[[str], Any], index_dir: CacheDir) -> dict[str, np.ndarray]:
    """The shards' ``counts``, ``bytes``, ``names`` (the columns every shard has) and, if asked, ``lengths``
    and ``labels``: from the node's index cache, built once (a changed shard changes the key)."""
    # "names": entries hold the columns every shard has (names.npy), which earlier entries did not.
    options = [fmt.value, length_column, label_column, "names"]
    key = hashlib.blake2b(json.dumps([options, stats]).encode(), digest_size=16).hexdigest()

    def build(directory: Path) -> None:
        counts: list[int] = []
        values: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])  # the length and label columns, shard by shard
        common: list[str] | None = None  # the columns every shard read so far has
        for (url, _, _), (rows, names, asked) in zip(
                stats, _read_facts(stats, fmt, (length_column, label_column), filesystem), strict=True):
            counts.append(rows)
            common = names if common is None else [name for name in common if name in names]
            missing = [(option, column) for option, column in (("length_column", length_column),
                       ("label_column", label_column)) if column is not None and column not in names]
            if missing:
                option, column = missing[0]
                what = "member extensions" if fmt is Format.WEBDATASET else "columns"
                raise ValueError(
                    f"{option} should name a column of the shards, but got {option}={column!r}, which shard "
                    f"{url} does not have; its {what} are {names}"
                )
            for kept, got in zip(values, asked, strict=True):
                if got is not None:
                    kept.append(got)
        np.save(directory / "counts.npy", np.asarray(counts, dtype=np.int64))
        np.save(directory / "names.npy", np.asarray(common or [], dtype=str))
        np.save(directory / "bytes.npy", np.asarray([size for _, size, _ in stats], dtype=np.int64))
        for name, wanted, kept in (("lengths", length_column, values[0]), ("labels", label_column, values[1])):
            if wanted is not None:
                np.save(directory / f"{name}.npy", np.concatenate(kept))

    return build_or_open(KIND, key, build, cache_dir=index_dir)


READERS = 16
"""Shards whose metadata is read at once when the index is built (their round trips to storage overlap)."""
Facts = tuple[int, list[str], list[np.ndarray | None]]  # rows, column names, each asked column's values, else None


def _read_facts(stats: list[Identity], fmt: Format, columns: tuple[str | None, ...],
                filesystem: Callable[[str], Any]) -> Iterator[Facts]:
    """Each shard's :data:`Facts`, in order, read :data:`READERS` at a time (1e5 remote shards one after another:
    hours of round trips), at most ``4 * READERS`` ahead of the caller. Raises the error of the first
    shard, in order, that could not be read; the reads not started are dropped when the caller stops."""
    with KernelThreads(min(READERS, len(stats)), name="shardwise-index-read") as readers:
        ahead: collections.deque[Future[Facts]] = collections.deque()
        for url, _, _ in stats:
            ahead.append(readers.submit(_facts, url, fmt, columns, filesystem))
            if len(ahead) >= 4 * READERS:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def _facts(url: str, fmt: Format, columns: tuple[str | None, ...], filesystem: Callable[[str], Any]) -> Facts:
    """Shard ``url``'s rows, column names and the values of those of ``columns`` (``None``: not asked) it has."""
    fs = filesystem(url)
    try:
        with fs.open(url, "rb") as handle:
            rows, names = shard_facts(handle, fmt)
            values: list[np.ndarray | None] = []
            for column in columns:
                if column is not None and column in names:  # one it lacks is refused by the caller, naming it
                    handle.seek(0)
                    values.append(read_column(handle, fmt, column))
                else:
                    values.append(None)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ShardError(f"could not read the metadata of shard {url} as {fmt.value}: {error}") from error
    return rows, names, values
