"""What opening a store checks: every kind of damage is refused, naming what is wrong."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from shardwise import RaggedArray, RaggedStoreError
from shardwise.data.ragged import MANIFEST, OFFSETS, VALUES


def _rewrite_manifest(path: Path, **changes: object) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest.update(changes)
    (path / MANIFEST).write_text(json.dumps(manifest))


def _rewrite_offsets(path: Path, edit) -> None:
    """Change the offsets in place and fix their checksum, so only the structural check can object."""
    offsets = np.load(path / OFFSETS)
    edit(offsets)
    np.save(path / OFFSETS, offsets)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"][OFFSETS]["crc32"] = zlib.crc32(offsets.tobytes())
    (path / MANIFEST).write_text(json.dumps(manifest))


def _truncate(name: str, nbytes: int):
    def damage(path: Path) -> None:
        with open(path / name, "r+b") as file:
            file.truncate(os.path.getsize(path / name) - nbytes)

    return damage


def _cut_header(path: Path) -> None:
    with open(path / VALUES, "r+b") as file:
        file.truncate(50)


def _append_bytes(path: Path) -> None:
    with open(path / VALUES, "ab") as file:
        file.write(b"\0" * 12)


def _flip_first_value_byte(path: Path) -> None:
    header = json.loads((path / MANIFEST).read_text())["files"][VALUES]["header_bytes"]
    with open(path / VALUES, "r+b") as file:
        file.seek(header)
        byte = file.read(1)
        file.seek(header)
        file.write(bytes([byte[0] ^ 0xFF]))


def _shift_one_offset(path: Path) -> None:
    """Move one sample boundary by a row: still monotonic, so only the checksum can tell."""
    offsets = np.load(path / OFFSETS)
    k = int(np.flatnonzero(np.diff(offsets) >= 2)[0]) + 1
    header = os.path.getsize(path / OFFSETS) - offsets.nbytes
    with open(path / OFFSETS, "r+b") as file:
        file.seek(header + 8 * k)
        file.write(np.int64(offsets[k] + 1).tobytes())


def _swap_offsets(path: Path) -> None:
    def edit(offsets: np.ndarray) -> None:
        offsets[10], offsets[11] = offsets[11] + 1, offsets[10]

    _rewrite_offsets(path, edit)


def _shift_last_offset(path: Path) -> None:
    def edit(offsets: np.ndarray) -> None:
        offsets[-1] -= 1

    _rewrite_offsets(path, edit)


def _replace_values_with_other_dtype(path: Path) -> None:
    values = np.load(path / VALUES)
    np.save(path / VALUES, values.view(np.int32))


DAMAGE = {
    "missing manifest": (lambda p: (p / MANIFEST).unlink(), r"manifest.json is missing"),
    "missing values": (lambda p: (p / VALUES).unlink(), r"values.npy is missing from the ragged store"),
    "missing offsets": (lambda p: (p / OFFSETS).unlink(), r"offsets.npy is missing from the ragged store"),
    "truncated values": (_truncate(VALUES, 4), r"values.npy is \d+ bytes, but the manifest says \d+: the file is trunc"),
    "truncated offsets": (_truncate(OFFSETS, 8), r"offsets.npy is \d+ bytes, .*: the file is truncated"),
    "values header cut": (_cut_header, r"values.npy is not a readable .npy file"),
    "values too long": (_append_bytes, r"values.npy is \d+ bytes, .*: the file is longer than written"),
    "values corrupted": (_flip_first_value_byte, r"values.npy fails its sampled checksum"),
    "offsets corrupted": (_shift_one_offset, r"offsets.npy fails its checksum"),
    "offsets not monotonic": (_swap_offsets, r"offsets.npy decreases at sample 10 \(offset \d+ then \d+\)"),
    "offsets end early": (_shift_last_offset, r"offsets.npy ends at \d+, but the store has total_rows=\d+"),
    "values of another dtype": (_replace_values_with_other_dtype, r"values.npy holds int32 .*but the manifest says float32"),
    "other version": (lambda p: _rewrite_manifest(p, version=2), r"has version=2, but this shardwise reads version 1"),
    "other format": (lambda p: _rewrite_manifest(p, format="zarr"), r"has format='zarr', but RaggedArray reads format"),
    "bad field": (lambda p: _rewrite_manifest(p, num_samples="50"), r"field 'num_samples' should be a int"),
    "bad dtype field": (lambda p: _rewrite_manifest(p, dtype="O"), r"dtype should be a numeric numpy dtype"),
    "not json": (lambda p: (p / MANIFEST).write_text("{'format':"), r"manifest.json is not valid JSON"),
    "json list": (lambda p: (p / MANIFEST).write_text("[]"), r"manifest.json should hold a JSON object"),
    "no file entry": (lambda p: _rewrite_manifest(p, files={}), r"has no entry for 'values.npy' under 'files'"),
}  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_store_is_refused_with_what_is_wrong(store: RaggedArray, damage: str) -> None:
    """Every kind of damage is named when opening; nothing is ever read as garbage."""
    break_it, match = DAMAGE[damage]
    break_it(store.path)
    with pytest.raises(RaggedStoreError, match=match):
        RaggedArray(store.path)
