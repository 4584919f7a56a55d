"""``shardwise.set_epoch`` and the epoch contracts frameworks rely on (Lightning, Accelerate, Composer)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

import shardwise
from shardwise.samplers.base import PlanSampler
from shardwise.samplers.frameworks import EpochRelay, Keep


class EpochDataset(Dataset[int]):
    """A dataset that counts set_epoch calls."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(epoch)


def index_samplers() -> list[Any]:
    world = {"num_replicas": 2, "rank": 0}
    return [
        shardwise.ShardedSampler(16, **world),
        shardwise.shard(RandomSampler(range(16)), **world),
        shardwise.WeightedSampler(np.ones(16), num_samples=16, **world),
        shardwise.MixtureSampler([10, 6], [0.5, 0.5], num_samples=16, **world),
        shardwise.LocalitySampler([5, 3, 8], window=2, **world),
    ]


def batch_samplers() -> list[Any]:
    world = {"num_replicas": 2, "rank": 0}
    return [
        shardwise.shard_batches(BatchSampler(RandomSampler(range(16)), 2, False), **world),
        shardwise.TwoStreamBatchSampler(range(8), range(8, 16), primary_batch_size=2, secondary_batch_size=2, **world),
        shardwise.BucketBatchSampler(np.arange(1, 17), batch_size=2, **world),
        shardwise.ClassBalancedBatchSampler(np.arange(16) % 4, classes_per_batch=2, samples_per_class=2, **world),
        shardwise.ScheduledBatchSampler(16, batch_size=2, **world),
        shardwise.PackedBatchSampler(np.arange(1, 17), max_len=20, rows_per_batch=2, **world),
        shardwise.PackedMixtureSampler([np.arange(1, 9), np.arange(1, 9)], [1, 1], max_len=20, rows_per_batch=2, **world),
    ]


def test_set_epoch_reaches_sampler_batch_sampler_nested_and_dataset_once_each() -> None:
    """set_epoch reaches a loader's batch sampler, the sampler inside it and the dataset, each once."""
    data = EpochDataset(16)
    inner = shardwise.ShardedSampler(data, num_replicas=2, rank=0)
    loader = DataLoader(data, batch_sampler=BatchSampler(inner, 2, False))
    called = shardwise.set_epoch(loader, 4)
    assert inner.epoch == 4 and data.calls == [4]
    assert sorted(map(id, called)) == sorted([id(inner), id(data)])


@pytest.mark.parametrize("sampler", batch_samplers(), ids=lambda s: type(s).__name__)
def test_set_epoch_on_a_loader_reaches_a_shardwise_batch_sampler(sampler: Any) -> None:
    """A loader built with batch_sampler=<shardwise> gets its epoch set, once."""
    loader = DataLoader(EpochDataset(16), batch_sampler=sampler)
    called = shardwise.set_epoch(loader, 2)
    assert sampler.epoch == 2
    assert sum(o is sampler for o in called) == 1


@pytest.mark.parametrize("sampler", batch_samplers(), ids=lambda s: type(s).__name__)
def test_batch_sampler_dot_sampler_relays_the_epoch(sampler: Any) -> None:
    """loader.batch_sampler.sampler.set_epoch (what Lightning and Accelerate call) sets the batch sampler's epoch."""
    relay = sampler.sampler
    assert isinstance(relay, EpochRelay)
    relay.set_epoch(3)
    assert sampler.epoch == 3 == relay.epoch


@pytest.mark.parametrize("sampler", batch_samplers(), ids=lambda s: type(s).__name__)
def test_lightning_rebuild_of_a_batch_sampler_returns_the_same_object(sampler: Any) -> None:
    """Re-creating the batch sampler from its Lightning record (sampler slot replaced) is the identity."""
    args = getattr(sampler, "__pl_saved_args")
    names = getattr(sampler, "__pl_saved_arg_names")
    replaced = tuple(DistributedSampler(range(4), num_replicas=2, rank=0) if n == "sampler" else a
                     for a, n in zip(args, names, strict=True))  # fmt: skip
    assert type(sampler)(*replaced) is sampler
    assert isinstance(args[0], Keep)


@pytest.mark.parametrize("sampler", batch_samplers(), ids=lambda s: type(s).__name__)
def test_the_relay_reaches_the_batch_sampler_through_lightnings_predict_wrapper(sampler: Any) -> None:
    """Lightning's _IndexBatchSamplerWrapper (trainer.predict) copies the instance __dict__: its .sampler still relays."""
    from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper

    twin = copy.deepcopy(sampler)
    twin.set_epoch(2)
    wrapper = _IndexBatchSamplerWrapper(sampler)
    relay = getattr(wrapper, "sampler", None)  # what Lightning's _set_sampler_epoch reads (None before: no relay)
    assert isinstance(relay, EpochRelay)
    relay.set_epoch(2)
    assert sampler.epoch == 2
    assert [list(map(int, b)) for b in wrapper] == [list(map(int, b)) for b in twin]  # epoch 2's batches


@pytest.mark.parametrize("sampler", batch_samplers(), ids=lambda s: type(s).__name__)
def test_a_copy_of_a_batch_sampler_relays_to_itself(sampler: Any) -> None:
    """copy.copy, pickle and deepcopy copy the relay in __dict__; a copy's .sampler relays to the copy itself."""
    import pickle

    for made in (copy.copy(sampler), pickle.loads(pickle.dumps(sampler)), copy.deepcopy(sampler)):
        assert made.sampler.owner is made and sampler.sampler.owner is sampler
    made.sampler.set_epoch(4)  # the deep copy
    assert (made.epoch, sampler.epoch) == (4, 0)
    sampler.sampler = "mine"  # a value assigned on the instance is what .sampler reads
    assert sampler.sampler == "mine"
    del sampler.sampler
    assert isinstance(sampler.sampler, EpochRelay)


def test_a_rebuild_that_asks_drop_last_false_of_a_sampler_that_drops_says_so() -> None:
    """Lightning's predict rebuild injects drop_last=False: kept as built; a sampler built with drop_last=True warns."""
    import warnings

    def rebuild(sampler: Any) -> Any:
        names = getattr(sampler, "__pl_saved_arg_names")
        args = getattr(sampler, "__pl_saved_args")
        assert names == ("keep", "sampler", "drop_last") and args[2] is sampler.drop_last
        return type(sampler)(args[0], None, False)  # what _replace_value_in_saved_args makes of it

    padding = shardwise.BucketBatchSampler(np.arange(1, 17), batch_size=3, num_replicas=2, rank=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rebuild(padding) is padding  # drop_last=False: every sample is predicted, nothing to say
    dropping = shardwise.BucketBatchSampler(np.arange(1, 17), batch_size=3, drop_last=True, num_replicas=2, rank=0)
    with pytest.warns(UserWarning, match=r"was built with drop_last=True and is kept as built.*drop_last=False"):
        assert rebuild(dropping) is dropping


def composer_epoch_target(dataloader: DataLoader[Any]) -> Any:
    """Composer's rule (trainer.py ``_get_distributed_sampler``), restated: what gets ``set_epoch``."""
    if isinstance(dataloader.batch_sampler, DistributedSampler):
        return dataloader.batch_sampler
    if isinstance(dataloader.sampler, DistributedSampler):
        return dataloader.sampler
    return None


@pytest.mark.parametrize("sampler", index_samplers(), ids=lambda s: type(s).__name__)
def test_composer_contract_index_samplers_are_distributed_samplers(sampler: Any) -> None:
    """Composer sets the epoch of a DataLoader's DistributedSampler: shardwise index samplers are ones."""
    loader = DataLoader(range(16), sampler=sampler, batch_size=2)
    target = composer_epoch_target(loader)
    assert target is sampler
    target.set_epoch(5)  # what Composer does at each epoch start
    assert sampler.epoch == 5
    assert not hasattr(sampler, "__pl_saved_args")


@pytest.mark.parametrize("sampler", batch_samplers(), ids=lambda s: type(s).__name__)
def test_composer_contract_batch_samplers_need_shardwise_set_epoch(sampler: Any) -> None:
    """Composer does not reach a batch sampler (not a DistributedSampler); shardwise.set_epoch does."""
    loader = DataLoader(range(16), batch_sampler=sampler)
    assert composer_epoch_target(loader) is None
    shardwise.set_epoch(loader, 6)  # the line of the documented Composer callback
    assert sampler.epoch == 6


def test_every_exported_index_sampler_is_a_distributed_sampler() -> None:
    """Every public PlanSampler is a DistributedSampler (index) or yields whole batches (batch)."""
    index = {type(s) for s in index_samplers()}
    batch = {type(s) for s in batch_samplers()}
    for name in shardwise.__all__:
        obj = getattr(shardwise, name)
        if isinstance(obj, type) and issubclass(obj, PlanSampler):
            assert obj in index | batch, f"{name} is not covered by the framework contract tests"
            assert issubclass(obj, DistributedSampler) == (obj in index), name


def test_set_epoch_rejects_a_negative_epoch() -> None:
    """A negative epoch is refused, naming the parameter."""
    with pytest.raises(ValueError, match="epoch"):
        shardwise.set_epoch(DataLoader(range(4)), -1)


def test_one_walk_depth_one_reaches_exactly_the_given_objects_once_each() -> None:
    """``call_set_epoch`` (what verify's framework recipes use) at depth 1: the objects given, nothing nested."""
    from shardwise.samplers.set_epoch import call_set_epoch

    dataset = EpochDataset(8)
    inner = shardwise.ShardedSampler(dataset, num_replicas=2, rank=0)
    batches = shardwise.BucketBatchSampler(np.arange(1, 9), batch_size=2, num_replicas=2, rank=0)
    relay = batches.sampler  # an EpochRelay: stands for `batches`, which is then reached once
    called = call_set_epoch([None, batches, relay, inner], 3)
    assert called == [batches, inner]
    assert (batches.epoch, inner.epoch) == (3, 3)
    assert dataset.calls == []  # depth 1 does not walk into the sampler's dataset
    assert shardwise.set_epoch(inner, 4) == [inner, dataset]  # the public walk goes deeper


def test_verify_recipes_set_the_epoch_through_the_one_walk() -> None:
    """verify has no walk of its own: its recipes call samplers.set_epoch.call_set_epoch."""
    from shardwise.samplers import set_epoch as module
    from shardwise.tools.verify import recipes

    assert recipes.call_set_epoch is module.call_set_epoch
    sampler = shardwise.ShardedSampler(8, num_replicas=2, rank=0)
    recipes.set_epoch_everywhere({"loader.sampler": sampler, "loader.batch_sampler": None,
                                  "loader.batch_sampler.sampler": sampler}, 5)  # fmt: skip
    assert sampler.epoch == 5
