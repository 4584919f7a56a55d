"""LocalitySampler with drop_last=False: the padding reads the plan's last positions (within each rank's partition)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

import shardwise
from shardwise import LocalitySampler, ScheduledBatchSampler, ShardedSampler

# (P, G): partitions, ranks a partition
SHAPES = [(2, 2), (3, 1), (2, 3), (4, 2)]
# plan sizes that no tested W divides; some below W, some below P * G
TOTALS = [1, 3, 5, 7, 11, 13, 23, 37, 61, 97]


def _sizes(total: int) -> list[int]:
    """Uneven shards (an empty one included) holding ``total`` samples."""
    sizes, left, k = [0], total, 1
    while left:
        take = min(left, 1 + (k * 7) % 9)
        sizes.append(take)
        left -= take
        k += 1
    return sizes


def _ranks(total: int, partitions: int, group: int, world_size: int, **kw: Any) -> list[LocalitySampler]:
    return [LocalitySampler(_sizes(total), window=2, partitions=partitions, ranks_per_partition=group,
                            num_replicas=world_size, rank=r, seed=7, **kw) for r in range(world_size)]  # fmt: skip


def _partitions_of(sampler: LocalitySampler, ids: list[int]) -> set[int]:
    layout = sampler.partition_layout()
    assert layout is not None
    return set(layout.locals_of(np.asarray(ids, dtype=np.int64))[0].tolist())


@pytest.mark.parametrize(("partitions", "group"), SHAPES)
@pytest.mark.parametrize("multiple", [1, 2, 3])
@pytest.mark.parametrize("total", TOTALS)
def test_padding_reads_the_rank_s_own_partition(partitions: int, group: int, multiple: int, total: int) -> None:
    """W a multiple of P*G: every id a rank reads, padding included, is in its partition (n >= P*G);
    equal lengths, every sample covered, at most W-1 repeats, whatever n."""
    world_size = multiple * partitions * group
    if total % world_size == 0:
        pytest.skip("no padding")
    ranks = _ranks(total, partitions, group, world_size)
    drawn = [list(sampler) for sampler in ranks]
    assert {len(ids) for ids in drawn} == {-(-total // world_size)}
    seen = Counter(i for ids in drawn for i in ids)
    assert set(seen) == set(range(total))
    assert sum(seen.values()) - total <= world_size - 1
    if total >= partitions * group:
        for rank, (sampler, ids) in enumerate(zip(ranks, drawn, strict=True)):
            assert _partitions_of(sampler, ids) == {(rank // group) % partitions}


def test_the_padding_is_the_plan_s_last_positions_of_the_partition() -> None:
    """P=2, G=2, W=4, n=13: rank r's padded position 12 + r (r >= 1) reads 8 + r, the latest below 13 congruent mod 4."""
    ranks = _ranks(13, 2, 2, 4)
    plan = list(LocalitySampler(_sizes(13), window=2, partitions=2, ranks_per_partition=2, num_replicas=1, rank=0,
                                seed=7))  # fmt: skip
    assert [list(s)[-1] for s in ranks] == [plan[12], plan[9], plan[10], plan[11]]


def test_without_partitions_the_padding_reads_the_plan_s_last_positions() -> None:
    """One partition: period G (default 1): padded positions read the plan's last samples, backwards (or its last G
    in turn), whose shards a node still holds at the epoch's end (the first ones it may have evicted)."""
    plan = list(LocalitySampler(_sizes(13), window=2, num_replicas=1, rank=0, seed=7))
    plain = [LocalitySampler(_sizes(13), window=2, num_replicas=4, rank=r, seed=7) for r in range(4)]
    assert [list(s)[-1] for s in plain] == [plan[12], plan[12], plan[11], plan[10]]  # distinct, like torch's
    grouped = [LocalitySampler(_sizes(13), window=2, ranks_per_partition=4, num_replicas=4, rank=r, seed=7)
               for r in range(4)]  # fmt: skip
    assert [list(s)[-1] for s in grouped] == [plan[12], plan[9], plan[10], plan[11]]
    assert plain[0].plan.wrap_period == 1 and grouped[0].plan.wrap_period == 4
    assert _ranks(13, 2, 2, 4)[0].plan.wrap_period == 4


def test_other_samplers_wrap_to_the_plan_s_start() -> None:
    """Every other sampler's padding reads p % n, torch's rule."""
    ranks = [ShardedSampler(13, num_replicas=4, rank=r, shuffle=False) for r in range(4)]
    assert [list(s)[-1] for s in ranks] == [12, 0, 1, 2]
    assert ranks[0].plan.wrap_period is None


@pytest.mark.parametrize(("partitions", "group", "world_size", "total"),
                         [(2, 2, 4, 13), (2, 2, 8, 37), (3, 1, 6, 23), (2, 3, 12, 61), (2, 2, 6, 23), (2, 2, 8, 3)])
def test_which_and_when_agree_with_what_the_ranks_iterated(partitions: int, group: int, world_size: int,
                                                          total: int) -> None:  # fmt: skip
    """shardwise.which gives each rank's ids step by step, padding included; when finds every (rank, step)."""
    ranks = _ranks(total, partitions, group, world_size)
    occurrences: dict[int, set[tuple[int, int]]] = {}
    for rank, sampler in enumerate(ranks):
        for step, index in enumerate(list(sampler)):
            occurrences.setdefault(index, set()).add((rank, step))
            batch = shardwise.which(sampler, epoch=0, step=step, rank=rank, batch_size=1)
            assert batch[0].indices == [index]
    for index, expected in occurrences.items():
        found = shardwise.when(ranks[0], index, epochs=0, batch_size=1)
        assert {(t.rank, t.step) for t in found} == expected


@pytest.mark.parametrize(("before", "after", "steps"), [(8, 4, 3), (4, 8, 5), (8, 12, 2), (4, 6, 4)])
def test_resume_at_another_world_size_loses_nothing(before: int, after: int, steps: int) -> None:
    """A state saved mid-epoch at W loads at W': 0 lost, repeats only the W'-1 of padding; when() agrees."""
    total = 61
    seen: Counter[int] = Counter()
    state = None
    for sampler in _ranks(total, 2, 2, before):
        sampler.set_epoch(1)
        iterator = iter(sampler)
        seen.update(next(iterator) for _ in range(steps))
        state = state or sampler.state_dict()
    assert state is not None and state["consumed"] == steps * before
    resumed = _ranks(total, 2, 2, after)
    for rank, sampler in enumerate(resumed):
        sampler.load_state_dict(state)
        ids = list(sampler)
        seen.update(ids)
        for step, index in enumerate(ids):
            found = shardwise.when(sampler, index, epochs=1, batch_size=1, world_size=after, start=state["consumed"])
            assert (rank, step) in {(t.rank, t.step) for t in found}
    assert set(seen) == set(range(total))
    assert sum(seen.values()) - total <= after - 1


def test_scheduled_batches_over_partitions_wrap_as_the_sampler_does() -> None:
    """ScheduledBatchSampler over a partitioned plan: its padded batches use the sampler's period; which/when agree."""
    total, world_size = 23, 4
    ranks = [ScheduledBatchSampler(LocalitySampler(_sizes(total), window=2, partitions=2, ranks_per_partition=2,
                                                   num_replicas=world_size, rank=r, seed=3),
                                   batch_size=2, num_replicas=world_size, rank=r) for r in range(world_size)]  # fmt: skip
    assert ranks[0].plan.wrap_period == 4
    plan = list(LocalitySampler(_sizes(total), window=2, partitions=2, ranks_per_partition=2, num_replicas=1, rank=0,
                                seed=3))  # fmt: skip
    seen: Counter[int] = Counter()
    last = []
    for rank, sampler in enumerate(ranks):
        batches = list(sampler)
        last.append(batches[-1])
        for step, batch in enumerate(batches):
            seen.update(batch)
            assert shardwise.which(sampler, epoch=0, step=step, rank=rank)[0].indices == batch
            for index in batch:
                assert (rank, step) in {(t.rank, t.step) for t in shardwise.when(sampler, index, epochs=0)}
    assert set(seen) == set(plan) and sum(seen.values()) - total <= world_size - 1
    # the last step cut to 2 a rank (positions 16-23): 23 wraps to 19, the latest below 23 congruent mod 4
    assert last[-1] == [plan[22], plan[19]]
