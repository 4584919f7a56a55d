"""What opening a store checks: the manifest's fields, the ``.npy`` headers and sizes, the offsets."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .format import (
    CRC_CHUNK,
    FORMAT,
    MANIFEST,
    OFFSETS,
    VALUES,
    VERSION,
    RaggedStoreError,
    check_dtype,
    check_feature_shape,
)


def field(manifest: dict[str, Any], key: str, kind: type, where: Path) -> Any:
    value = manifest.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RaggedStoreError(f"{where} field {key!r} should be a {kind.__name__}, but got {key}={value!r}")
    return value


def count(manifest: dict[str, Any], key: str, where: Path) -> int:
    value: int = field(manifest, key, int, where)
    if value < 0:
        raise RaggedStoreError(f"{where} field {key!r} should be non-negative, but got {key}={value!r}")
    return value


def read_header(path: Path, name: str, info: dict[str, Any]) -> tuple[int, tuple[int, ...], np.dtype[Any]]:
    """Parse a ``.npy`` header; return (header bytes, shape, dtype), checking its size against the manifest."""
    file_path = path / name
    if not file_path.is_file():
        raise RaggedStoreError(f"{name} is missing from the ragged store at {path}")
    size = file_path.stat().st_size
    try:
        with open(file_path, "rb") as file:
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
            header = file.tell()
    except (ValueError, OSError, SyntaxError) as error:
        raise RaggedStoreError(f"{file_path} is not a readable .npy file ({error})") from None
    if fortran:
        raise RaggedStoreError(f"{file_path} is in Fortran order; a ragged store's arrays are C-ordered")
    if header != info["header_bytes"]:
        raise RaggedStoreError(
            f"{file_path} has a {header}-byte header, but the manifest says {info['header_bytes']}: "
            "the file was replaced or corrupted"
        )
    if size != info["bytes"]:
        problem = "truncated" if size < info["bytes"] else "longer than written"
        raise RaggedStoreError(
            f"{file_path} is {size} bytes, but the manifest says {info['bytes']}: the file is {problem}"
        )
    return header, tuple(shape), dtype


def file_info(files: Any, name: str, where: Path) -> dict[str, Any]:
    info = files.get(name) if isinstance(files, dict) else None
    if not isinstance(info, dict):
        raise RaggedStoreError(f"{where} has no entry for {name!r} under 'files'")
    for key in ("bytes", "header_bytes", "crc32"):
        count(info, key, where)
    return info


def mmap(path: Path, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int) -> np.ndarray[Any, Any]:
    """A read-only memory map of the array in ``path``, as a plain ndarray (views of it stay plain)."""
    return np.asarray(np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape))


def check_offsets(offsets: np.ndarray[Any, Any], total_rows: int, where: Path) -> None:
    """Offsets start at 0, never decrease and end at total_rows; checked in bounded chunks."""
    if offsets[0] != 0:
        raise RaggedStoreError(f"{where} starts at {int(offsets[0])}, not 0: the file is corrupted")
    if offsets[-1] != total_rows:
        raise RaggedStoreError(
            f"{where} ends at {int(offsets[-1])}, but the store has total_rows={total_rows}: the file is corrupted"
        )
    step = CRC_CHUNK // 8
    for start in range(0, len(offsets) - 1, step):
        chunk = offsets[start : start + step + 1]
        drops = np.flatnonzero(chunk[1:] < chunk[:-1])
        if drops.size:
            i = start + int(drops[0])
            raise RaggedStoreError(
                f"{where} decreases at sample {i} (offset {int(offsets[i])} then {int(offsets[i + 1])}): "
                "the file is corrupted"
            )


CORRUPTED = "its bytes differ from what was written (the file is corrupted)"


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the store at ``path``, checked for format and version."""
    manifest_path = path / MANIFEST
    try:
        text = manifest_path.read_text()
    except FileNotFoundError:
        raise RaggedStoreError(
            f"{path} is not a finished ragged store: {MANIFEST} is missing (a write that did not "
            "finish leaves none; write the store again)"
        ) from None
    try:
        manifest = json.loads(text)
    except ValueError as error:
        raise RaggedStoreError(f"{manifest_path} is not valid JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise RaggedStoreError(f"{manifest_path} should hold a JSON object, but holds {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise RaggedStoreError(
            f"{manifest_path} has format={manifest.get('format')!r}, but RaggedArray reads format {FORMAT!r}"
        )
    if manifest.get("version") != VERSION:
        raise RaggedStoreError(
            f"{manifest_path} has version={manifest.get('version')!r}, but this shardwise reads version "
            f"{VERSION} of format {FORMAT!r}; open it with the shardwise release that wrote it, or write it again"
        )
    return manifest


def layout(manifest: dict[str, Any], where: Path) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """Check every field of ``manifest``; return its dtype and feature shape."""
    try:
        dtype = check_dtype("dtype", field(manifest, "dtype", str, where))
        feature_shape = check_feature_shape(field(manifest, "feature_shape", list, where))
    except TypeError as error:
        raise RaggedStoreError(f"{where}: {error}") from None
    count(manifest, "num_samples", where)
    count(manifest, "total_rows", where)
    files = manifest.get("files")
    count(file_info(files, VALUES, where), "sampled_crc32", where)
    file_info(files, OFFSETS, where)
    return dtype, feature_shape


def check_file(path: Path, name: str, info: dict[str, Any], shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    """The ``.npy`` file ``name`` has the manifest's header size, total size, shape and dtype."""
    header, got_shape, got_dtype = read_header(path, name, info)
    if got_shape != shape or got_dtype != dtype:
        raise RaggedStoreError(
            f"{path / name} holds {got_dtype} of shape {got_shape}, but the manifest says {dtype} "
            f"of shape {shape}: the file was replaced or corrupted"
        )
    if info["bytes"] != header + dtype.itemsize * math.prod(shape):
        raise RaggedStoreError(f"{path / MANIFEST} gives a size for {name} that does not match its shape")

