"""Index builders at scale: the digest hashed beside a build, output pages mapped in one call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def test_background_digest_equals_digest(tmp_path: Path) -> None:
    """Whole arrays (a memmap, a strided view, an empty one) or pieces fed in order: digest()'s values, one after
    the other; a wrong piece is refused naming what was expected; leaving the block on an error stops the thread."""
    from shardwise._core.arrays import digest
    from shardwise.index.keys import BackgroundDigest

    values = np.random.default_rng(2).integers(0, 1 << 40, 3_000_001)
    np.save(tmp_path / "v.npy", values)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    BackgroundDigest._PIECE = 1 << 16  # several updates per array
    try:
        strided, empty = values[::3], np.empty(0, dtype=np.float32)
        with BackgroundDigest(mapped, strided, empty) as hashing:
            assert hashing.result() == digest(values) + digest(strided) + digest(empty)
        with BackgroundDigest(dtype=np.int64, length=len(values)) as hashing:
            for first in range(0, len(values), 1_000_000):
                hashing.feed(values[first : first + 1_000_000])
            assert hashing.result() == digest(values)
        with BackgroundDigest(dtype=np.int64, length=10) as hashing:
            with pytest.raises(ValueError, match="next 1-D int64 elements of 10"):
                hashing.feed(np.arange(11))
            hashing.feed(np.arange(4))
            with pytest.raises(ValueError, match="fed 4 of them"):
                hashing.result()
        with pytest.raises(KeyError), BackgroundDigest(mapped) as hashing:
            raise KeyError("stop")
        assert not hashing._thread.is_alive()
    finally:
        BackgroundDigest._PIECE = 1 << 24


def test_populate_maps_a_writable_memmap_and_ignores_other_arrays(tmp_path: Path) -> None:
    """populate() leaves the values as they are and writes reach the file; an in-memory array is left alone."""
    from shardwise.index.builders import populate, populate_ahead

    mapped = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=np.uint32, shape=(1 << 16,))
    populate(mapped)
    populate(mapped[5:], 1_000, 9_999)  # a range of a view: its pages, from the view's start
    assert populate_ahead(mapped, 10, 10) > 10 and populate_ahead(mapped, 10, 99) == 99
    assert not mapped.any()
    mapped[::7] = 3
    mapped.flush()
    del mapped
    assert np.array_equal(np.flatnonzero(np.load(tmp_path / "a.npy")), np.arange(0, 1 << 16, 7))
    plain = np.arange(5)
    populate(plain)
    assert plain.tolist() == [0, 1, 2, 3, 4]
