"""LocalitySampler with shard partitions: the plan, the state, and what it tells a prefetching source."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shardwise
from shardwise import LocalitySampler
from shardwise._core.locality import LocalityPermutation
from shardwise._core.seeds import derive_seed

SIZES = np.asarray([7, 0, 12, 1, 9, 15, 4, 11, 8, 6])


class RecordingSource:
    """A sharded dataset that records what the sampler asks it to prefetch (the PlanListener protocol)."""

    shard_sizes = SIZES

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def __len__(self) -> int:
        return int(SIZES.sum())

    def follow_plan(self, permutation: Any, positions: np.ndarray) -> None:
        self.calls.append(permutation.upcoming_shards(positions, 1))


def test_one_partition_is_the_plain_plan_and_state() -> None:
    """partitions=1 (any ranks_per_partition) yields today's plan, and the state carries no partition keys."""
    plain = LocalitySampler(SIZES, window=3, mixing="windows", num_replicas=1, rank=0, seed=2)
    grouped = LocalitySampler(SIZES, window=3, mixing="windows", ranks_per_partition=4, num_replicas=1, rank=0, seed=2)
    expected = LocalityPermutation(SIZES, window=3, key=derive_seed(2, 0, "locality-shuffle"))(np.arange(SIZES.sum()))
    assert list(plain) == list(grouped) == expected.tolist()
    assert "partitions" not in plain.state_dict()["fingerprint"]


def test_iterating_prefetches_only_the_rank_s_partition() -> None:
    """Rank 2 of 4 (P=2, G=2) reads and prefetches only partition 1's shards, its padded last sample included."""
    source = RecordingSource()
    sampler = LocalitySampler(source, window=2, partitions=2, ranks_per_partition=2, num_replicas=4, rank=2, seed=0)
    ids = list(sampler)  # 73 samples at W=4: the last step of ranks 1-3 wraps within their partitions
    layout = sampler.partition_layout()
    assert layout is not None
    first, stop = layout.partition_pieces(1)
    allowed = set(layout.piece_shards[first:stop].tolist())
    asked = {int(s) for call in source.calls for s in call}
    read = set(np.searchsorted(np.cumsum(SIZES), ids, side="right").tolist())
    assert read <= asked <= allowed


def test_which_queries_do_not_prefetch() -> None:
    """shardwise.which asks about every rank's positions: the source is not told to prefetch them."""
    source = RecordingSource()
    sampler = LocalitySampler(source, window=2, partitions=2, ranks_per_partition=2, num_replicas=4, rank=0, seed=0)
    batches = shardwise.which(sampler, epoch=0, step=1, batch_size=2)
    assert len(batches) == 4 and source.calls == []


def test_when_inverts_the_partitioned_plan() -> None:
    """when() finds each sample at the rank and step that iterate it (P=2, G=2, W=4)."""
    ranks = [LocalitySampler(SIZES, window=2, partitions=2, ranks_per_partition=2, num_replicas=4, rank=r, seed=3)
             for r in range(4)]  # fmt: skip
    for rank, sampler in enumerate(ranks):
        for step, index in enumerate(list(sampler)):
            found = shardwise.when(sampler, index, epochs=0, batch_size=1)
            assert (found[0].rank, found[0].step) == (rank, step) or (rank, step) in [(t.rank, t.step) for t in found]


def test_mixing_is_part_of_the_plan_and_the_state() -> None:
    """mixing="streams" changes the plan; a state resumes only with the same mixing, and says which to use."""
    windows = LocalitySampler(SIZES, window=3, mixing="windows", num_replicas=2, rank=0, seed=2)
    streams = LocalitySampler(SIZES, window=3, num_replicas=2, rank=0, seed=2)  # the default
    assert list(windows) != list(streams)
    assert "mixing" not in windows.state_dict()["fingerprint"]  # states saved before mixing existed still load
    with pytest.raises(ValueError, match="mixing"):
        windows.load_state_dict(streams.state_dict())
    with pytest.raises(ValueError, match="mixing should be one of 'windows', 'streams'"):
        LocalitySampler(SIZES, mixing="stream")
