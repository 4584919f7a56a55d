"""A writer's claim on its hidden temporary directory, and the removal of those whose writer is gone.

A :class:`RaggedWriter` writes into ``.<name>.<token>.partial`` beside its target. A process
killed mid-write (``SIGKILL``, out of memory, a node reboot) cannot delete it, and it can be
nearly as large as the store. So every writer holds an exclusive ``flock`` on a sibling file
``.<name>.<token>.partial.lock`` for as long as it lives; the kernel drops that lock when the
process dies, however it dies. A new writer for the same target first removes every partial
directory whose lock it can take (its writer is gone) and leaves alone those whose lock is held
(a live writer, in this or another process, on this or, over a shared filesystem with ``flock``
support, another machine).

Races, all safe:

- The lock file is created and locked before the directory exists, and a writer checks that the
  file it locked is still the one on disk (a cleaner may have removed an orphan lock file between
  its creation and the lock), so a directory with a live writer always has a held lock.
- Two cleaners: the non-blocking lock lets one in; the other skips. A cleaner removes the
  directory before the lock file, so a directory without a lock file is litter (or a leftover of
  an older shardwise, which wrote none) and is removed.
- ``.<name>.<token>.old`` holds the previous store during an ``overwrite=True`` replace; a dead
  writer's is removed only when the target exists again (otherwise it holds the only copy of the
  previous store, and is left for the user).

Platforms without ``fcntl`` (Windows) get no locks and no cleanup: partial directories stay, as
before, and are safe to delete by hand when no writer runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

PARTIAL = ".partial"
OLD = ".old"
LOCK = ".partial.lock"

if sys.platform == "win32":  # pragma: no cover
    LOCKS = False

    def _try_lock(fd: int) -> bool:
        return True

else:
    import fcntl

    LOCKS = True

    def _try_lock(fd: int) -> bool:
        """Take the exclusive lock on ``fd`` if no other open file holds it; never wait."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


class Claim:
    """The lock a live writer holds on its temporary directory; :meth:`release` when done."""

    __slots__ = ("directory", "fd", "lock", "old")

    def __init__(self, parent: Path, name: str) -> None:
        while True:
            fd, lock = tempfile.mkstemp(prefix=f".{name}.", suffix=LOCK, dir=parent)
            if not _try_lock(fd):  # pragma: no cover  (a cleaner holds it for an instant: take a new one)
                os.close(fd)
                continue
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False  # a cleaner took it for an orphan and removed it before we locked it
            if same:
                break
            os.close(fd)
        self.fd: int | None = fd
        self.lock = Path(lock)
        stem = lock[: -len(LOCK)]
        self.directory = Path(stem + PARTIAL)
        self.old = Path(stem + OLD)
        os.mkdir(self.directory)

    def release(self) -> None:
        """Give the claim up (its directory was published or removed); idempotent."""
        if self.fd is None:
            return
        try:
            self.lock.unlink(missing_ok=True)
        finally:
            os.close(self.fd)
            self.fd = None

    def discard(self) -> None:
        """Remove the temporary directory, then release the claim."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.release()


def remove_stale(parent: Path, name: str) -> list[Path]:
    """Remove the partial directories (and lock files, and finished replaces' ``.old`` copies) of dead writers.

    Args:
        parent: the directory holding the target.
        name: the target's name.

    Returns:
        What was removed.
    """
    if not LOCKS:  # pragma: no cover
        return []
    prefix = f".{name}."
    stems: set[str] = set()
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    for entry in entries:
        if not entry.startswith(prefix):
            continue
        for suffix in (LOCK, PARTIAL, OLD):
            if entry.endswith(suffix) and len(entry) > len(prefix) + len(suffix):
                stems.add(entry[: -len(suffix)])
    removed: list[Path] = []
    for stem in sorted(stems):
        removed.extend(_remove_if_dead(parent / stem, parent / name))
    return removed


def _remove_if_dead(stem: Path, target: Path) -> list[Path]:
    lock, directory, old = Path(f"{stem}{LOCK}"), Path(f"{stem}{PARTIAL}"), Path(f"{stem}{OLD}")
    try:
        fd = os.open(lock, os.O_RDWR)  # never O_CREAT: a lock file that is gone stays gone
    except FileNotFoundError:
        fd = None  # no writer of this shardwise owns it: litter of a dead cleaner or of an older release
    except OSError:
        return []
    try:
        if fd is not None and not _try_lock(fd):
            return []  # a live writer
        removed = []
        if directory.is_dir():
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        if old.is_dir() and target.exists():
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
        if fd is not None and not old.exists():
            lock.unlink(missing_ok=True)
            removed.append(lock)
        return removed
    finally:
        if fd is not None:
            os.close(fd)
