"""The shared index cache: build an index once per node, memory-map it read-only everywhere.

:func:`build_or_open` is the one entry point. An entry is a directory of ``.npy`` files plus a
``manifest.json``, named by a digest of ``(kind, key, FORMAT_VERSION)``, in a cache directory:

- found and intact: every ``.npy`` is memory-mapped read-only and returned (a few stat calls,
  a small JSON read and a sampled checksum: milliseconds at any size);
- missing, truncated, corrupt or foreign: one process builds it under a file lock (the others
  wait, up to ``timeout`` seconds, then fail with a clear error, never a hang), into a
  temporary directory beside the entry that is fsynced and renamed into place, so a reader
  never sees half an entry;
- disabled (``SHARDWISE_CACHE=off`` or ``cache_dir=False``) or read-only: built in a temporary
  directory, loaded into private memory and deleted, with one warning per process and kind that
  states the memory this costs.

Entries are never deleted automatically, except those a new entry *replaces*: a per-epoch index
(e.g. a sampler's epoch plan) passes ``replaces=`` so that the process that builds epoch ``e``
removes the entries of other epochs it no longer needs (:func:`remove_entries`).

Integrity (:mod:`shardwise.index.manifest`, :mod:`shardwise.index.integrity`): the manifest
records, for each file, its byte size, dtype, shape and header size, a CRC-32 of 16 sampled
blocks, the full CRC-32 and the range of its values. A file of another size or header, other
sampled bytes, or (files up to 4 MiB, at every open; larger ones once per node, in the background)
another full checksum makes the entry invalid and it is rebuilt (logged); every value a plan reads
is checked against the recorded range (:func:`read_checked`).

Progress (:mod:`shardwise.index.progress`): a process that waits for another one's build says
once which entry it waits for and which host/pid builds it; ``SHARDWISE_PROGRESS=off`` silences it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .._core.errors import check_callable, check_path, check_seconds, check_str
from .._core.files import fsync_path
from .manifest import FORMAT, FORMAT_VERSION, MANIFEST, IndexCacheError, Invalid, open_checked, write_manifest
from .progress import Heartbeat, note

logger = logging.getLogger("shardwise")

SHARED_FROM = 1 << 18
"""From this many samples on, a sampler's O(n) tables live in the node's shared index cache (built
once per node, memory-mapped by every rank); below it they are built privately (a few MB at most:
cheaper than files)."""

DEFAULT_TIMEOUT = 600.0
"""Seconds a process waits for another one building the same entry (a 1e9-entry build takes minutes)."""
ENV_DIR = "SHARDWISE_CACHE_DIR"
ENV_SWITCH = "SHARDWISE_CACHE"
_OFF = {"off", "0", "false", "no", "disabled"}

CacheDir = str | os.PathLike[str] | None | bool
"""``None``: the default directory; a path: that directory; ``False``: no cache (build in memory)."""

_warned: set[tuple[str, str]] = set()


class IndexCacheTimeout(TimeoutError):
    """Another process held the build lock of an entry for longer than ``timeout`` seconds."""


def default_cache_dir() -> Path:
    """``$SHARDWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardwise``, else ``~/.cache/shardwise``."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "shardwise"


def cache_enabled() -> bool:
    """False when ``SHARDWISE_CACHE`` is ``off`` (or ``0``, ``false``, ``no``, ``disabled``)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in _OFF


def entry_name(kind: str, key: str) -> str:
    """The directory name of an entry: ``<kind>-<digest of kind, key and format version>``."""
    kind, key = _check_kind(kind), check_str("key", key, allow_empty=True)
    digest = hashlib.blake2b(f"{FORMAT}:{FORMAT_VERSION}:{kind}:{key}".encode(), digest_size=12).hexdigest()
    return f"{kind}-{digest}"


def _check_kind(kind: object) -> str:
    if not isinstance(kind, str) or not kind or not all(c.isalnum() or c in "-_." for c in kind):
        raise ValueError(f"kind should be a non-empty name of letters, digits, '-', '_' or '.', but got kind={kind!r}")
    return kind


def build_or_open(
    kind: str,
    key: str,
    build: Callable[[Path], None],
    *,
    cache_dir: CacheDir = None,
    timeout: float = DEFAULT_TIMEOUT,
    replaces: Callable[[str], bool] | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of the index ``(kind, key)``: opened from the cache, or built once and cached.

    Args:
        kind: what the index is (e.g. ``"length-order"``); part of the entry's name.
        key: identifies the input (e.g. :func:`shardwise.index.key_of`) and every build option
            that changes the output.
        build: writes the index as ``.npy`` files into the directory it is given (a fresh, empty
            temporary directory); it must not keep references to the files.
        cache_dir: where entries live: ``None`` for :func:`default_cache_dir`, a path, or
            ``False`` to build in memory without a cache.
        timeout: seconds to wait for another process that is building the same entry.
        replaces: the keys (of the same ``kind``) that this entry supersedes: the one process
            that builds the entry into the cache then removes them (:func:`remove_entries`), e.g.
            the plans of earlier epochs. Never the entry ``(kind, key)`` itself. Nothing is removed
            when the entry is opened, or built in memory.

    Returns:
        ``{name: array}`` for every ``<name>.npy`` that ``build`` wrote: read-only
        ``numpy.memmap`` views of the cache entry (or read-only in-memory arrays without a cache).

    Raises:
        IndexCacheError: ``cache_dir`` is a file or cannot be created.
        IndexCacheTimeout: another process held the build lock for more than ``timeout`` seconds.
    """
    kind = _check_kind(kind)
    key = check_str("key", key, allow_empty=True)
    check_callable("build", build, arguments=("directory",), returns="None")
    if replaces is not None:
        check_callable("replaces", replaces, arguments=("key",), returns="bool")
    timeout = check_seconds("timeout", timeout)
    if cache_dir is False or not cache_enabled():
        why = "cache_dir=False" if cache_dir is False else f"{ENV_SWITCH}={os.environ.get(ENV_SWITCH)}"
        return _build_in_memory(kind, build, f"the index cache is disabled ({why})")
    if cache_dir is True:
        raise TypeError("cache_dir should be a path, None (the default directory) or False (no cache), but got True")
    explicit = cache_dir is not None
    root = Path(os.fspath(cache_dir)).expanduser() if cache_dir is not None else default_cache_dir()
    name = entry_name(kind, key)
    entry = root / name
    opened, _ = _open_entry(entry, kind, key)
    if opened is not None:
        return opened
    problem = _prepare_root(root, explicit)
    if problem is not None:
        return _build_in_memory(kind, build, problem)
    return _build_locked(root, name, kind, key, build, timeout, replaces)


def _prepare_root(root: Path, explicit: bool) -> str | None:
    """Create ``root``; a reason to fall back to memory if it is read-only, or raise if it is bad."""
    if root.exists() and not root.is_dir():
        raise IndexCacheError(
            f"cache_dir should be a directory, but {str(root)!r} is a file; pass another cache_dir "
            f"(or set {ENV_DIR}), or cache_dir=False to build the index in memory"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        if explicit or root != default_cache_dir():
            raise IndexCacheError(
                f"cache_dir={str(root)!r} cannot be created ({error.strerror or error}); pass a writable cache_dir "
                f"(or set {ENV_DIR}), or cache_dir=False to build the index in memory"
            ) from None
        return f"the default cache directory {root} cannot be created ({error.strerror or error})"
    if not os.access(root, os.W_OK | os.X_OK):
        return f"the cache directory {root} is read-only"
    return None


def _build_locked(
    root: Path,
    name: str,
    kind: str,
    key: str,
    build: Callable[[Path], None],
    timeout: float,
    replaces: Callable[[str], bool] | None = None,
) -> dict[str, np.ndarray]:
    from filelock import FileLock, Timeout  # comes with torch; imported here to keep `import shardwise` light

    entry = root / name
    lock = FileLock(str(root / f".{name}.lock"), timeout=timeout)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:  # another process builds it: say so once, then wait
            note("shardwise index cache: waiting for the %s index %s, built by %s (lock file %s; timeout=%g s)",
                 kind, entry, _builder_of(root, name), root / f".{name}.lock", timeout)  # fmt: skip
            lock.acquire(timeout=timeout)
    except Timeout:
        raise IndexCacheTimeout(
            f"waited timeout={timeout:g} s for another process building the index {name} in {root} "
            f"(lock file {root / f'.{name}.lock'}); raise timeout if that build is just slow, or pre-build the "
            "index (docs/scale.md); a crashed builder releases the lock by itself"
        ) from None
    except OSError as error:  # the lock file cannot be created: a read-only directory after all
        return _build_in_memory(kind, build, f"the lock file in {root} cannot be created ({error})")
    try:
        opened, problem = _open_entry(entry, kind, key)  # another process may have built it meanwhile
        if opened is not None:
            return opened
        if problem != "missing":
            logger.warning("shardwise index cache: rebuilding %s (%s)", entry, problem)
            _remove(entry, root)
        for stale in root.glob(f".{name}.*.partial"):  # left by a killed builder: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=root))
        owner = root / f".{name}.builder"
        try:
            owner.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
            started = time.monotonic()
            with Heartbeat(f"building the {kind} index {entry.name}"):
                build(tmp)
                write_manifest(tmp, kind, key)
            took = time.monotonic() - started
            if took >= 1.0:
                note("shardwise index cache: built the %s index %s in %.1f s", kind, entry, took)
            tmp.chmod(0o755)  # mkdtemp makes it private; an entry is read by every user of a shared cache
            fsync_path(tmp)
            os.rename(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            owner.unlink(missing_ok=True)
        fsync_path(root)
        if replaces is not None:
            remove_entries(root, kind, lambda other: other != key and replaces(other))
    finally:
        lock.release()
    opened, problem = _open_entry(entry, kind, key)
    if opened is None:
        raise IndexCacheError(f"the index {entry} was just built but does not open: {problem}")
    return opened


def _builder_of(root: Path, name: str) -> str:
    """``host/pid`` of the process building entry ``name`` (from its ``.builder`` file), if known."""
    try:
        owner = json.loads((root / f".{name}.builder").read_text())
        return f"{owner['host']}/pid {owner['pid']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (host/pid not yet known)"


def _remove(entry: Path, root: Path) -> bool:
    """Remove ``entry`` (atomically, if a directory); False if it was already gone."""
    if not entry.exists():
        return False
    if entry.is_dir():
        trash = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".old", dir=root))
        try:
            os.rename(entry, trash / "entry")  # atomic: readers see the old entry or none
        finally:
            shutil.rmtree(trash, ignore_errors=True)
    else:
        entry.unlink()
    return True


def remove_entries(root: str | os.PathLike[str], kind: str, stale: Callable[[str], bool]) -> int:
    """Remove the entries of ``kind`` in the cache directory ``root`` whose key satisfies ``stale``.

    The key is the one each entry's manifest records (what :func:`build_or_open` was given).
    Safe while other processes use the cache: a process that already mapped a removed entry's
    files keeps reading them (an unlinked file lives until its last mapping goes), and one that
    opens it afterwards finds it missing and rebuilds it. Entries that vanish meanwhile (another
    process removed them), unreadable manifests, entries being built (``.partial``) and files that
    cannot be removed (a read-only cache) are skipped, never an error: this is housekeeping.

    Returns:
        How many entries this call removed.
    """
    kind = _check_kind(kind)
    root = Path(check_path("root", root))
    check_callable("stale", stale, arguments=("key",), returns="bool")
    removed = 0
    try:
        candidates = sorted(root.glob(f"{kind}-*"))
    except OSError:
        return 0
    for entry in candidates:
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("kind") != kind:
                continue
            key = manifest.get("key")
            if not isinstance(key, str) or not stale(key) or not _remove(entry, root):
                continue
        except FileNotFoundError:
            continue  # removed or being replaced by another process
        except (OSError, ValueError) as error:
            logger.debug("shardwise index cache: not removing %s (%s)", entry, error)
            continue
        removed += 1
        logger.info("shardwise index cache: removed %s (key %r, replaced)", entry, key)
    return removed


def _build_in_memory(kind: str, build: Callable[[Path], None], reason: str) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory(prefix=f"shardwise-{kind}-") as tmp:
        build(Path(tmp))
        arrays = {}
        for path in sorted(Path(tmp).glob("*.npy")):
            array = np.load(path)
            array.flags.writeable = False
            arrays[path.stem] = array
    if (kind, reason) not in _warned:
        _warned.add((kind, reason))
        size = sum(a.nbytes for a in arrays.values())
        warnings.warn(
            f"shardwise: {reason}, so the {kind!r} index is built in this process's private memory: "
            f"{size / 2**20:.1f} MiB per process (every rank and DataLoader worker pays it and rebuilds it at "
            "every start); give a writable cache_dir or set SHARDWISE_CACHE_DIR to share one copy per node",
            RuntimeWarning,
            stacklevel=3,
        )
    return arrays


# -- opening ----------------------------------------------------------------------------------------
def _open_entry(entry: Path, kind: str, key: str) -> tuple[dict[str, np.ndarray] | None, str]:
    """The entry's arrays, or ``None`` and why not (``"missing"``, or what is wrong with it)."""
    try:
        return open_checked(entry, kind, key), ""
    except Invalid as why:
        return None, str(why)
    except FileNotFoundError as error:
        return None, f"a file is missing ({error.filename})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return None, f"unreadable ({type(error).__name__}: {error})"
