"""The small-query path of the mixture plan (one Feistel pass over all sources) is the per-source path, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from shardwise._core import mixture_blocks
from shardwise._core.mixture_blocks import Draws, draw_indices, keyed_permute


def test_merged_draws_equal_the_per_source_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    sizes = np.array([1, 2, 17, 1000, 3, 2**33 + 5], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    keys = rng.integers(0, 2**63, size=(sizes.size, 6), dtype=np.int64).astype(np.uint64)
    sources = rng.integers(0, sizes.size, 3000)
    draws = rng.integers(0, 10**12, 3000) % (sizes[sources] * 5)
    found = Draws(sources.astype(np.int64), draws.astype(np.int64))
    merged = draw_indices(found, sizes, offsets, keys)
    monkeypatch.setattr(mixture_blocks, "_MERGED_MAX", 0)
    assert (draw_indices(found, sizes, offsets, keys) == merged).all()


def test_small_cycle_walk_equals_the_large_one(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    for size in (2, 5, 100, 1025, 2**20 + 3):
        values = rng.integers(0, size, 500)
        rounds = rng.integers(0, 2**63, size=(6, 500), dtype=np.int64).astype(np.uint64)
        small = keyed_permute(values, size, rounds)
        with_indexing = mixture_blocks._MERGED_MAX
        monkeypatch.setattr(mixture_blocks, "_MERGED_MAX", 0)
        assert (keyed_permute(values, size, rounds) == small).all(), size
        monkeypatch.setattr(mixture_blocks, "_MERGED_MAX", with_indexing)
