"""ScheduledBatchSampler: lockstep steps, exact len, payloads, resume anywhere (also elastic), real ranks.

The conformance harness (tests/conformance.py) covers the schedules whose batch plan does not
depend on the world size (constant and per-epoch sizes). A size change *within* an epoch cuts
steps of ``W * b`` samples, so batch boundaries depend on ``W`` and "dealt by position" holds at
the level of samples instead: the property tests below are the harness restated for that level.
"""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from shardwise import (
    BatchSizeSchedule,
    MalformedStateError,
    ScheduledBatchSampler,
    ShardedSampler,
    StateMismatchError,
    shard,
    shard_batches,
)
from shardwise.tools.launch import run_distributed

MID_EPOCH = BatchSizeSchedule.by_samples({0: 4, 30: 6, 70: 3, 150: 5})
"""Changes at samples 30 and 70 (inside epoch 0 for n=101), and 150 (inside epoch 1)."""


def sample_plan(n: int, *, seed: int, epoch: int) -> list[int]:
    """The global sample plan: ShardedSampler's order for a single process."""
    sampler = ShardedSampler(n, num_replicas=1, rank=0, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def run_ranks(make: Any, world_size: int, *, epoch: int | None = None) -> list[list[list[Any]]]:
    """Every rank's batches of one epoch."""
    result = []
    for rank in range(world_size):
        sampler = make(num_replicas=world_size, rank=rank)
        if epoch is not None:
            sampler.set_epoch(epoch)
        result.append(list(sampler))
    return result


def global_stream(per_rank: list[list[list[Any]]]) -> list[Any]:
    """Samples in plan order: step by step, rank by rank."""
    return [i for step in zip(*per_rank, strict=True) for batch in step for i in batch]


# -- the harness, at the level of samples ---------------------------------------------------------
schedules = st.one_of(
    st.dictionaries(st.integers(1, 120), st.integers(1, 6), max_size=4).map(
        lambda d: BatchSizeSchedule.by_samples({0: 2, **dict(sorted(d.items()))})
    ),
    st.builds(
        lambda s, k, i, o: BatchSizeSchedule.ramp(start=s, end=s + k * i, increment=i, over_samples=o),
        st.integers(1, 3),
        st.integers(0, 3),
        st.integers(1, 2),
        st.integers(0, 150),
    ),
    st.just(BatchSizeSchedule(lambda epoch, samples: 1 + (samples // 5) % 4)),
)


@settings(max_examples=80, deadline=None)
@given(schedules, st.integers(1, 8), st.integers(0, 60), st.booleans(), st.integers(0, 2))
def test_steps_are_lockstep_and_dealt_from_the_sample_plan(schedule, world_size, n, drop_last, epoch) -> None:
    """Equal len on all ranks, equal sizes per step, and the steps read the sample plan in order."""
    small = n < world_size * schedule(epoch, epoch * n).batch_size
    if drop_last and small and n:
        with pytest.raises(ValueError, match="zero batches"):
            refused = ScheduledBatchSampler(n, batch_size=schedule, drop_last=True, num_replicas=world_size, rank=0)
            refused.set_epoch(epoch)
            len(refused)
        return

    def make(**kw: Any) -> ScheduledBatchSampler:
        return ScheduledBatchSampler(n, batch_size=schedule, drop_last=drop_last, seed=2, **kw)

    try:
        per_rank = run_ranks(make, world_size, epoch=epoch)
    except ValueError as error:  # a later epoch's first step may not fit: refused, never zero batches
        assert drop_last and "zero batches" in str(error)
        return
    probe = make(num_replicas=world_size, rank=0)
    probe.set_epoch(epoch)
    steps = probe.steps()
    assert {len(batches) for batches in per_rank} == {len(steps)} == {len(probe)}
    for s, step in enumerate(steps):
        assert {len(batches[s]) for batches in per_rank} == {step.batch_size}
    plan = sample_plan(n, seed=2, epoch=epoch)
    stream = global_stream(per_rank)
    if drop_last:
        assert stream == plan[: len(stream)]
        assert n - len(stream) < world_size * max(schedule(epoch, epoch * n + p).batch_size for p in range(n + 1))
    else:
        assert stream == [plan[p % n] for p in range(len(stream))]
        assert 0 <= len(stream) - n < world_size


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_at_every_step_equals_uninterrupted(world_size: int, drop_last: bool) -> None:
    """Stopping after k steps, saving rank 0's state and resuming gives the same batches as no stop."""

    def make(**kw: Any) -> ScheduledBatchSampler:
        return ScheduledBatchSampler(101, batch_size=MID_EPOCH, drop_last=drop_last, seed=9, **kw)

    uninterrupted = run_ranks(make, world_size, epoch=1)
    for stop in range(len(uninterrupted[0]) + 1):
        states, heads = [], []
        for rank in range(world_size):
            sampler = make(num_replicas=world_size, rank=rank)
            sampler.set_epoch(1)
            heads.append(list(itertools.islice(iter(sampler), stop)))
            states.append(sampler.state_dict())
        assert all(state == states[0] for state in states)
        for rank in range(world_size):
            resumed = make(num_replicas=world_size, rank=rank)
            resumed.load_state_dict(states[0])
            resumed.set_epoch(1)  # what a framework does after restoring: keeps the position
            assert heads[rank] + list(resumed) == uninterrupted[rank]


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2), (4, 1), (1, 4)])
@pytest.mark.parametrize("stop", [1, 3, 5])  # the epoch has 6 steps at W=4
def test_elastic_resume_across_a_size_change(before: int, after: int, stop: int) -> None:
    """A state saved at W loads at W' anywhere in the schedule: one pass, nothing lost, nothing twice."""
    n, epoch = 101, 0

    def make(**kw: Any) -> ScheduledBatchSampler:
        return ScheduledBatchSampler(n, batch_size=MID_EPOCH, seed=4, **kw)

    seen: list[int] = []
    state = None
    for rank in range(before):
        sampler = make(num_replicas=before, rank=rank)
        sampler.set_epoch(epoch)
        for batch in itertools.islice(iter(sampler), stop):
            seen += batch
        state = state or sampler.state_dict()
    assert state is not None
    sizes_after = []
    for rank in range(after):
        resumed = make(num_replicas=after, rank=rank)
        resumed.load_state_dict(state)
        batches = list(resumed)
        sizes_after.append([len(b) for b in batches])
        seen += [i for b in batches for i in b]
    assert all(sizes == sizes_after[0] for sizes in sizes_after)
    counts = Counter(seen)
    assert set(counts) == set(range(n))
    assert sum(counts.values()) - n < after  # only the padded tail repeats


def test_len_is_exact_before_the_first_batch_and_follows_the_schedule() -> None:
    """len() counts this epoch's steps at the resolved world size before iterating, on every rank."""
    sampler = ScheduledBatchSampler(101, batch_size=MID_EPOCH, num_replicas=2, rank=1)
    # steps of 2 * 4 samples to 32 (the change at 30 waits for the step boundary), of 2 * 6 to 80,
    # of 2 * 3 to 98, then the 3 left: 2 per rank, one wrapped
    assert [s.batch_size for s in sampler.steps()] == [4, 4, 4, 4, 6, 6, 6, 6, 3, 3, 3, 2]
    assert len(sampler) == 12
    assert sampler.batch_size == 4
    assert [len(b) for b in sampler] == [4, 4, 4, 4, 6, 6, 6, 6, 3, 3, 3, 2]
    # epoch 1 starts at sample 101: size 3, then 5 from the first step at or after sample 150
    assert [s.batch_size for s in sampler.steps()] == [3] * 9 + [5] * 4 + [4]
    assert sampler.batch_size == 3
    assert len(sampler) == 14


def test_epoch_advances_without_set_epoch_and_set_epoch_wins() -> None:
    """Orders differ between epochs with or without set_epoch; set_epoch(e) replays epoch e."""
    sampler = ScheduledBatchSampler(60, batch_size=MID_EPOCH, num_replicas=2, rank=0, seed=1)
    auto = [list(sampler) for _ in range(3)]
    assert auto[0] != auto[1] != auto[2]
    fresh = ScheduledBatchSampler(60, batch_size=MID_EPOCH, num_replicas=2, rank=0, seed=1)
    fresh.set_epoch(2)
    assert list(fresh) == auto[2]
    fresh.set_epoch(2)
    assert list(fresh) == auto[2]


def test_shuffle_false_reads_the_data_in_order() -> None:
    """shuffle=False cuts consecutive indices; rank r takes the r-th slice of each step."""
    ranks = run_ranks(lambda **kw: ScheduledBatchSampler(10, batch_size=2, shuffle=False, **kw), 2)
    assert ranks == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7], [9]]]


def test_constant_schedule_is_the_sharded_plan_in_batches() -> None:
    """batch_size=int at one process batches ShardedSampler's order like BatchSampler does."""
    expected = list(BatchSampler(sample_plan(50, seed=3, epoch=1), 8, drop_last=False))
    sampler = ScheduledBatchSampler(50, batch_size=8, seed=3, num_replicas=1, rank=0)
    sampler.set_epoch(1)
    assert list(sampler) == expected


def test_index_sampler_plan_is_batched_with_its_own_seed() -> None:
    """data may be a shardwise index sampler: its global plan and seed give the order."""
    inner = ShardedSampler(40, seed=6)
    per_rank = run_ranks(lambda **kw: ScheduledBatchSampler(inner, batch_size=MID_EPOCH, **kw), 3, epoch=2)
    assert global_stream(per_rank)[:40] == sample_plan(40, seed=6, epoch=2)
    wrapped = ScheduledBatchSampler(shard(RandomSampler(range(30))), batch_size=4, num_replicas=2, rank=0)
    other = ScheduledBatchSampler(shard(RandomSampler(range(30))), batch_size=4, num_replicas=2, rank=1)
    stream = global_stream([list(wrapped), list(other)])
    assert sorted(stream[:30]) == list(range(30))
    assert ScheduledBatchSampler(inner, batch_size=2).seed == 6
    assert "data=ShardedSampler" in repr(ScheduledBatchSampler(inner, batch_size=2))


def test_weighted_sampler_draws_are_batched_in_lockstep() -> None:
    """WeightedSampler as data: its global draw plan is cut into scheduled steps, identical on all ranks."""
    import numpy as np

    from shardwise import WeightedSampler

    def make(**kw: Any) -> ScheduledBatchSampler:
        weighted = WeightedSampler(np.arange(1, 11, dtype=float), num_samples=40, seed=2)
        return ScheduledBatchSampler(weighted, batch_size=BatchSizeSchedule.by_samples({0: 3, 20: 5}), **kw)

    per_rank = run_ranks(make, 2)
    assert [[len(b) for b in batches] for batches in per_rank] == [[3, 3, 3, 3, 5, 3]] * 2
    draws = list(WeightedSampler(np.arange(1, 11, dtype=float), num_samples=40, seed=2, num_replicas=1, rank=0))
    assert global_stream(per_rank)[:40] == draws


def test_index_sampler_state_resumes() -> None:
    """With an index sampler as data, the state nests its fingerprint and resumes exactly."""

    def make() -> ScheduledBatchSampler:
        return ScheduledBatchSampler(ShardedSampler(40, seed=6), batch_size=MID_EPOCH, num_replicas=2, rank=0)

    first = make()
    head = list(itertools.islice(iter(first), 3))
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == list(make())
    with pytest.raises(StateMismatchError, match="data"):
        ScheduledBatchSampler(ShardedSampler(41, seed=6), batch_size=2).load_state_dict(first.state_dict())


# -- payloads ---------------------------------------------------------------------------------------
PROGRESSIVE = BatchSizeSchedule.by_samples({0: (6, {"size": 8}), 24: (4, {"size": 12}), 40: (3, {"size": 16})})


class SizedImages(Dataset[torch.Tensor]):
    """A dataset that resizes in the worker: item (index, payload) -> an image of payload['size']."""

    def __len__(self) -> int:
        return 52

    def __getitem__(self, item: tuple[int, dict[str, int]]) -> dict[str, Any]:
        index, payload = item
        size = payload["size"]
        return {"index": index, "image": torch.full((3, size, size), float(index))}


def test_payload_batches_are_index_payload_pairs() -> None:
    """A schedule with payloads yields [(index, payload), ...], the payload of the batch's step."""
    sampler = ScheduledBatchSampler(52, batch_size=PROGRESSIVE, num_replicas=2, rank=0)
    batches = list(sampler)
    assert [len(b) for b in batches] == [6, 6, 4, 4, 3, 3]
    assert [b[0][1]["size"] for b in batches] == [8, 8, 12, 12, 16, 16]
    assert all(isinstance(i, int) for b in batches for i, _ in b)
    assert [s.payload["size"] for s in sampler.steps(epoch=0)] == [8, 8, 12, 12, 16, 16]


def test_payload_reaches_the_dataset_in_dataloader_workers() -> None:
    """With num_workers=2, each worker sees (index, payload) and returns images of the step's size."""
    sampler = ScheduledBatchSampler(52, batch_size=PROGRESSIVE, num_replicas=2, rank=1, seed=5)
    loader = DataLoader(SizedImages(), batch_sampler=sampler, num_workers=2)
    assert len(loader) == 6
    shapes = [tuple(batch["image"].shape) for batch in loader]
    assert shapes == [(6, 3, 8, 8)] * 2 + [(4, 3, 12, 12)] * 2 + [(3, 3, 16, 16)] * 2
    indices = [i for batch in loader for i in batch["index"].tolist()]
    assert len(set(indices)) == len(indices)


# -- bad input ----------------------------------------------------------------------------------------
def test_zero_batches_is_refused_at_construction() -> None:
    """drop_last with fewer samples than one global step (at any scheduled epoch) raises, naming the fix."""
    with pytest.raises(ValueError, match=r"batch size 8 at the start of epoch 0, .* 2 rank\(s\) needs 16 samples"):
        ScheduledBatchSampler(10, batch_size=8, drop_last=True, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="epoch 3"):
        ScheduledBatchSampler(10, batch_size=BatchSizeSchedule.by_epoch({0: 2, 3: 11}), drop_last=True)
    with pytest.raises(ValueError, match="epoch 3"):  # sample 25 is in epoch 2; epoch 3 starts at size 11
        ScheduledBatchSampler(10, batch_size=BatchSizeSchedule.by_samples({0: 2, 25: 11}), drop_last=True)
    assert len(ScheduledBatchSampler(10, batch_size=8, num_replicas=2, rank=0)) == 1  # padded, not empty
    assert len(ScheduledBatchSampler(0, batch_size=8, drop_last=True)) == 0  # no data, no batches


def test_zero_batches_at_the_resolved_world_size_raises_before_iterating(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a lazily resolved world size, len() and iter() refuse a step that cannot fill."""
    sampler = ScheduledBatchSampler(10, batch_size=4, drop_last=True)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="zero batches"):
        len(sampler)
    with pytest.raises(ValueError, match="zero batches"):
        iter(sampler)


def test_callable_returning_non_int_fails_at_construction() -> None:
    """A schedule function is evaluated at construction: a non-int return is a TypeError there."""
    with pytest.raises(TypeError, match=r"returned '32' \(str\) at epoch=0, samples=0"):
        ScheduledBatchSampler(10, batch_size=lambda epoch, samples: "32")
    with pytest.raises(ValueError, match="returned -1"):
        ScheduledBatchSampler(10, batch_size=lambda epoch, samples: -1)


@pytest.mark.parametrize(
    ("data", "kwargs", "error", "match"),
    [
        (RandomSampler(range(5)), {}, TypeError, r"wrap it as shardwise.shard\(sampler\)"),
        (2.5, {}, TypeError, "data should be a sized dataset or an int length"),
        (-3, {}, ValueError, "data should be a non-negative integer"),
        (ShardedSampler(5, seed=1), {"shuffle": False}, ValueError, "shuffle=False has no effect"),
        (ShardedSampler(5, seed=1), {"seed": 2}, ValueError, "seed=2 differs from the seed of the index sampler"),
        (10, {"batch_size": 0}, ValueError, "batch_size should be a positive integer"),
        (10, {"batch_size": 2.0}, TypeError, "batch_size should be a positive int, a BatchSizeSchedule"),
        (10, {"drop_last": 1}, TypeError, "drop_last should be True or False"),
        (10, {"shuffle": "yes"}, TypeError, "shuffle should be True or False"),
        (10, {"num_replicas": 2, "rank": 2}, ValueError, r"rank should be in the interval \[0, 1\]"),
    ],
)
def test_bad_arguments_fail_at_construction(data, kwargs, error, match) -> None:
    """Bad data, batch_size, flags or ranks raise at construction, naming the parameter."""
    kwargs = {"batch_size": 2, **kwargs}
    with pytest.raises(error, match=match):
        ScheduledBatchSampler(data, **kwargs)


def test_a_batch_sampler_as_data_is_refused() -> None:
    """data must be an index sampler: a shardwise batch sampler is refused at construction, with a TypeError."""
    with pytest.raises(TypeError, match="but got ShardedBatchWrapper, a batch sampler whose units are batches"):
        ScheduledBatchSampler(shard_batches(BatchSampler(range(9), 3, False)), batch_size=2)


def test_an_index_sampler_of_lists_is_refused_at_its_first_batch() -> None:
    """shard() over lists of indices (not a BatchSampler, so not known before) fails at the first batch."""
    sampler = ScheduledBatchSampler(shard([[0, 1], [2, 3], [4, 5]], num_replicas=1, rank=0), batch_size=2)
    with pytest.raises(TypeError, match="data should be an index sampler, but ShardedWrapper yields list units"):
        next(iter(sampler))


def test_foreign_state_is_refused() -> None:
    """A state of another data size or kind names the field; a non-state is malformed."""
    state = ScheduledBatchSampler(30, batch_size=2).state_dict()
    with pytest.raises(StateMismatchError, match="num_samples=30, but this sampler has num_samples=31"):
        ScheduledBatchSampler(31, batch_size=2).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="kind"):
        ShardedSampler(30).load_state_dict(state)
    with pytest.raises(MalformedStateError):
        ScheduledBatchSampler(30, batch_size=2).load_state_dict({"epoch": 0})


def test_state_loads_under_a_changed_schedule() -> None:
    """consumed counts samples, so a run may resume with another schedule from the same position."""
    first = ScheduledBatchSampler(40, batch_size=4, num_replicas=1, rank=0)
    head = list(itertools.islice(iter(first), 3))
    resumed = ScheduledBatchSampler(40, batch_size=7, num_replicas=1, rank=0)
    resumed.load_state_dict(first.state_dict())
    tail = list(resumed)
    assert [len(b) for b in tail] == [7, 7, 7, 7]
    assert sorted(i for b in head + tail for i in b) == list(range(40))


# -- description -------------------------------------------------------------------------------------
def test_repr_describe_and_pickle() -> None:
    """repr shows schedule and world; describe is plain; pickled mid-pass, the state resumes and a new pass starts."""
    sampler = ScheduledBatchSampler(101, batch_size=MID_EPOCH, num_replicas=2, rank=1, seed=3)
    assert repr(sampler) == (
        "ScheduledBatchSampler(n=101, batch_size=BatchSizeSchedule.by_samples({0: 4, 30: 6, 70: 3, 150: 5}), "
        "shuffle=True, drop_last=False, even='pad', seed=3, rank=1, world_size=2)"
    )
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(5)]
    info = sampler.describe()
    assert info["consumed"] == 4 * 2 * 4 + 2 * 6
    assert info["batch_size"] == repr(MID_EPOCH)
    assert info["world_size"] == 2
    clone = pickle.loads(pickle.dumps(sampler))
    whole = list(ScheduledBatchSampler(101, batch_size=MID_EPOCH, num_replicas=2, rank=1, seed=3))
    assert list(clone) == whole  # a new pass starts the epoch (NOTE [ A new pass starts its epoch ])
    clone.load_state_dict(sampler.state_dict())
    assert head + list(clone) == whole
    assert repr(BatchSizeSchedule.by_epoch({0: (8, 128), 2: (4, 224)})) == (
        "BatchSizeSchedule.by_epoch({0: (8, 128), 2: (4, 224)})"
    )


# -- real ranks ---------------------------------------------------------------------------------------
def _epochs_in_lockstep(rank: int, world_size: int, state: dict[str, Any] | None, plan: list[tuple[int, int | None]]):
    """Run (epoch, steps or None for the rest) passes; all_reduce every step's size; return batches and state."""
    import torch.distributed as dist

    sampler = ScheduledBatchSampler(101, batch_size=MID_EPOCH, seed=3)  # rank and world from the process group
    if state is not None:
        sampler.load_state_dict(state)
    out = []
    for epoch, steps in plan:
        sampler.set_epoch(epoch)
        length = len(sampler)
        planned = torch.tensor([length])
        dist.all_reduce(planned, op=dist.ReduceOp.MAX)  # len() is equal on every rank before the first batch
        if int(planned) != length:
            raise RuntimeError(f"rank {rank} plans {length} steps, another plans {int(planned)}")
        batches = list(itertools.islice(iter(sampler), steps))
        for batch in batches:
            check = torch.tensor([1, len(batch)])
            dist.all_reduce(check)  # a rank with another length or size would make this wait, then time out
            if check.tolist() != [world_size, world_size * len(batch)]:
                raise RuntimeError(f"rank {rank}: step sizes differ across ranks: {check.tolist()}")
        out.append({"epoch": epoch, "len": length, "batches": batches})
    return out, sampler.state_dict()


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_real_ranks_stay_in_lockstep_and_resume_elastically_across_a_size_change() -> None:
    """2 gloo ranks run epoch 0 and part of epoch 1; 3 ranks resume epoch 1 and run epoch 2: exact union."""
    two = run_distributed(_epochs_in_lockstep, 2, None, [(0, None), (1, 5)], timeout=150)
    (epoch0, part1), state = two[0][0], two[0][1]
    assert all(result[1] == state for result in two)  # one global state, whichever rank saves it
    assert epoch0["len"] == 12 and [len(b) for b in epoch0["batches"]] == [4] * 4 + [6] * 4 + [3] * 3 + [2]
    seen0 = Counter(i for result in two for b in result[0][0]["batches"] for i in b)
    assert set(seen0) == set(range(101)) and sum(seen0.values()) == 102  # one padded repeat
    assert part1["len"] == 14 and [len(b) for b in part1["batches"]] == [3] * 5
    assert state["epoch"] == 1 and state["consumed"] == 30

    three = run_distributed(_epochs_in_lockstep, 3, state, [(1, None), (2, None)], timeout=150)
    rest1 = [result[0][0]["batches"] for result in three]
    assert len({len(batches) for batches in rest1}) == 1
    # from sample 131 (= 101 + 30): size 3 for steps starting before 150 (131, 140, 149), then 5
    assert [len(b) for b in rest1[0]] == [3, 3, 3, 5, 5, 5]
    epoch1 = Counter(i for result in two for b in result[0][1]["batches"] for i in b)
    epoch1.update(i for batches in rest1 for b in batches for i in b)
    assert set(epoch1) == set(range(101)) and sum(epoch1.values()) - 101 < 3
    epoch2 = Counter(i for result in three for b in result[0][1]["batches"] for i in b)
    assert set(epoch2) == set(range(101)) and sum(epoch2.values()) - 101 < 3
    assert {result[0][1]["len"] for result in three} == {len(three[0][0][1]["batches"])}


# -- schedules in batch samplers with their own plan (per-epoch sizes) ----------------------------------
def test_two_stream_sizes_follow_a_per_epoch_schedule() -> None:
    """TwoStream: by_epoch sizes set each epoch's len and batch sizes, equal on ranks; primaries disjoint."""
    from shardwise import TwoStreamBatchSampler

    samplers = [
        TwoStreamBatchSampler(range(24), range(100, 130), primary_batch_size=BatchSizeSchedule.by_epoch({0: 4, 1: 2}),
                              secondary_batch_size=BatchSizeSchedule.by_epoch({0: 1, 2: 3}), num_replicas=2, rank=r)
        for r in range(2)
    ]  # fmt: skip
    for primary, secondary in [(4, 1), (2, 1), (2, 3)]:
        assert {len(s) for s in samplers} == {24 // primary // 2}
        assert {s.batch_size for s in samplers} == {primary + secondary}
        batches = [list(s) for s in samplers]
        assert {len(b) for rank in batches for b in rank} == {primary + secondary}
        assert sorted(i for rank in batches for b in rank for i in b[:primary]) == list(range(24))


def test_bucket_budget_or_size_follows_a_per_epoch_schedule() -> None:
    """Bucket: a by_epoch max_tokens or batch_size applies from its epoch on, on every rank alike."""
    import numpy as np

    from shardwise import BucketBatchSampler

    lengths = np.arange(200) * 7 % 49 + 1
    budget = BatchSizeSchedule.by_epoch({0: 400, 1: 200})
    samplers = [BucketBatchSampler(lengths, max_tokens=budget, num_replicas=2, rank=r) for r in range(2)]
    for limit in (400, 200):
        lens = {len(s) for s in samplers}
        batches = [list(s) for s in samplers]
        assert lens == {len(b) for b in batches}
        costs = [len(b) * int(lengths[b].max()) for rank in batches for b in rank]
        assert max(costs) <= limit < 2 * max(costs)
    sized = BucketBatchSampler(lengths, batch_size=BatchSizeSchedule.by_epoch({0: 8, 2: 4}), num_replicas=2, rank=0)
    assert (sized.batch_size, len(sized)) == (8, 13)
    sized.set_epoch(2)
    assert (sized.batch_size, len(sized)) == (4, 25)


def test_batch_samplers_refuse_mid_epoch_and_payload_schedules() -> None:
    """A schedule that changes inside an epoch, or carries payloads, is refused naming the argument."""
    import numpy as np

    from shardwise import BucketBatchSampler, TwoStreamBatchSampler

    with pytest.raises(ValueError, match="TwoStreamBatchSampler changes primary_batch_size at epoch starts only"):
        TwoStreamBatchSampler(range(24), range(30, 40), primary_batch_size=BatchSizeSchedule.by_samples({0: 4, 10: 2}),
                              secondary_batch_size=1)  # fmt: skip
    with pytest.raises(ValueError, match="BucketBatchSampler changes max_tokens at epoch starts only"):
        BucketBatchSampler(np.ones(20, dtype=int), max_tokens=BatchSizeSchedule(lambda epoch, samples: 8))
    with pytest.raises(ValueError, match="BucketBatchSampler takes no payloads"):
        BucketBatchSampler(np.ones(20, dtype=int), batch_size=BatchSizeSchedule.by_epoch({0: (4, "p")}))
    aligned = BatchSizeSchedule.by_samples({0: 4, 48: 2})  # sample 48 starts epoch 2 of 24 primaries
    assert TwoStreamBatchSampler(range(24), range(30, 40), primary_batch_size=aligned, secondary_batch_size=1)
    with pytest.raises(ValueError, match="its schedule gives 30 at epoch 3"):
        TwoStreamBatchSampler(range(24), range(30, 40), primary_batch_size=BatchSizeSchedule.by_epoch({0: 4, 3: 30}),
                              secondary_batch_size=1)  # fmt: skip
    with pytest.raises(ValueError, match="longer than max_tokens=5"):  # the smallest budget of any epoch
        BucketBatchSampler(np.arange(1, 9), max_tokens=BatchSizeSchedule.by_epoch({0: 64, 4: 5}))


def test_a_batch_sampler_state_names_its_schedule() -> None:
    """A state saved under one schedule is refused under another (its batch plan differs), naming it."""
    import numpy as np

    from shardwise import BucketBatchSampler

    lengths = np.arange(1, 60)
    saved = BucketBatchSampler(lengths, batch_size=BatchSizeSchedule.by_epoch({0: 8, 2: 4})).state_dict()
    with pytest.raises(StateMismatchError, match="batch_size_schedule"):
        BucketBatchSampler(lengths, batch_size=BatchSizeSchedule.by_epoch({0: 8, 3: 4})).load_state_dict(saved)
    same = BucketBatchSampler(lengths, batch_size=BatchSizeSchedule.by_epoch({0: 8, 2: 4}))
    same.load_state_dict(saved)


def test_class_balanced_classes_per_batch_follows_a_per_epoch_schedule() -> None:
    """ClassBalanced: a by_epoch classes_per_batch sets each epoch's P; too many classes are refused."""
    import numpy as np

    from shardwise import ClassBalancedBatchSampler

    labels = np.arange(120) % 6
    schedule = BatchSizeSchedule.by_epoch({0: 2, 1: 4})
    samplers = [
        ClassBalancedBatchSampler(labels, classes_per_batch=schedule, samples_per_class=3, num_replicas=2, rank=r)
        for r in range(2)
    ]
    for classes in (2, 4):
        assert {s.batch_size for s in samplers} == {classes * 3}
        batches = [list(s) for s in samplers]
        assert len(batches[0]) == len(batches[1]) == 120 // (classes * 3) // 2
        assert {len(set(labels[b].tolist())) for rank in batches for b in rank} == {classes}
    with pytest.raises(ValueError, match="its schedule gives 7 at epoch 2"):
        ClassBalancedBatchSampler(
            labels, classes_per_batch=BatchSizeSchedule.by_epoch({0: 2, 2: 7}), samples_per_class=3
        )
