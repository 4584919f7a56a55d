"""The default locality shuffle: about 1/window same-shard neighbours on even and uneven shards, and a new plan version.

Figures over one epoch's global order (the same at every world size): the fraction of consecutive
samples from one shard, and the mean |id step| over n (a uniform shuffle: 1/3).
"""

from __future__ import annotations

import numpy as np
import pytest

from shardwise import LocalitySampler
from shardwise._core.errors import StateMismatchError

N = 40_000


def _quality(sizes: np.ndarray, **options: object) -> tuple[float, float]:
    """Same-shard pairs and mean |id step| / n of the global order, averaged over 2 epochs."""
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    figures = []
    for epoch in range(2):
        sampler = LocalitySampler(sizes, num_replicas=1, rank=0, seed=3, **options)
        sampler.set_epoch(epoch)
        ids = np.fromiter(sampler, dtype=np.int64, count=len(sampler))
        shards = shard_of[ids]
        figures.append((np.mean(shards[1:] == shards[:-1]), np.mean(np.abs(np.diff(ids))) / len(ids)))
    same, step = np.mean(figures, axis=0)
    return float(same), float(step)


def _uneven(shards: int, seed: int) -> np.ndarray:
    """Shard sizes spread 1:1000 (log-uniform), ``N`` samples in all."""
    spread = np.exp(np.random.default_rng(seed).uniform(0, np.log(1000), shards))
    sizes = np.maximum(1, (spread / spread.sum() * N).astype(np.int64))
    return sizes


def test_the_default_mixes_even_shards_well() -> None:
    """41 even shards: at most 0.10 of consecutive samples from one shard, mean |id step|/n at least 0.30."""
    same, step = _quality(np.full(41, N // 41))
    assert same <= 0.10 and step >= 0.30


@pytest.mark.parametrize("seed", [0, 1])
def test_uneven_shards_do_not_spoil_the_default(seed: int) -> None:
    """53 shards of sizes spread 1:1000 (the largest holds ~10%): same-shard pairs at most twice a uniform shuffle's."""
    sizes = _uneven(53, seed)
    uniform = float(np.sum((sizes / sizes.sum()) ** 2))  # a uniform order's expected same-shard pairs
    same, step = _quality(sizes)
    assert same <= 2 * uniform and step >= 0.30


def test_a_state_of_an_earlier_plan_is_refused() -> None:
    """States of the earlier default (windows) and of streams' plan 1 are refused, naming what differs."""
    sizes = np.full(20, 50)
    sampler = LocalitySampler(sizes, num_replicas=2, rank=0, seed=1)
    windows = LocalitySampler(sizes, window=10, mixing="windows", num_replicas=2, rank=0, seed=1).state_dict()
    with pytest.raises(StateMismatchError, match="saved without mixing, but this sampler has mixing='streams'"):
        sampler.load_state_dict(windows)
    state = sampler.state_dict()
    del state["fingerprint"]["plan"]  # a state of plan 1: slots dealt round robin, other positions
    with pytest.raises(StateMismatchError, match="saved without plan"):
        LocalitySampler(sizes, num_replicas=2, rank=0, seed=1).load_state_dict(state)
    LocalitySampler(sizes, window=10, mixing="windows", num_replicas=2, rank=0, seed=1).load_state_dict(windows)
