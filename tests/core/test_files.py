"""Durable-file helpers: page advice over a mapping never changes what it holds."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from shardwise._core.files import advise_pages
from shardwise.index.keys import key_of


def test_page_advice_inside_a_mapping_only_and_never_on_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "values.npy"
    np.save(path, np.arange(300_000, dtype=np.int32))
    mapped = np.load(path, mmap_mode="r")
    raw = mapped._mmap
    before = key_of(mapped)
    for advice in (getattr(mmap, "MADV_WILLNEED", None), None):
        advise_pages(raw, mapped.ctypes.data + 4 * 1000, 4 * 5000, advice)  # inside
        advise_pages(raw, mapped.ctypes.data - 10 * mmap.PAGESIZE, 4096, advice)  # before the mapping
        advise_pages(raw, mapped.ctypes.data + mapped.nbytes, 10 * mmap.PAGESIZE, advice)  # past its end
        advise_pages(None, mapped.ctypes.data, 4096, advice)  # not a mapping
    assert np.array_equal(mapped, np.arange(300_000, dtype=np.int32))
    # The sampled key asks for its blocks' pages first and hashes the same bytes: mapped again, the
    # same key; another view, another key.
    assert key_of(np.load(path, mmap_mode="r")) == before
    assert key_of(mapped[7:]) != before
