"""ShardedSampler computes its order in chunks; the chunk sizes must never show in what it yields."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardwise import ShardedSampler
from shardwise._core.permutation import Permutation
from shardwise._core.seeds import derive_seed

N = 250_003  # Feistel path; rank 1 of 3 yields 83_335 indices: chunks end at 1024, 3072, ..., 64512, 83335


class TinyChunks(ShardedSampler):
    """The same sampler with chunk sizes that do not divide anything."""

    _CHUNK = 1000
    _FIRST_CHUNK = 7


def expected(n: int, rank: int, world_size: int, epoch: int, seed: int) -> list[int]:
    """What the contract says: the epoch's permutation at positions rank, rank + W, ... wrapped."""
    count = -(-n // world_size)
    positions = (rank + world_size * np.arange(count)) % n
    return Permutation(n, derive_seed(seed, epoch, "shuffle"))(positions).tolist()


@pytest.mark.parametrize("make", [ShardedSampler, TinyChunks], ids=["default", "tiny"])
def test_units_are_the_permutation_at_the_dealt_positions(make: type[ShardedSampler]) -> None:
    """Over several chunks and two epochs, the sampler yields exactly the permutation at its positions."""
    sampler = make(N, num_replicas=3, rank=1, seed=4)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert list(sampler) == expected(N, 1, 3, epoch, seed=4)


@pytest.mark.parametrize("stop", [1, 1023, 1024, 1025, 3072, 64_511, 64_512, 64_513, 83_334])
def test_resume_at_chunk_boundaries_continues_the_pass(stop: int) -> None:
    """A state taken at or around a chunk boundary resumes with exactly the rest of the pass."""
    whole = expected(N, 1, 3, 0, seed=4)
    sampler = ShardedSampler(N, num_replicas=3, rank=1, seed=4)
    head = list(itertools.islice(iter(sampler), stop))
    state = sampler.state_dict()
    resumed = ShardedSampler(N, num_replicas=3, rank=1, seed=4)
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole
