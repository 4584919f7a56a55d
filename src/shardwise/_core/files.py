"""Durable files: fsync a file or directory, and a CRC-32 of sampled blocks (O(1) in the file's size).

The ragged store (``data/ragged``) and the index cache (``index/cache.py``) both write files that
other processes map, rename them into place atomically, and check them cheaply on open with
:func:`sampled_crc`. Both formats record that checksum, so ``SAMPLE_BLOCKS`` and ``BLOCK_BYTES``
are part of them: changing either makes every existing store and cache entry fail its check.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_BLOCKS = 16
"""Blocks read by :func:`sampled_crc`, spread evenly from the first to the last byte."""
BLOCK_BYTES = 4096
"""Bytes of each sampled block (a page)."""


def advise_pages(raw: Any, address: int, size: int, advice: int | None) -> None:
    """``madvise`` the pages of the mapping ``raw`` (an ``mmap.mmap``) that hold ``size`` bytes from ``address``.

    ``address`` is a memory address inside the mapping (``array.ctypes.data`` of a view of it).
    Nothing when ``advice`` is ``None``, the range is not inside the mapping, or the system refuses
    the advice: advice changes when pages arrive, never what they hold.
    """
    if advice is None or size <= 0 or not isinstance(raw, mmap.mmap) or not hasattr(raw, "madvise"):
        return
    try:
        base = np.frombuffer(raw, dtype=np.uint8).ctypes.data
    except (TypeError, ValueError, BufferError):
        return
    begin = address - base
    if begin < 0 or begin + size > len(raw):
        return
    aligned = begin - begin % mmap.PAGESIZE
    with contextlib.suppress(OSError, ValueError):
        raw.madvise(advice, aligned, begin + size - aligned)


def sampled_crc(path: Path, start: int, end: int) -> int:
    """CRC-32 of ``SAMPLE_BLOCKS`` blocks of ``BLOCK_BYTES`` spread evenly over bytes ``[start, end)``, all if small."""
    span = end - start
    crc = 0
    with open(path, "rb") as file:
        if span <= SAMPLE_BLOCKS * BLOCK_BYTES:
            file.seek(start)
            return zlib.crc32(file.read(span))
        last = span - BLOCK_BYTES
        for k in range(SAMPLE_BLOCKS):
            file.seek(start + last * k // (SAMPLE_BLOCKS - 1))
            crc = zlib.crc32(file.read(BLOCK_BYTES), crc)
    return crc


def fsync_path(path: Path) -> None:
    """``fsync`` a file or a directory (a directory: so that a rename into it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    A reader of either path sees the old entry or the new one, never neither: what replacing a
    non-empty directory with two renames cannot give. False where the platform or file system
    cannot exchange (not Linux, a glibc before 2.28, ``EINVAL``/``ENOSYS``), or when either path
    is gone (``ENOENT``); the caller falls back to its renames.
    """
    import ctypes
    import ctypes.util
    import errno
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOENT, errno.EXDEV, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


class NpyWriter:
    """A 1-D ``.npy`` file written front to back, its length set at the end (numpy's header has room for it).

    Usable as a context manager (closed, its length written, on leaving the block).
    """

    def __init__(self, path: Path, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        self.file = open(path, "wb")  # noqa: SIM115  (closed by close())
        self.size = 0
        self.header = self._header()

    def _header(self) -> int:
        self.file.seek(0)
        np.lib.format.write_array_header_1_0(self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                         "fortran_order": False, "shape": (self.size,)})  # fmt: skip
        return self.file.tell()

    def write(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).data)
        self.size += values.size

    def close(self) -> None:
        end = self.file.tell()
        if self._header() != self.header:  # pragma: no cover - numpy keeps 21 digits of room for the length
            raise RuntimeError(f"the .npy header of {self.file.name} changed size")
        self.file.seek(end)
        self.file.close()

    def __enter__(self) -> NpyWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
