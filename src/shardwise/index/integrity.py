"""Integrity of shared index entries: a full checksum per file, verified once per node, values checked on read.

A flipped bit in an index file (a node's disk or page cache in a week-long run) must never make a
different plan. Three layers, cheapest first:

1. **At build**, the manifest records for every file its full CRC-32 (header and data, about
   3 GB/s) and the smallest and largest value it holds (:func:`~shardwise.index.checksums.describe_file`).
2. **At open**, a file of at most ``SYNC_BYTES`` is verified in full before it is returned (a few
   milliseconds); a larger one by its size, header and sampled blocks, and then in full **once
   per node**: by the builder (which checksummed what it wrote), or, before its first use, by the
   first process that opens the entry without a *node marker* (in a background thread with
   ``SHARDWISE_INDEX_VERIFY=background``) (``verified.<host>.json`` in the
   entry, written atomically, trusted only while the manifest and every file's size, inode and
   ``mtime_ns`` match, and, for "verified", within the same boot of the node). Processes of a
   node take turns through a file lock, so the second one adopts the first one's marker instead
   of reading the files again.
3. **On read**, every value a plan takes from an index (:func:`read_checked`) is checked against
   the range recorded at build (an order array's values lie in ``[0, n)``): a flipped high bit
   is caught at the batch that would have used it, before the background check ends.

A damage found by any layer marks the entry damaged for this node (the marker), so the next open
rebuilds it, and :func:`read_checked` raises :class:`IndexCorruptError` naming the file and the
fix, in every process that maps the entry: a damaged entry never yields a batch once found.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .._core import threads
from .checksums import full_crc

logger = logging.getLogger("shardwise")

SYNC_BYTES = 1 << 22
"""Files up to this size (4 MiB, about 1.5 ms of CRC-32) are verified in full whenever they are opened."""
_settings = {"sync_bytes": SYNC_BYTES}


def verify_before_use() -> bool:
    """Whether opening waits for the full check: yes unless ``SHARDWISE_INDEX_VERIFY=background`` (``ENV_VERIFY``)."""
    return os.environ.get(ENV_VERIFY, "").strip().lower() != "background"


def sync_bytes() -> int:
    """The size up to which a file is verified in full at every open (``SYNC_BYTES``; tests lower it)."""
    return _settings["sync_bytes"]
ENV_VERIFY = "SHARDWISE_INDEX_VERIFY"
"""``before-use`` (the default): a node's first open of an entry it did not build waits for the full
check, so a damaged entry is rebuilt before any batch (2.6 s once per node and boot at 1e9 samples,
nothing on the node that built it); ``background``: the full check runs in a background thread
while batches are range-checked (the first batch does not wait; an in-range flipped value read in
those seconds can reach a batch before the check stops the run)."""
MARKER_PREFIX = "verified."
VERIFIED, PENDING, DAMAGED = "verified", "pending", "damaged"


class IndexCorruptError(RuntimeError):
    """A shared index file holds other bytes than its builder wrote; the entry is marked for rebuilding."""


# -- per-node verification -------------------------------------------------------------------------
def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def boot_id() -> str:
    """This boot of the node (Linux), so that a reboot (a cold page cache read from disk again) verifies again."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def marker_path(entry: Path) -> Path:
    """This node's verification marker of an entry: ``<entry>/verified.<host>.json``."""
    return entry / f"{MARKER_PREFIX}{_host()}.json"


def file_identity(entry: Path, names: list[str]) -> dict[str, list[int]]:
    """``{name: [size, inode, mtime_ns]}``: what a marker is valid for."""
    identity = {}
    for name in names:
        status = (entry / name).stat()
        identity[name] = [status.st_size, status.st_ino, status.st_mtime_ns]
    return identity


def write_marker(entry: Path, manifest_crc: int, identity: dict[str, list[int]], status: str, reason: str = "") -> bool:
    """Write this node's marker atomically; False if the entry is not writable (then each process verifies)."""
    record = {"status": status, "manifest_crc32": manifest_crc, "files": identity, "reason": reason,
              "boot": boot_id(), "host": socket.gethostname(), "pid": os.getpid()}  # fmt: skip
    try:
        fd, tmp = tempfile.mkstemp(prefix=".marker.", dir=entry)
        with os.fdopen(fd, "w") as file:
            json.dump(record, file)
        os.chmod(tmp, 0o644)
        os.replace(tmp, marker_path(entry))
    except OSError as error:
        logger.debug("shardwise index cache: cannot write the verification marker of %s (%s)", entry, error)
        return False
    return True


def read_marker(entry: Path, manifest_crc: int, identity: dict[str, list[int]]) -> tuple[str, str] | None:
    """``(status, reason)`` of this node's marker if it is valid for this manifest and these files, else ``None``."""
    try:
        record = json.loads(marker_path(entry).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("manifest_crc32") != manifest_crc or record.get("files") != identity:
        return None
    if record.get("status") == VERIFIED and record.get("boot") != boot_id():
        return None  # verified before a reboot: read from disk again, so verify again
    status = record.get("status")
    return (status, str(record.get("reason", ""))) if status in (VERIFIED, DAMAGED) else None


class EntryCheck:
    """The verification state of one opened entry in this process (shared by its files' records)."""

    def __init__(self, entry: Path, manifest: dict[str, Any], manifest_crc: int, identity: dict[str, list[int]]):
        self.entry = entry
        self.manifest = manifest
        self.manifest_crc = manifest_crc
        self.identity = identity
        self.large = [name for name, (size, _, _) in identity.items() if size > sync_bytes()]
        self.status = VERIFIED if not self.large else PENDING
        self.reason = ""
        self._pid = -1  # the process whose thread verifies (a forked child starts its own)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        threads.reset_in_child(self, type(self)._forked)

    def _forked(self) -> None:
        # A thread in ensure_verifying may hold _lock (waiting to start the check) while the process forks.
        self._lock = threading.Lock()

    def adopt_marker(self) -> None:
        found = read_marker(self.entry, self.manifest_crc, self.identity)
        if found is not None:
            self.status, self.reason = found

    def damaged(self, reason: str) -> None:
        """Record a damage: this process raises from now on, and the node's next open rebuilds the entry."""
        self.status, self.reason = DAMAGED, reason
        write_marker(self.entry, self.manifest_crc, self.identity, DAMAGED, reason)
        logger.error("shardwise index cache: %s is damaged (%s); it is rebuilt when next opened", self.entry, reason)

    def error(self) -> IndexCorruptError:
        return IndexCorruptError(
            f"the shared index entry {self.entry} is damaged ({self.reason}): a bit of the node's disk or page cache "
            "changed after it was built. It is marked for rebuilding: restart the job (the next start rebuilds it "
            f"once), or remove {self.entry}; if this repeats, check the node's disk and memory"
        )

    def ensure_verifying(self) -> None:
        """Start the background full check in this process unless done, or already running here."""
        if self.status != PENDING or self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            name = f"shardwise-verify-{self.entry.name}"
            self._thread = threads.start(self._verify, name=name)

    def _verify(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # Linux: a thread has its own nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # this process's batches first
        try:
            from filelock import FileLock  # comes with torch

            lock: Any = FileLock(str(self.entry.parent / f".{self.entry.name}.verify.lock"))
            try:
                lock.acquire(timeout=3600)
            except Exception:  # a read-only cache directory, or a stuck process: verify without it
                lock = None
            try:
                self.adopt_marker()  # another process of the node may have verified meanwhile
                if self.status == PENDING:
                    self._verify_files()
            finally:
                if lock is not None:
                    lock.release()
        except Exception as error:  # never kill the process from here: the range checks still hold
            logger.warning("shardwise index cache: could not verify %s in full (%s)", self.entry, error)

    def _verify_files(self) -> None:
        for name in self.large:
            crc = full_crc(self.entry / name, stop=lambda: self.status != PENDING)
            if crc is None:
                return
            if crc != self.manifest["files"][name]["crc32"]:
                self.damaged(f"{name} fails its full CRC-32")
                return
        self.status = VERIFIED
        write_marker(self.entry, self.manifest_crc, self.identity, VERIFIED)
        logger.debug("shardwise index cache: verified %s in full", self.entry)

    def wait(self, timeout: float | None = None) -> str:
        """Block until the background check ends (for tests and benchmarks); the status."""
        self.ensure_verifying()
        if self._thread is not None:
            self._thread.join(timeout)
        return self.status


# -- on read ---------------------------------------------------------------------------------------
class _FileRecord:
    __slots__ = ("check", "high", "low", "name", "nan")

    def __init__(self, check: EntryCheck, name: str, info: dict[str, Any]) -> None:
        self.check, self.name = check, name
        self.low, self.high, self.nan = info.get("min"), info.get("max"), bool(info.get("nan", False))


_records: dict[str, _FileRecord | None] = {}
_checks: dict[tuple[str, int], EntryCheck] = {}
_registry_lock = threading.Lock()


def entry_check(entry: Path, manifest: dict[str, Any], text: str) -> EntryCheck:
    """This process's :class:`EntryCheck` of an entry: the one already made for the same manifest and
    files (so a second open neither verifies again nor forgets a damage), else a new one."""
    crc = manifest_crc(text)
    identity = file_identity(entry, sorted(manifest["files"]))
    key = (os.path.abspath(entry), crc)
    with _registry_lock:
        known = _checks.get(key)
        if known is not None and known.identity == identity:
            return known
        check = _checks[key] = EntryCheck(entry, manifest, crc, identity)
    check.adopt_marker()
    return check


def forget() -> None:
    """Forget every entry this process opened, as a new process would (for tests and benchmarks)."""
    with _registry_lock:
        _records.clear()
        _checks.clear()


def register(check: EntryCheck) -> None:
    """Make :func:`read_checked` know the files of an opened entry (replacing an earlier open's)."""
    with _registry_lock:
        for name, info in check.manifest["files"].items():
            _records[os.path.abspath(check.entry / name)] = _FileRecord(check, name, info)


def manifest_crc(text: str) -> int:
    """The CRC-32 of a manifest's text: what a node marker is tied to."""
    return zlib.crc32(text.encode())


def check_of(entry: Path) -> EntryCheck | None:
    """The :class:`EntryCheck` of an entry directory mapped without an open (``None`` if it is not one)."""
    try:
        text = (entry / "manifest.json").read_text()
        manifest = json.loads(text)
        if not isinstance(manifest, dict) or manifest.get("format") != "shardwise.index":
            return None
        return entry_check(entry, manifest, text)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_of(source: Any) -> _FileRecord | None:
    base = source
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    name = getattr(base, "filename", None)
    if name is None:
        return None  # in memory: nothing a disk can flip
    filename = os.path.abspath(name)  # a str or a Path, as the array was mapped
    if filename not in _records:  # mapped in this process without an open (a pickled sampler's arrays)
        check = check_of(Path(filename).parent)
        if check is not None:
            register(check)
        _records.setdefault(filename, None)
    return _records[filename]


def read_checked(source: Any, values: Any) -> Any:
    """``values`` just read from the index array ``source``, after checking they can be there.

    Raises :class:`IndexCorruptError` if the entry was found damaged (by any process of the node)
    or if a value lies outside the range its builder recorded (then the entry is marked damaged).
    Cost: a dictionary look-up and a min/max over ``values``: microseconds per batch.
    """
    record = _record_of(source)
    if record is None:
        return values
    check = record.check
    if check.status == PENDING:
        check.ensure_verifying()
    if check.status == DAMAGED:
        raise check.error()
    array = np.asarray(values)
    if array.size and record.low is not None:
        low, high = (np.nanmin(array), np.nanmax(array)) if record.nan else (array.min(), array.max())
        if not (low >= record.low and high <= record.high):  # a NaN fails both
            bad = low if not low >= record.low else high
            check.damaged(f"{record.name} holds {bad!r}, outside the range [{record.low}, {record.high}] of its values")
            raise check.error()
    return values
