"""The conformance harness: one list of cases, every property of docs/design.md run over each.

A new sampler gets the whole harness by adding one ``Case`` line to ``CASES``.
A case builds the sampler for a data size ``n`` (the sampler decides what ``n`` means: samples,
or the size of the data behind its batches) at a given world size and rank.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

import shardwise
from shardwise import BatchSizeSchedule, ScheduledBatchSampler, ShardedSampler, shard, shard_batches
from shardwise._core.plan import wrap
from shardwise.samplers.locality import LocalitySampler
from tests.classic import TwoStreamBatchSampler


def key(unit: Any) -> Hashable:
    """Units are ints (index samplers) or lists (batch samplers); compare them as hashables."""
    return tuple(unit) if isinstance(unit, list) else unit


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[..., Any]
    """``make(n, num_replicas=W, rank=r, seed=s)`` -> sampler."""
    expected: Callable[[int], Counter[Hashable] | None] = lambda n: None
    """The multiset of units one epoch's plan must cover for size ``n`` (None: not fixed)."""
    shuffles: bool = True
    """Whether the order differs between epochs."""
    min_n: int = 0


def _two_stream(n: int, **kw: Any) -> Any:
    primary = np.arange(0, n // 3)
    secondary = np.arange(n // 3, n)
    return shard_batches(TwoStreamBatchSampler(primary, secondary, 4, 2), **kw)


CASES: list[Case] = [
    Case("ShardedSampler", ShardedSampler, lambda n: Counter(range(n))),
    Case("ShardedSampler-noshuffle", lambda n, **kw: ShardedSampler(n, shuffle=False, **kw),
         lambda n: Counter(range(n)), shuffles=False),
    Case("LocalitySampler-windows", lambda n, **kw: LocalitySampler([3] * (n // 3) + [0, n % 3], window=2,
         mixing="windows", **kw),
         lambda n: Counter(range(n))),
    Case("LocalitySampler-windows-partitions", lambda n, **kw: LocalitySampler([1] * (n % 5) + [0] + [5] * (n // 5),
         window=2, mixing="windows", partitions=2, ranks_per_partition=2, **kw), lambda n: Counter(range(n))),
    Case("LocalitySampler-streams", lambda n, **kw: LocalitySampler([3] * (n // 3) + [0, n % 3], window=3,
         mixing="streams", **kw), lambda n: Counter(range(n))),
    Case("LocalitySampler-streams-partitions", lambda n, **kw: LocalitySampler(
         [1] * (n % 5) + [0] + [5] * (n // 5), window=2, mixing="streams", partitions=2, ranks_per_partition=2, **kw),
         lambda n: Counter(range(n))),
    Case("ShardedSampler-drop", lambda n, **kw: ShardedSampler(n, drop_last=True, **kw), lambda n: Counter(range(n))),
    Case("shard-RandomSampler", lambda n, **kw: shard(RandomSampler(range(n)), **kw), lambda n: Counter(range(n)),
         min_n=1),
    Case("shard_batches-BatchSampler",
         lambda n, **kw: shard_batches(BatchSampler(RandomSampler(range(n)), 3, drop_last=False), **kw), min_n=1),
    Case("shard_batches-sequential", lambda n, **kw: shard_batches(BatchSampler(SequentialSampler(range(n)), 2, False),
         drop_last=True, **kw), shuffles=False),
    Case("shard_batches-TwoStream", _two_stream, min_n=12),
    Case("Scheduled-constant", lambda n, **kw: ScheduledBatchSampler(n, batch_size=2, drop_last=True, **kw), min_n=16),
    Case("Scheduled-by_epoch", lambda n, **kw: ScheduledBatchSampler(n, batch_size=BatchSizeSchedule.by_epoch({0: 2, 2: 3}),
         drop_last=True, **kw), min_n=24),
    Case("Scheduled-pad", lambda n, **kw: ScheduledBatchSampler(n, batch_size=1, **kw),
         lambda n: Counter((i,) for i in range(n))),
    Case("TwoStream", lambda n, **kw: shardwise.TwoStreamBatchSampler(range(n // 2, n), range(n // 2),
         primary_batch_size=2, secondary_batch_size=3, **kw), min_n=4),
    Case("TwoStream-keep", lambda n, **kw: shardwise.TwoStreamBatchSampler(range(n // 2, n), range(n // 2),
         primary_batch_size=3, secondary_batch_size=1, drop_last=False, **kw), min_n=2),
    Case("ClassBalanced", lambda n, **kw: shardwise.ClassBalancedBatchSampler(np.arange(n) % 3, classes_per_batch=2,
         samples_per_class=2, **kw), min_n=2),
    Case("Weighted", lambda n, **kw: shardwise.WeightedSampler(np.arange(n + 2) % 4, num_samples=n, **kw)),
    Case("Weighted-distinct", lambda n, **kw: shardwise.WeightedSampler(np.arange(1, n + 2), num_samples=n,
         replacement=False, drop_last=True, **kw)),
    Case("Bucket-tokens", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) * 7 % 13 + 1, max_tokens=24,
         batch_size_multiple=2, sort_window=7, balance_group=4, shuffle=False, **kw), min_n=1, shuffles=False),
    Case("Bucket-tokens-shuffled", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) * 7 % 13 + 1,
         max_tokens=24, batch_size_multiple=2, sort_window=7, balance_group=4, **kw), min_n=1),
    Case("Bucket-tokens-single", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) % 5 + 12, max_tokens=15,
         oversized="single", **kw), min_n=1),
    Case("Bucket-batch", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) * 5 % 11, batch_size=3,
         sort_window=5, **kw), min_n=1),
    Case("Bucket-batch-drop", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) % 9 + 1, batch_size=2,
         balance_group=3, drop_last=True, **kw), min_n=1),
    Case("Bucket-batch-ascending", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) * 5 % 11, batch_size=3,
         sort_window=5, batch_order="ascending", **kw), min_n=1),
    Case("Bucket-batch-longest", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) * 5 % 13, batch_size=2,
         balance_group=4, longest_first=True, **kw), min_n=1),
    Case("TwoStream-by_epoch", lambda n, **kw: shardwise.TwoStreamBatchSampler(range(n // 2, n), range(n // 2),
         primary_batch_size=BatchSizeSchedule.by_epoch({0: 2, 2: 3}),
         secondary_batch_size=BatchSizeSchedule.by_epoch({0: 1, 3: 2}), **kw), min_n=6),
    Case("Bucket-tokens-by_epoch", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) * 7 % 13 + 1,
         max_tokens=BatchSizeSchedule.by_epoch({0: 24, 1: 40}), sort_window=7, balance_group=4, **kw), min_n=1),
    Case("Bucket-batch-by_epoch", lambda n, **kw: shardwise.BucketBatchSampler(np.arange(n) * 5 % 11,
         batch_size=BatchSizeSchedule.by_epoch({0: 3, 2: 2}), sort_window=5, **kw), min_n=1),
    Case("Mixture", lambda n, **kw: shardwise.MixtureSampler([n // 2 + 1, n // 3 + 1, 3], [0.5, 0.3, 0.2],
         num_samples=n, **kw)),
    Case("Mixture-drop-noshuffle", lambda n, **kw: shardwise.MixtureSampler([n + 1, 4], [3, 1], num_samples=n,
         shuffle=False, drop_last=True, **kw), shuffles=False),
    Case("Mixture-interleave", lambda n, **kw: shardwise.MixtureSampler([n + 3, 5, 2], [0.6, 0.3, 0.1], num_samples=n,
         interleave=True, **kw)),
    Case("Mixture-all_exhausted", lambda n, **kw: shardwise.MixtureSampler([n // 2 + 1, n // 4 + 2, 3],
         [0.6, 0.2, 0.2], stop="all_exhausted", **kw)),
    Case("Mixture-by_samples", lambda n, **kw: shardwise.MixtureSampler([n + 1, 7], shardwise.WeightSchedule.by_samples(
         {0: [0.9, 0.1], n // 2: [0.5, 0.5], 3 * n: [0.2, 0.8]}), num_samples=n, block=10, **kw)),
    Case("ClassBalanced-by_epoch", lambda n, **kw: shardwise.ClassBalancedBatchSampler(np.arange(n) % 3,
         classes_per_batch=BatchSizeSchedule.by_epoch({0: 2, 2: 3}), samples_per_class=2, **kw), min_n=3),
    Case("Packed-rows", lambda n, **kw: shardwise.PackedBatchSampler(np.arange(n) * 7 % 13 + 1, max_len=16,
         rows_per_batch=2, window=8, **kw), min_n=1),
    Case("Packed-tokens-attention-split", lambda n, **kw: shardwise.PackedBatchSampler(np.arange(n) * 5 % 23,
         max_len=10, tokens_per_batch=25, balance="attention", window=16, **kw), min_n=1),
    Case("Packed-drop", lambda n, **kw: shardwise.PackedBatchSampler(np.arange(n) % 9 + 1, max_len=12,
         rows_per_batch=3, drop_last=True, **kw), min_n=12),
    Case("PackedMixture", lambda n, **kw: shardwise.PackedMixtureSampler([np.arange(n) * 7 % 13 + 1, [5] * 4 + [30]],
         [0.7, 0.3], max_len=8, rows_per_batch=2, **kw), min_n=1),
    Case("PackedMixture-batches-noshuffle", lambda n, **kw: shardwise.PackedMixtureSampler(
         [[4, *np.arange(n) % 9], np.arange(n) % 4 + 1, [3, 0, 2]], [0.5, 0.3, 0.2], max_len=6, rows_per_batch=3,
         num_batches=n // 3 + 1, shuffle=False, **kw), shuffles=False, min_n=1),
]


def run_epoch(sampler: Any) -> list[Any]:
    return [key(u) for u in sampler]


def plan_of(case: Case, n: int, *, seed: int = 0, epoch: int | None = None) -> list[Hashable]:
    """The global plan: what a single process yields (world size 1)."""
    sampler = case.make(n, num_replicas=1, rank=0, seed=seed)
    if epoch is not None:
        sampler.set_epoch(epoch)
    return run_epoch(sampler)


def dealt(plan: list[Hashable], start: int, rank: int, world_size: int, count: int,
          period: int | None = None) -> list[Hashable]:  # fmt: skip
    """What rank ``rank`` must yield: plan positions start+rank, +W, ..., wrapped into the plan (period: the
    sampler's ``plan.wrap_period``, ``None`` for the plan's start)."""
    positions = wrap(start + rank + world_size * np.arange(count, dtype=np.int64), len(plan), period)
    return [plan[p] for p in positions.tolist()]
