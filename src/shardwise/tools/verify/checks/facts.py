"""What several checks share: the facts computed once from what the ranks yielded, and phrasing.

Allowances follow torch's ``DistributedSampler`` contract: to give every rank the same number of
units the tail of a plan may be padded (repeating at most ``W-1`` units) or dropped (leaving out
at most ``W-1``); a unit is one index, or one batch for a batch sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runner import Observed
from ..worker import Epoch, RankRun

SHARD_FIX = (
    "deal one global plan out by rank: torch's DistributedSampler or shardwise.ShardedSampler for "
    "indices, or wrap what you have: shardwise.shard(sampler) / shardwise.shard_batches(batch_sampler)"
)


@dataclass
class Facts:
    """What several checks share, computed once."""

    obs: Observed
    runs: list[RankRun]
    world_size: int
    epochs: int
    dataset_size: int | None
    unit: list[int]
    """Per epoch, the largest unit (indices in one step) on any rank: the padding allowance's unit."""
    replacement: list[bool]
    """Per epoch, whether ranks repeat indices within their own epoch (draws with replacement)."""

    def epoch(self, rank: int, epoch: int) -> Epoch:
        return self.runs[rank].epochs[epoch]

    def allowance(self, epoch: int, ranks: int | None = None) -> int:
        return ((ranks or self.world_size) - 1) * self.unit[epoch]


def facts_of(obs: Observed) -> Facts:
    """The facts of one observation (run ``A`` of every rank)."""
    runs = obs.runs["A"]
    world_size, epochs = obs.setup.world_size, obs.setup.epochs
    unit = []
    replacement = []
    for e in range(epochs):
        sizes = [int(run.epochs[e].sizes.max()) if run.epochs[e].steps else 0 for run in runs]
        unit.append(max([*sizes, 1]))
        repeats = sum(int(run.epochs[e].flat.size - np.unique(run.epochs[e].flat).size) for run in runs)
        replacement.append(repeats > (world_size - 1) * unit[-1])
    probe = obs.probe
    return Facts(obs, runs, world_size, epochs, probe.dataset_size if probe else None, unit, replacement)


def first_difference(a: Epoch, b: Epoch) -> int:
    """The first step at which two epochs differ (``min(steps)`` if one is a prefix of the other)."""
    for k in range(min(a.steps, b.steps)):
        if not np.array_equal(a.flat[a.offsets[k]:a.offsets[k + 1]], b.flat[b.offsets[k]:b.offsets[k + 1]]):
            return k
    return min(a.steps, b.steps)


def rank_list(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0, 1``, or ``ranks 0..15 (16 ranks)`` for a long list."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    listed = ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)"
    return f"ranks {listed}"


def has_or_have(ranks: list[int]) -> str:
    """The verb that agrees with :func:`rank_list` of ``ranks``."""
    return "has" if len(ranks) == 1 else "have"
