"""The plan's first rows before their whole shards: a Parquet shard's footer and the row groups they lie in.

NOTE [ Head first ]
The stream plan reads ``window`` shards at once, so the first batch of an epoch holds rows of about
``window`` shards: fetched whole, it waits for a window's bytes. Instead, when a process starts to
follow a pass (``ShardCache.follow(head=...)``), it promises the rows of its first ``HEAD_ROWS``
positions, shard by shard, and its prefetch threads fetch first, for each of those shards, only
the footer and the row groups holding those rows (ranged GETs), then the rest:

1. ``promise``: a ledger next to the shard's final name (``<final>.partledger``, append-only
   lines) records ``P <rows>`` before the threads start; a reader that needs promised rows waits
   for them instead of fetching the whole shard itself.
2. ``fetch_pieces``: the footer (the file's tail) and the row groups of the promised rows are
   written at their offsets into a sparse file (``<final>.partsparse``, the shard's size), the
   shard is checked against its indexed identity (one ``HEAD``, as a download is), and the
   ranges are recorded (``R start end``), then ``D``. A failure records ``D`` without ranges: the
   reader falls back to the whole shard, and its errors.
3. The whole-shard download (``download.download``) fetches only the ranges the ledger does not
   hold, into the same sparse file, checks it, and renames it into place: every byte is
   fetched once a node (ranks racing on the same row group excepted).
4. A reader (``ShardedSource``) whose rows of a shard lie in recorded ranges reads those row
   groups from the sparse file (``early.py``); other rows wait for the whole shard as before.

So the first batch needs the footers and a few row groups of each of its shards, not whole
shards: ``tests/data/test_sharded_head.py`` holds every whole-shard GET until the first batch is
delivered. Only remote Parquet shards; the plan (the order of samples) is unchanged.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from .budget import alive
from .fetch import PART, check_unchanged
from .formats import pyarrow

HEAD_ROWS = 32
"""Positions of a pass whose rows are fetched first (a first batch of up to 32 samples)."""
SMALL = 1 << 18
"""Bytes up to which a shard is fetched whole at once, never in pieces (its footer's read would be most of it)."""
HOLE = 1 << 12
"""Bytes of a hole beside a piece, no process holding them, up to which they come in the piece's ``GET`` (a Parquet
file's 4-byte magic before its first row group): fetched once, recorded, never a request of their own."""
SPARSE = PART + "sparse"
LEDGER = PART + "ledger"
_TAIL = 1 << 16  # bytes of a shard's tail read for its footer (more when the footer is longer)

Range = tuple[int, int]  # [start, end) in bytes


def sparse_path(final: Path) -> Path:
    """Where the pieces of the shard cached as ``final`` are written, at their offsets."""
    return final.with_name(final.name + SPARSE)


def ledger_path(final: Path) -> Path:
    """The ledger of the pieces of ``final`` (promised rows, fetched ranges, done marks)."""
    return final.with_name(final.name + LEDGER)


def _append(path: Path, line: str) -> None:
    """One line appended at once (``O_APPEND``: lines of several processes never interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def promise(final: Path, rows: Iterable[int]) -> None:
    """Record that this process's prefetch will fetch the row groups of ``rows`` (local row numbers) first."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _append(ledger_path(final), f"P {os.getpid()} " + ",".join(str(r) for r in rows) + "\n")


def settle(final: Path) -> None:
    """Record that this process's promise on ``final`` is kept, pieces fetched or not (its readers stop waiting)."""
    with contextlib.suppress(OSError):
        _append(ledger_path(final), f"D {os.getpid()}\n")


class Ledger:
    """What a shard's ledger says: the rows promised, the ranges fetched and checked, whether every promise is kept."""

    def __init__(self, text: str) -> None:
        self.promised: set[int] = set()
        self.ranges: list[Range] = []
        self.whole = False  # the rest's download has started: no more pieces
        promises: dict[int, int] = {}  # pid -> promises made, less those kept
        for line in text.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "P":
                pid, _, rows = rest.partition(" ")
                promises[int(pid)] = promises.get(int(pid), 0) + 1
                self.promised.update(int(r) for r in rows.split(",") if r)
            elif kind == "R":
                start, end = rest.split()
                self.ranges.append((int(start), int(end)))
            elif kind == "D":
                promises[int(rest)] = promises.get(int(rest), 0) - 1
            elif kind == "W":
                self.whole = True
        # Kept, or made by a process that is gone (killed before keeping it): nothing more will come.
        self.settled = all(left <= 0 or not alive(pid) for pid, left in promises.items())

    @classmethod
    def read(cls, final: Path) -> Ledger | None:
        """The ledger of ``final``, or ``None`` if it has none."""
        try:
            return cls(ledger_path(final).read_text())
        except FileNotFoundError:
            return None

    def covers(self, start: int, end: int) -> bool:
        """Whether ``[start, end)`` lies in the recorded ranges."""
        at = start
        for first, last in sorted(self.ranges):
            if first <= at < last:
                at = last
            if at >= end:
                return True
        return at >= end


def gaps(ranges: Sequence[Range], size: int) -> list[Range]:
    """The parts of ``[0, size)`` outside ``ranges``, in order."""
    found, at = [], 0
    for start, end in sorted(ranges):
        if start > at:
            found.append((at, start))
        at = max(at, end)
    if at < size:
        found.append((at, size))
    return found


def parse_footer(tail: bytes) -> Any:
    """The Parquet ``FileMetaData`` of a file whose last bytes are ``tail`` (the footer whole)."""
    pa = pyarrow()
    return pa.parquet.read_metadata(pa.BufferReader(tail))


def footer_length(tail: bytes) -> int:
    """Bytes of the footer (metadata, its length, the magic) at the end of a Parquet file's ``tail``."""
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise ValueError("not a Parquet file (no PAR1 magic at its end)")
    return int.from_bytes(tail[-8:-4], "little") + 8


def row_group_range(metadata: Any, group: int) -> Range:
    """The bytes of row group ``group``: from its first column chunk's first page to its last chunk's end."""
    chunk = metadata.row_group(group)
    starts, ends = [], []
    for c in range(chunk.num_columns):
        column = chunk.column(c)
        first = column.dictionary_page_offset if column.has_dictionary_page else None
        first = column.data_page_offset if first is None else min(first, column.data_page_offset)
        starts.append(first)
        ends.append(first + column.total_compressed_size)
    return (min(starts), max(ends)) if starts else (0, 0)


def groups_of(metadata: Any, rows: Iterable[int]) -> list[int]:
    """The row groups (sorted, once each) holding local ``rows``."""
    bounds, at = [], 0
    for group in range(metadata.num_row_groups):
        at += metadata.row_group(group).num_rows
        bounds.append(at)
    return sorted({bisect.bisect_right(bounds, row) for row in rows if 0 <= row < at})


def _merged(ranges: Iterable[Range]) -> list[Range]:
    """``ranges`` sorted, touching or overlapping ones merged (one GET each)."""
    merged: list[Range] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def pieces_lock(final: Path, timeout: float) -> FileLock:
    """The lock of ``final``'s ledger and sparse file: pieces are written, or the rest's download starts, under it."""
    return FileLock(str(final.with_name(final.name + PART + "pieces.lock")), timeout=timeout)


def fetch_pieces(fs: Any, url: str, size: int, version: str | None, rows: Sequence[int], final: Path,
                 timeout: float, derived: Path | None = None) -> int:
    """Fetch the footer and the row groups of ``rows`` of shard ``url``, and of every row a process of the node
    promised in the ledger, into ``final``'s sparse file (NOTE).

    Records each range in the ledger once the shard is checked against ``version``, then ``D``,
    always (a failure leaves the reader to fetch the whole shard and raise). Nothing is fetched
    once the rest's download has started (``W``: its readers wait for the whole shard), once the
    shard, or ``derived`` (the file made from it), is in place, or when another process fetched
    every piece asked for (no request then, not even the check). Returns the bytes fetched.
    """
    fetched = 0
    try:
        with pieces_lock(final, timeout):
            ledger = Ledger.read(final) or Ledger("")
            if (ledger.whole or final.exists() or (derived is not None and derived.exists())
                    or (ledger.ranges and not sparse_path(final).exists())):
                return 0  # whole, or on its way; (ranges of a sparse file gone: leave it to the whole download)
            # The rows every process of the node promised so far, not only this one's: the node's ranks
            # start a pass together, and a rank whose pieces came after another's whole download started
            # would wait for the whole shard (or fetch its pieces twice).
            fetched = _fetch_pieces(fs, url, size, version, sorted(ledger.promised.union(rows)), final, ledger)
    finally:
        settle(final)
    return fetched


def _footer(fs: Any, url: str, size: int, final: Path, ledger: Ledger) -> tuple[int, bytes, bool]:
    """``(start, bytes, held)`` of shard ``url``'s tail holding its footer: from the sparse file if another
    process fetched it (``held``), else fetched (one ranged GET, two when the footer is longer than ``_TAIL``)."""
    held = [start for start, end in ledger.ranges if end == size]
    if held:
        with contextlib.suppress(FileNotFoundError), open(sparse_path(final), "rb") as sparse:
            sparse.seek(min(held))
            tail = sparse.read(size - min(held))
            if footer_length(tail) <= len(tail):
                return min(held), tail, True
    start = max(0, size - _TAIL)
    tail = bytes(fs.cat_file(url, start=start, end=size))
    need = footer_length(tail)
    if need > len(tail) and need <= size:
        start = size - need
        tail = bytes(fs.cat_file(url, start=start, end=size))
    return start, tail, False


def _holes(wanted: Sequence[Range], have: Sequence[Range], size: int) -> list[Range]:
    """The holes of at most :data:`HOLE` bytes beside a range of ``wanted`` that neither it nor ``have`` covers."""
    starts, ends = {start for start, _ in wanted}, {end for _, end in wanted}
    return [(start, end) for start, end in gaps([*have, *wanted], size)
            if end - start <= HOLE and (end in starts or start in ends)]


def _fetch_pieces(fs: Any, url: str, size: int, version: str | None, rows: Sequence[int], final: Path,
                  ledger: Ledger) -> int:
    tail_start, tail, held = _footer(fs, url, size, final, ledger)
    fetched = 0 if held else len(tail)
    metadata = parse_footer(tail)
    pieces: list[tuple[Range, bytes]] = [] if held else [((tail_start, size), tail)]
    have = [*ledger.ranges, (tail_start, size)]
    wanted: list[Range] = []
    for first, last in _merged(row_group_range(metadata, g) for g in groups_of(metadata, rows)):
        for gap_start, gap_end in gaps(have, last):  # only what no process fetched yet
            if max(gap_start, first) < min(gap_end, last):
                wanted.append((max(gap_start, first), min(gap_end, last)))
    if held and not wanted:
        return 0  # every piece asked for is in, fetched and checked by another process
    wanted = _merged([*wanted, *_holes(wanted, have, size)])
    # All at once: an async filesystem (s3fs, http) sends them together, one round trip in all.
    found = fs.cat_ranges([url] * len(wanted), [a for a, _ in wanted], [b for _, b in wanted]) if wanted else []
    for (start, end), data in zip(wanted, found, strict=True):
        if isinstance(data, BaseException):  # fsspec returns a range's error in its place
            raise data
        pieces.append(((start, end), _whole_range(url, start, end, data)))
        fetched += end - start
    fd = os.open(sparse_path(final), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        for (start, _), data in pieces:
            os.pwrite(fd, data, start)
    finally:
        os.close(fd)
    check_unchanged(fs, url, version, None)  # after the GETs: a rewritten shard is never recorded
    for (start, end), _ in pieces:
        _append(ledger_path(final), f"R {start} {end}\n")
    return fetched


def _pieces_held(final: Path, size: int, timeout: float) -> list[Range] | None:
    """The ranges of ``final``'s pieces in its sparse file, from now on the only ones (the rest's fetch starts:
    ``W``, under the pieces' lock); ``None``: no piece recorded, or their sparse file is gone or of another size."""
    if not ledger_path(final).exists():  # no piece (and no lock file made for nothing)
        return None
    with pieces_lock(final, timeout):
        ledger = Ledger.read(final)
        if ledger is None or not ledger.ranges:
            return None
        _append(ledger_path(final), "W\n")  # from now on, no process fetches pieces: they would be fetched twice
    try:
        held = os.path.getsize(sparse_path(final)) == size
    except FileNotFoundError:
        return None
    return ledger.ranges if held else None


def _range(fs: Any, url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of shard ``url`` (one ranged GET); a short answer is an ``OSError`` (retried)."""
    return _whole_range(url, start, end, fs.cat_file(url, start=start, end=end))


def _whole_range(url: str, start: int, end: int, data: bytes) -> bytes:
    """``data``, the answer for bytes ``[start, end)`` of shard ``url``; a short one is an ``OSError`` (retried)."""
    if len(data) != end - start:
        raise OSError(f"shard {url}: asked for bytes {start}-{end}, got {len(data)}")
    return bytes(data)


def fetch_rest(fs: Any, url: str, final: Path, size: int, timeout: float) -> tuple[Path, int] | None:
    """Fetch the ranges of shard ``url`` that ``final``'s pieces lack, into their sparse file (under its lock).

    Returns ``(sparse file, bytes fetched)``, or ``None`` when no piece is recorded (fetch it whole).
    """
    held = _pieces_held(final, size, timeout)
    if held is None:
        return None
    fetched = 0
    fd = os.open(sparse_path(final), os.O_RDWR)
    try:
        for start, end in gaps(held, size):
            fetched += os.pwrite(fd, _range(fs, url, start, end), start)
    finally:
        os.close(fd)
    return sparse_path(final), fetched


def fetch_whole(fs: Any, url: str, final: Path, size: int, timeout: float) -> tuple[bytes | bytearray, int]:
    """Shard ``url`` in memory: ``final``'s pieces read from their sparse file, the rest fetched (one ranged GET a
    gap; the whole shard in one when it has no piece). Returns ``(its bytes, bytes fetched)``."""
    held = _pieces_held(final, size, timeout)
    if held is None:
        data = fs.cat_file(url, start=0, end=size)  # ranged: s3fs HEADs a shard first when asked for it whole
        return data, len(data)
    buffer = bytearray(size)
    view = memoryview(buffer)
    with open(sparse_path(final), "rb", buffering=0) as sparse:
        for start, end in _merged(held):
            sparse.seek(start)
            if sparse.readinto(view[start:end]) != end - start:
                raise OSError(f"the pieces of shard {url} in {sparse_path(final)} are short")
    fetched = 0
    for start, end in gaps(held, size):
        view[start:end] = _range(fs, url, start, end)
        fetched += end - start
    return buffer, fetched
