"""ShardedSampler: torch compatibility, attributes, lazy resolution, pickling, repr."""

from __future__ import annotations

import inspect
import math
import pickle
import typing
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from shardwise import ShardedSampler


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=200),
    world_size=st.integers(min_value=1, max_value=9),
    data=st.data(),
    drop_last=st.booleans(),
)
def test_without_shuffle_equals_torch_distributed_sampler(n: int, world_size: int, data, drop_last: bool) -> None:
    """shuffle=False yields exactly torch's DistributedSampler indices and lengths."""
    rank = data.draw(st.integers(min_value=0, max_value=world_size - 1))
    ours = ShardedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last)
    theirs = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last)
    if n == 0 and not drop_last:
        assert len(ours) == len(theirs) == 0  # torch cannot iterate an empty dataset with padding
        assert list(ours) == []
        return
    assert list(ours) == list(theirs)
    assert (len(ours), ours.num_samples, ours.total_size) == (len(theirs), theirs.num_samples, theirs.total_size)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=0, max_value=500), world_size=st.integers(1, 9), drop_last=st.booleans())
def test_with_shuffle_lengths_match_torch(n: int, world_size: int, drop_last: bool) -> None:
    """shuffle=True keeps torch's per-rank lengths (a different, equally uniform order)."""
    ours = ShardedSampler(n, num_replicas=world_size, rank=0, drop_last=drop_last)
    theirs = DistributedSampler(range(n), num_replicas=world_size, rank=0, drop_last=drop_last)
    assert len(list(ours)) == len(ours) == len(theirs)


def test_is_a_distributed_sampler_with_torch_attributes() -> None:
    """Frameworks test isinstance(sampler, DistributedSampler) and read its attributes."""
    sampler = ShardedSampler(list(range(10)), num_replicas=4, rank=2, seed=3, drop_last=True)
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.seed, sampler.shuffle, sampler.drop_last) == (4, 2, 3, True, True)
    assert (sampler.num_samples, sampler.total_size, sampler.epoch) == (2, 8, 0)
    sampler.epoch = 5  # code that assigns DistributedSampler.epoch directly
    assert sampler.epoch == 5
    assert sampler.dataset == list(range(10))


def test_rank_and_world_size_resolve_lazily_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built before the launcher's variables are visible, the sampler reads them when iterated."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    sampler = ShardedSampler(12, shuffle=False)
    assert (sampler.rank, sampler.num_replicas) == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert list(sampler) == [2, 5, 8, 11]
    assert "rank=2, world_size=3" in repr(sampler)


def test_explicit_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """num_replicas/rank given to the constructor override torchrun's and SLURM's variables."""
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert (ShardedSampler(10, num_replicas=2, rank=1).world.rank, ShardedSampler(10).world.rank) == (1, 5)


def test_pickles_mid_epoch_with_its_state_and_its_next_pass_starts_the_epoch() -> None:
    """A sampler pickled mid-epoch carries its state, not its iterator: its next pass is the whole epoch, as torch's."""
    sampler = ShardedSampler(100, num_replicas=2, rank=0, seed=1)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(10)]
    clone = pickle.loads(pickle.dumps(sampler))
    whole = list(ShardedSampler(100, num_replicas=2, rank=0, seed=1))
    assert clone.state_dict() == sampler.state_dict()
    assert list(clone) == whole
    resumed = pickle.loads(pickle.dumps(sampler))
    resumed.load_state_dict(sampler.state_dict())  # resuming is loading the state
    assert head + list(resumed) == whole


def test_a_new_iter_after_a_partial_pass_starts_the_epoch_as_torch() -> None:
    """next(iter(s)); list(s) is the whole epoch, as with torch's DistributedSampler (issue 34, item 0)."""
    for cls in (ShardedSampler, DistributedSampler):
        sampler = cls(range(10), num_replicas=3, rank=0, shuffle=False)
        assert next(iter(sampler)) == 0
        assert list(sampler) == [0, 3, 6, 9], cls.__name__


def test_huge_dataset_sizes_without_materialising() -> None:
    """n = 10**12: length and first indices come at once, every index in range and distinct."""
    sampler = ShardedSampler(10**12, num_replicas=8, rank=3, seed=0)
    assert len(sampler) == 125_000_000_000
    iterator = iter(sampler)
    first = [next(iterator) for _ in range(1000)]
    assert all(0 <= i < 10**12 for i in first) and len(set(first)) == 1000


def test_repr_and_describe_show_configuration_and_resolution() -> None:
    """repr shows the configuration and resolved rank; describe() records the seed and its source."""
    sampler = ShardedSampler(7, num_replicas=2, rank=1, seed=9, shuffle=False)
    assert repr(sampler) == "ShardedSampler(n=7, shuffle=False, drop_last=False, even='pad', seed=9, rank=1, world_size=2)"
    described = sampler.describe()
    assert described["seed"] == 9 and described["seed_source"] == "argument" and described["world_source"] == "arguments"


def test_describe_says_when_the_seed_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """No seed passed: seed_source 'default' (it said 'argument'); passed, even as 0: 'argument'."""
    import shardwise

    monkeypatch.delenv("SHARDWISE_SEED", raising=False)
    assert ShardedSampler(7, num_replicas=1, rank=0).describe()["seed_source"] == "default"
    assert ShardedSampler(7, num_replicas=1, rank=0, seed=0).describe()["seed_source"] == "argument"
    described = shardwise.BucketBatchSampler([3, 1, 2], batch_size=2, num_replicas=1, rank=0).describe()
    assert (described["seed"], described["seed_source"]) == (0, "default")
    inner = ShardedSampler(8, num_replicas=1, rank=0, seed=4)
    scheduled = shardwise.ScheduledBatchSampler(inner, batch_size=2, num_replicas=1, rank=0).describe()
    assert (scheduled["seed"], scheduled["seed_source"]) == (4, "index sampler")


def test_seed_none_is_shared_by_every_rank_of_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """seed=None resolves from the job identity: equal on every rank, and saved in the state."""
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("SHARDWISE_SEED", raising=False)
    seeds = {ShardedSampler(10, seed=None, num_replicas=4, rank=r).seed for r in range(4)}
    assert len(seeds) == 1
    sampler = ShardedSampler(10, seed=None, num_replicas=4, rank=0)
    assert sampler.state_dict()["seed"] == seeds.pop()
    monkeypatch.setenv("SHARDWISE_SEED", "77")
    assert ShardedSampler(10, seed=None, num_replicas=4, rank=0).seed == 77


def test_seed_none_refused_when_ranks_could_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without any shared job identity, seed=None on several ranks fails with the fix in the message."""
    for name in ("SHARDWISE_SEED", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "LSB_JOBID",
                 "PBS_JOBID", "MASTER_ADDR", "MASTER_PORT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"seed=None cannot be resolved identically on all 2 ranks.*seed=<int>"):
        list(ShardedSampler(10, seed=None, num_replicas=2, rank=0))
    assert ShardedSampler(10, seed=None, num_replicas=1, rank=0).seed >= 0


def test_resumed_seed_none_sampler_takes_the_saved_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed=None sampler restored from a state continues with the seed the saved run used."""
    monkeypatch.setenv("SHARDWISE_SEED", "123")
    saved = ShardedSampler(50, seed=None, num_replicas=1, rank=0)
    iterator = iter(saved)
    [next(iterator) for _ in range(5)]
    state = saved.state_dict()
    monkeypatch.setenv("SHARDWISE_SEED", "999")
    resumed = ShardedSampler(50, seed=None, num_replicas=1, rank=0)
    resumed.load_state_dict(state)
    assert resumed.seed == 123
    assert list(resumed) == list(ShardedSampler(50, seed=123, num_replicas=1, rank=0))[5:]


# -- a drop-in DistributedSampler (issue 34, item 3): torch's own tests, with ShardedSampler in its place -------------
def test_torch_distributed_sampler_invalid_rank() -> None:
    """torch's test_distributed_sampler_invalid_rank: positional (dataset, num_replicas, rank), 'Invalid rank'."""
    dataset = torch.IntTensor(range(10))
    with pytest.raises(ValueError, match="Invalid rank"):
        ShardedSampler(dataset, 3, 3)
    with pytest.raises(ValueError, match="Invalid rank"):
        ShardedSampler(dataset, 3, -1)
    with pytest.raises(ValueError, match=r"Invalid rank.*rank should be in the interval \[0, 2\] for num_replicas=3"):
        ShardedSampler(dataset, num_replicas=3, rank=3)


def test_torch_duplicating_data_with_drop_last() -> None:
    """torch's test_duplicating_data_with_drop_last: no sample twice over ranks when the loader drops the short batch."""
    num_processes, num_batches = 4, 9
    data_set = torch.IntTensor(range(num_batches))
    scanned_data = torch.IntTensor([])
    for i in range(num_processes):
        s = ShardedSampler(data_set, num_processes, i)
        d_loader = DataLoader(data_set, batch_size=int(num_batches / num_processes), drop_last=True, sampler=s)
        for data in d_loader:
            scanned_data = torch.cat((scanned_data, data), 0)
    assert scanned_data.size() == scanned_data.unique().size()


def test_takes_distributed_samplers_positional_arguments_and_signature() -> None:
    """DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last): the same calls, the same signature."""
    args = (range(11), 3, 1, False, 5, True)
    assert list(ShardedSampler(*args)) == list(DistributedSampler(*args))
    by_keyword = ShardedSampler(range(11), num_replicas=3, rank=1, shuffle=True, seed=5, drop_last=True)
    assert ShardedSampler(range(11), 3, 1, True, 5, True).state_dict() == by_keyword.state_dict()
    ours, theirs = inspect.signature(ShardedSampler), inspect.signature(DistributedSampler)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
        (p.name, p.kind, p.default) for p in theirs.parameters.values()
    ]
    with pytest.raises(TypeError, match=r"ShardedSampler\(\) takes at most 6 positional arguments"):
        ShardedSampler(range(4), 2, 0, True, 0, False, "extra")
    with pytest.raises(TypeError, match=r"ShardedSampler\(\) got multiple values for argument 'rank'"):
        ShardedSampler(range(4), 2, 0, rank=1)
    with pytest.raises(TypeError, match=r"shuffle should be True or False"):
        ShardedSampler(range(4), 2, 0, "yes")


def test_drop_last_and_dataset_assigned_after_construction_take_effect() -> None:
    """torch reads drop_last and dataset when iterating: assigning them changes the next pass (not one under way)."""
    sampler = ShardedSampler(range(10), num_replicas=4, rank=3, shuffle=False)
    assert list(sampler) == [3, 7, 1]
    sampler.drop_last = True
    assert (list(sampler), len(sampler), sampler.num_samples, sampler.total_size) == ([3, 7], 2, 2, 8)
    sampler.dataset = range(13)
    assert sampler.dataset == range(13)
    assert list(sampler) == list(DistributedSampler(range(13), num_replicas=4, rank=3, shuffle=False, drop_last=True))
    sampler.shuffle = True
    assert sorted(sampler) != list(sampler) and len(list(sampler)) == 3
    iterator = iter(sampler)
    next(iterator)
    for name, value in (("drop_last", False), ("dataset", range(5))):
        with pytest.raises(RuntimeError, match=rf"{name} cannot change in the middle of an epoch; set it before"):
            setattr(sampler, name, value)
    with pytest.raises(TypeError, match=r"drop_last should be True or False"):
        ShardedSampler(4).drop_last = "no"
    with pytest.raises(TypeError, match=r"dataset should be a sized dataset"):
        ShardedSampler(4).dataset = object()


class _ElasticShardedSampler(ShardedSampler):
    """torch's ElasticDistributedSampler (torch.distributed.elastic.utils.data), line for line, on ShardedSampler."""

    def __init__(self, dataset, num_replicas=None, rank=None, start_index=0):  # type: ignore[no-untyped-def]
        super().__init__(dataset=dataset, num_replicas=num_replicas, rank=rank)
        self.start_index = start_index
        if start_index >= len(dataset):
            raise ValueError(f"Start index {start_index} should be less than dataset size {len(dataset)}")
        self.num_samples = int(math.ceil(float(len(dataset) - self.start_index) / self.num_replicas))  # noqa: RUF046
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):  # type: ignore[no-untyped-def]
        g = torch.Generator()
        g.manual_seed(self.epoch)
        indices = torch.randperm(len(self.dataset) - self.start_index, generator=g).add(self.start_index).tolist()
        indices += indices[: (self.total_size - len(indices))]
        assert len(indices) == self.total_size
        indices = indices[self.rank : self.total_size : self.num_replicas]
        assert len(indices) == self.num_samples
        return iter(indices)

    def __len__(self):  # type: ignore[no-untyped-def]
        return self.num_samples


def test_a_subclass_that_sets_num_samples_works_as_on_torchs_sampler() -> None:
    """torch's ElasticDistributedSampler assigns num_samples and total_size: on ShardedSampler it runs as on torch's."""
    from torch.distributed.elastic.utils.data import ElasticDistributedSampler

    for rank in range(3):
        ours = _ElasticShardedSampler(range(20), num_replicas=3, rank=rank, start_index=7)
        theirs = ElasticDistributedSampler(range(20), num_replicas=3, rank=rank, start_index=7)
        ours.set_epoch(2)
        theirs.set_epoch(2)
        facts = [(list(s), len(s), s.num_samples, s.total_size) for s in (ours, theirs)]
        assert facts[0] == facts[1]


def _own_order(base: type) -> type:
    """A subclass that yields its own indices and sets num_samples, keeping the base's __len__ (torch's reads it)."""

    class OwnOrder(base):  # type: ignore[valid-type, misc]
        def __init__(self, dataset: Any, **options: Any) -> None:
            super().__init__(dataset, **options)
            self.num_samples = 3
            self.total_size = 3 * self.num_replicas

        def __iter__(self) -> Any:
            return iter(range(self.rank, self.total_size, self.num_replicas))

    return OwnOrder


def test_a_subclass_with_its_own_iter_that_sets_num_samples_has_that_len_as_on_torchs() -> None:
    """len() returns an assigned num_samples where the subclass yields its own units (was the plan's 10: len and
    iteration disagreed), as torch's __len__ does."""
    for base in (ShardedSampler, DistributedSampler):
        sampler = _own_order(base)(range(20), num_replicas=2, rank=1)
        assert (len(sampler), list(sampler), sampler.num_samples, sampler.total_size) == (3, [1, 3, 5], 3, 6), base


def test_a_subclass_that_keeps_the_plan_and_sets_another_num_samples_is_refused_at_construction() -> None:
    """A num_samples/total_size that the plan does not deal is refused naming the fix (it was kept and len() ignored
    it); the value the plan deals is accepted and stays derived."""

    class Assigns(ShardedSampler):
        def __init__(self, dataset: Any, value: int, **options: Any) -> None:
            super().__init__(dataset, **options)
            self.num_samples = value

    class AssignsTotal(ShardedSampler):
        def __init__(self, dataset: Any, value: int, **options: Any) -> None:
            super().__init__(dataset, **options)
            self.total_size = value

    fix = r"override __iter__ \(and __len__\) in the subclass, as torchelastic's ElasticDistributedSampler does"
    with pytest.raises(ValueError, match=rf"num_samples should be what Assigns deals at world size 2 \(5: .*{fix}"):
        Assigns(range(10), 4, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=rf"total_size should be what AssignsTotal deals at world size 2 \(10: .*{fix}"):
        AssignsTotal(range(10), 8, num_replicas=2, rank=0)
    kept = Assigns(range(10), 5, num_replicas=2, rank=0)
    assert (len(kept), kept.num_samples, len(list(kept))) == (5, 5, 5)
    kept.num_replicas = 5  # derived: follows the world size
    assert (len(kept), kept.num_samples, kept.total_size) == (2, 2, 10)


def test_is_subscriptable_like_distributed_sampler() -> None:
    """ShardedSampler[int] works where DistributedSampler[int] does (annotations, subclassing)."""
    assert DistributedSampler[int] is not None
    alias = ShardedSampler[int]
    assert typing.get_origin(alias) is ShardedSampler and typing.get_args(alias) == (int,)

    class Mine(ShardedSampler[int]):
        pass

    assert list(Mine(range(4), num_replicas=2, rank=1, shuffle=False)) == [1, 3]
    assert list(alias(range(4), 2, 0, False)) == [0, 2]
