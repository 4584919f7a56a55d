"""The on-disk format of a ragged store: file names, version, ``.npy`` headers, checksums, dtype checks."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..._core.arrays import check_numeric_dtype

FORMAT = "shardwise.ragged"
VERSION = 1
MANIFEST = "manifest.json"
VALUES = "values.npy"
OFFSETS = "offsets.npy"

CRC_CHUNK = 1 << 24  # bytes read at a time by verify(), and offsets checked at a time at open
OFFSET_BUFFER = 1 << 16  # offsets a writer holds before flushing them to disk
NPY_ALIGN = 64
MAX_ROWS_DIGITS = 9223372036854775807  # widest int64: reserves room in the header for any row count


class RaggedStoreError(ValueError):
    """A directory is not a readable ragged store: missing or truncated files, corruption, another format."""


check_dtype = check_numeric_dtype
"""A numeric numpy dtype in native byte order (what ``torch.from_numpy`` accepts), or raise."""


def check_feature_shape(value: object) -> tuple[int, ...]:
    ok = isinstance(value, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in value
    )
    if not ok:
        raise TypeError(
            f"feature_shape should be a tuple of non-negative integers (the shape of one row), "
            f"but got feature_shape={value!r}"
        )
    return tuple(int(d) for d in value)  # type: ignore[attr-defined]


def npy_header(dtype: np.dtype[Any], shape: tuple[int, ...], size: int) -> bytes:
    """A version 1.0 ``.npy`` header of exactly ``size`` bytes (padded with spaces, as numpy pads)."""
    text = f"{{'descr': {np.lib.format.dtype_to_descr(dtype)!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    body = text.encode("latin1")
    padding = size - 10 - len(body) - 1
    if padding < 0:
        raise RuntimeError(f"npy header of {len(body)} bytes does not fit the {size} bytes reserved for it")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", size - 10) + body + b" " * padding + b"\n"


def header_size(dtype: np.dtype[Any], feature_shape: tuple[int, ...]) -> int:
    """Bytes to reserve for a header whose leading dimension is not known yet (a multiple of 64, as numpy aligns)."""
    text = npy_header(dtype, (MAX_ROWS_DIGITS, *feature_shape), 1 << 16).rstrip(b" \n")
    needed = len(text) + 1
    return -(-needed // NPY_ALIGN) * NPY_ALIGN


def is_replaceable(path: Path) -> bool:
    """Whether ``overwrite=True`` may delete ``path``: an empty directory or a ragged store."""
    if not path.is_dir():
        return False
    if not any(path.iterdir()):
        return True
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def check_target(path: Path, overwrite: bool) -> None:
    if not path.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace the store there")
    if not is_replaceable(path):
        raise FileExistsError(
            f"{path} exists and is not a ragged store or an empty directory; overwrite=True only replaces those"
        )

