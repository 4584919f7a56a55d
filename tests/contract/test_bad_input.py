"""Bad input fails at construction (or load_state_dict) with an error naming the parameter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from shardwise import (
    MalformedStateError,
    ShardedSampler,
    StateMismatchError,
    TwoStreamBatchSampler,
    WeightedSampler,
    pad_collate,
    shard,
    shard_batches,
)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dataset": -1}, ValueError, r"dataset should be a non-negative integer, but got dataset=-1"),
        ({"dataset": 2.5}, TypeError, r"dataset should be a sized dataset or an int length, but got dataset=2.5"),
        ({"dataset": True}, TypeError, r"dataset should be a sized dataset or an int length, but got dataset=True"),
        ({"dataset": 2**63}, ValueError, r"dataset should be an integer <= 4611686018427387904"),
        ({"dataset": 10, "num_replicas": 0}, ValueError, r"num_replicas should be a positive integer, but got num_replicas=0"),
        ({"dataset": 10, "num_replicas": True}, TypeError, r"num_replicas should be an integer, but got num_replicas=True"),
        ({"dataset": 10, "num_replicas": 2, "rank": 2}, ValueError, r"rank should be in the interval \[0, 1\] for num_replicas=2, but got rank=2"),
        ({"dataset": 10, "rank": -1}, ValueError, r"rank should be a non-negative integer, but got rank=-1"),
        ({"dataset": 10, "rank": 1.0}, TypeError, r"rank should be an integer, but got rank=1.0"),
        ({"dataset": 10, "seed": -3}, ValueError, r"seed should be a non-negative integer, but got seed=-3"),
        ({"dataset": 10, "seed": "7"}, TypeError, r"seed should be an integer, but got seed='7'"),
        ({"dataset": 10, "shuffle": 1}, TypeError, r"shuffle should be True or False, but got shuffle=1"),
        ({"dataset": 10, "drop_last": None}, TypeError, r"drop_last should be True or False, but got drop_last=None"),
        # torch's DistributedSampler positional order (NOTE [ Drop-in signature ]), and its "Invalid rank" wording
        ({"dataset": 10, "args": (3, 3)}, ValueError, r"Invalid rank: rank should be in the interval \[0, 2\] for num_replicas=3"),
        ({"dataset": 10, "args": (3, -1)}, ValueError, r"Invalid rank: rank should be a non-negative integer, but got rank=-1"),
        ({"dataset": 10, "args": (2, 0, True, 0, False, 1)}, TypeError, r"ShardedSampler\(\) takes at most 6 positional arguments \(dataset, num_replicas, rank, shuffle, seed, drop_last\), but got 7"),
        ({"dataset": 10, "args": (2,), "num_replicas": 2}, TypeError, r"ShardedSampler\(\) got multiple values for argument 'num_replicas'"),
        ({"dataset": 10, "args": (2, 0, "no")}, TypeError, r"shuffle should be True or False, but got shuffle='no'"),
        ({"dataset": 10, "args": (2, 0, True, -1)}, ValueError, r"seed should be a non-negative integer, but got seed=-1"),
    ],
)
def test_sharded_sampler_rejects_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    """Each bad ShardedSampler argument raises at construction, naming parameter, value and what is accepted."""
    dataset = kwargs.pop("dataset")
    args = kwargs.pop("args", ())
    with pytest.raises(error, match=match):
        ShardedSampler(dataset, *args, **kwargs)


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("drop_last", 1, TypeError, r"drop_last should be True or False, but got drop_last=1"),
        ("dataset", 2.5, TypeError, r"dataset should be a sized dataset or an int length, but got dataset=2.5"),
        ("num_samples", -1, ValueError, r"num_samples should be a non-negative integer, but got num_samples=-1"),
        ("total_size", "8", TypeError, r"total_size should be an integer, but got total_size='8'"),
    ],
)
def test_sharded_sampler_rejects_bad_assignments(name: str, value: object, error: type, match: str) -> None:
    """torch's attributes assigned after construction are checked as the constructor's arguments are."""
    with pytest.raises(error, match=match):
        setattr(ShardedSampler(10, num_replicas=2, rank=0), name, value)


def test_numpy_integers_are_accepted_as_sizes() -> None:
    """np.int64 sizes and ranks are integers too."""
    assert len(ShardedSampler(np.int64(10), num_replicas=np.int32(2), rank=np.int64(1))) == 5


def test_even_must_be_one_of_its_enum_values() -> None:
    """even= accepts 'pad' or 'drop' (built from the Enum) and names both otherwise."""
    with pytest.raises(ValueError, match=r"even should be one of 'pad', 'drop', but got even='wrap'"):
        shard(SequentialSampler(range(4)), even="wrap")


def test_inconsistent_launcher_environment_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK outside [0, WORLD_SIZE) is an error naming the source, raised when iterating."""
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"rank should be in the interval \[0, 3\] for world_size=4, but torchrun"):
        len(ShardedSampler(10))
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match=r"environment variable RANK should be an integer, but got RANK='x'"):
        len(ShardedSampler(10))


def test_negative_or_non_integer_epoch_is_rejected() -> None:
    """set_epoch takes a non-negative int."""
    sampler = ShardedSampler(10)
    with pytest.raises(ValueError, match=r"epoch should be a non-negative integer, but got epoch=-1"):
        sampler.set_epoch(-1)
    with pytest.raises(TypeError, match=r"epoch should be an integer, but got epoch=1.5"):
        sampler.set_epoch(1.5)


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (lambda: ShardedSampler(999, seed=1), r"state was saved for num_samples=1000, but this sampler has num_samples=999"),
        (lambda: ShardedSampler(1000, seed=2), r"state was saved for seed=1, but this sampler has seed=2"),
        (lambda: ShardedSampler(1000, seed=1, shuffle=False), r"state was saved for shuffle=True, but this sampler has shuffle=False"),
        (lambda: shard(SequentialSampler(range(1000)), seed=1), r"state was saved for kind='ShardedSampler', but this sampler has kind='ShardedWrapper'"),
    ],
)
def test_state_from_another_configuration_names_the_field(other, match: str) -> None:
    """A state from another n, seed, shuffle or sampler kind is refused, naming what differs."""
    state = ShardedSampler(1000, seed=1).state_dict()
    with pytest.raises(StateMismatchError, match=match):
        other().load_state_dict(state)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda s: [1, 2], r"state should be a dict from state_dict\(\), but got list"),
        (lambda s: {k: v for k, v in s.items() if k != "consumed"}, r"state is missing 'consumed'"),
        (lambda s: {**s, "version": 99}, r"state has version=99, but this release of shardwise reads version=1"),
        (lambda s: {**s, "consumed": -5}, r"state\['consumed'\] should be a non-negative integer, but got"),
        (lambda s: {**s, "epoch": "3"}, r"state\['epoch'\] should be an integer, but got"),
        (lambda s: {**s, "fingerprint": 7}, r"state\['fingerprint'\] should be a dict, but got int"),
    ],
)
def test_malformed_state_is_refused(mutate, match: str) -> None:
    """A malformed state raises MalformedStateError naming the key."""
    sampler = ShardedSampler(1000, seed=1)
    with pytest.raises(MalformedStateError, match=match):
        sampler.load_state_dict(mutate(sampler.state_dict()))


@pytest.mark.parametrize("bad", [42, "abc", None, object()])
def test_shard_rejects_what_is_not_a_sampler(bad: object) -> None:
    """shard() needs an iterable with an exact len()."""
    with pytest.raises(TypeError, match=r"sampler should be a torch Sampler \(or any iterable with __len__\)"):
        shard(bad)  # type: ignore[arg-type]


def test_shard_points_batch_samplers_to_shard_batches() -> None:
    """A BatchSampler's units are batches: shard() says to use shard_batches()."""
    with pytest.raises(TypeError, match=r"use shard_batches\(sampler\) instead"):
        shard(BatchSampler(SequentialSampler(range(4)), 2, False))  # type: ignore[arg-type]


def test_shard_refuses_an_already_distributed_sampler() -> None:
    """Wrapping a distributed sampler, directly or nested in a batch sampler, would deal twice."""
    with pytest.raises(TypeError, match=r"which deals by rank itself"):
        shard(ShardedSampler(10))
    with pytest.raises(TypeError, match=r"which deals by rank itself"):
        shard_batches(shard_batches(BatchSampler(SequentialSampler(range(4)), 2, False)))
    with pytest.raises(TypeError, match=r"got ShardedSampler inside BatchSampler, which deals by rank itself"):
        shard_batches(BatchSampler(ShardedSampler(16), 4, False))
    with pytest.raises(TypeError, match=r"got DistributedSampler inside BatchSampler"):
        shard_batches(BatchSampler(DistributedSampler(range(16), num_replicas=2, rank=0), 4, False))
    # Pinned to a single replica, the inner sampler is the whole plan: wrapping it is fine.
    assert len(shard_batches(BatchSampler(ShardedSampler(16, num_replicas=1, rank=0), 4, False), num_replicas=2, rank=0)) == 2


def test_tensors_that_require_grad_are_read_without_their_graph() -> None:
    """A CPU tensor with requires_grad=True is valid data (weights, lengths, indices, labels): read through detach()."""
    weights = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert len(WeightedSampler(weights, num_samples=6, num_replicas=1, rank=0)) == 6
    assert len(TwoStreamBatchSampler(torch.arange(4), torch.arange(4, 8), primary_batch_size=2, secondary_batch_size=1,
                                     num_replicas=1, rank=0)) == 2  # fmt: skip


def test_padding_value_is_never_wrapped_into_the_dtype() -> None:
    """-1 on uint8 is refused (it would pad with 255); a value the dtype holds pads exactly."""
    with pytest.raises(ValueError, match=r"padding_value should be a value that the batch's dtype torch.uint8 can hold \(a whole number in \[0, 255\]\), but got padding_value=-1"):
        pad_collate([np.zeros(2, np.uint8), np.zeros(1, np.uint8)], padding_value=-1)
    assert pad_collate([np.zeros(2, np.uint8), np.zeros(1, np.uint8)], padding_value=255).data[1, 1].item() == 255
    assert pad_collate([np.zeros(2, np.int8), np.zeros(1, np.int8)], padding_value=-128.0).data[1, 1].item() == -128
    assert math.isnan(pad_collate([np.zeros(2, np.float16), np.zeros(1, np.float16)], padding_value=math.nan).data[1, 1])
