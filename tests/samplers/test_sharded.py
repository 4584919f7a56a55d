"""ShardedSampler: torch compatibility, attributes, lazy resolution, pickling, repr."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

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
