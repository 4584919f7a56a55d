"""shard()/shard_batches(): forked RNG, caller's RNG untouched, set_epoch forwarding, short samplers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler

from shardwise import shard, shard_batches
from tests.classic import TwoStreamBatchSampler


class GlobalRngSampler(Sampler[int]):
    """Draws from all three global RNGs, as careless user code does."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        order = np.random.permutation(self.n)
        random.shuffle(order)
        flips = torch.randint(0, 2, (self.n,))
        return iter([int(i) for i, f in zip(order, flips, strict=True) if f >= 0])

    def __len__(self) -> int:
        return self.n


class OwnGeneratorSampler(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n
        self.rng = np.random.default_rng()  # unseeded: differs per process

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class EpochAware(Sampler[int]):
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        return iter(range(6))

    def __len__(self) -> int:
        return 6


class Liar(Sampler[int]):
    """Says 10 but yields 7."""

    def __iter__(self):
        return iter(range(7))

    def __len__(self) -> int:
        return 10


def _ranks(make, world_size: int, *, scramble: bool) -> list[list]:
    out = []
    for rank in range(world_size):
        if scramble:  # each "rank" starts from a different global RNG state, as separate processes would
            random.seed(rank)
            np.random.seed(rank)
            torch.manual_seed(rank)
        out.append(list(make(rank)))
    return out


@pytest.mark.parametrize("inner", [GlobalRngSampler, OwnGeneratorSampler, lambda n: RandomSampler(range(n))])
def test_ranks_agree_on_the_inner_sequence_whatever_rng_it_uses(inner) -> None:
    """Ranks with different global RNG states still see one inner sequence: disjoint, covering."""
    shards = _ranks(lambda r: shard(inner(40), num_replicas=4, rank=r, seed=3), 4, scramble=True)
    flat = [i for s in shards for i in s]
    assert sorted(flat) == list(range(40))


def test_the_callers_rng_state_is_left_untouched() -> None:
    """Iterating a wrapper does not consume or reseed the caller's random/numpy/torch streams."""
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    list(shard(GlobalRngSampler(50), num_replicas=2, rank=0))
    list(shard_batches(TwoStreamBatchSampler(np.arange(10), np.arange(10, 30), 4, 2), num_replicas=2, rank=1))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_owned_generators_are_restored_after_each_chunk() -> None:
    """A generator the inner sampler owns continues its own stream for the caller."""
    inner = OwnGeneratorSampler(20)
    state = inner.rng.bit_generator.state
    list(shard(inner, num_replicas=2, rank=0))
    assert inner.rng.bit_generator.state == state


def test_set_epoch_is_forwarded_including_auto_advance() -> None:
    """The wrapped sampler hears every epoch: explicit set_epoch and the automatic advance."""
    inner = EpochAware()
    wrapper = shard(inner, num_replicas=2, rank=0)
    wrapper.set_epoch(4)
    list(wrapper)
    list(wrapper)
    assert inner.epochs == [4, 5]


def test_a_sampler_shorter_than_its_len_is_padded_with_a_warning() -> None:
    """Ranks stay in step when the inner sampler yields fewer units than len() says."""
    lengths = set()
    for rank in range(3):
        with pytest.warns(RuntimeWarning, match="fewer than its len"):
            units = list(shard(Liar(), num_replicas=3, rank=rank))
        lengths.add(len(units))
    assert lengths == {4}


def test_shard_batches_keeps_batches_whole_and_exposes_batch_size() -> None:
    """Batches are dealt whole; batch_size reads through to the wrapped batch sampler."""
    inner = BatchSampler(RandomSampler(range(24)), 4, drop_last=False)
    wrappers = [shard_batches(inner, num_replicas=2, rank=r, seed=1) for r in range(2)]
    assert wrappers[0].batch_size == 4 and wrappers[0].batch_sampler is inner
    batches = [b for w in wrappers for b in w]
    assert all(len(b) == 4 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(24))


def test_resume_of_a_wrapper_skips_without_replaying_to_the_caller() -> None:
    """Mid-epoch state of a wrapper resumes at the same unit, at another world size too."""
    make = lambda w, r: shard_batches(TwoStreamBatchSampler(np.arange(40), np.arange(40, 100), 4, 2),
                                      num_replicas=w, rank=r, seed=8)
    full = [list(make(1, 0))]
    first = make(2, 0)
    iterator = iter(first)
    head = [next(iterator) for _ in range(3)]
    state = first.state_dict()
    assert state["consumed"] == 6
    resumed = make(1, 0)  # another world size: the state is global
    resumed.load_state_dict(state)
    assert list(resumed) == full[0][6:]
    assert head == full[0][0:6:2]


def test_shard_batches_follows_the_wrapped_drop_last_unless_given() -> None:
    """BatchSampler(drop_last=True): the last partial step is dropped, not padded with repeated batches."""
    from torch.utils.data import SequentialSampler

    def ranks(inner_drop: bool, **options: bool) -> list[list[list[int]]]:
        inner = BatchSampler(SequentialSampler(range(7)), 2, inner_drop)  # [0, 1] [2, 3] [4, 5] ([6])
        return [list(shard_batches(inner, num_replicas=2, rank=r, **options)) for r in (0, 1)]

    assert ranks(True) == [[[0, 1]], [[2, 3]]]  # [4, 5] alone in the last step: dropped, nothing repeated
    assert shard_batches(BatchSampler(range(7), 2, True), num_replicas=2, rank=0).drop_last
    assert ranks(True, drop_last=False) == [[[0, 1], [4, 5]], [[2, 3], [0, 1]]]  # explicit: padded
    assert ranks(False) == [[[0, 1], [4, 5]], [[2, 3], [6]]]  # the plan of every earlier release


def test_even_batches_completes_a_short_batch_so_every_rank_has_one_shape() -> None:
    """even_batches=True: the short last batch is completed from the epoch's first indices; positions unchanged."""
    from torch.utils.data import SequentialSampler

    def ranks(world: int, even: bool) -> list[list[list[int]]]:
        out = []
        for rank in range(world):
            sampler = shard_batches(BatchSampler(SequentialSampler(range(7)), 3, False), num_replicas=world, rank=rank)
            sampler.even_batches = even
            out.append(list(sampler))
        return out

    assert ranks(2, True) == [[[0, 1, 2], [6, 0, 1]], [[3, 4, 5], [0, 1, 2]]]
    assert ranks(2, False) == [[[0, 1, 2], [6]], [[3, 4, 5], [0, 1, 2]]]
    assert ranks(1, True) == [[[0, 1, 2], [3, 4, 5], [6]]]  # one rank: nothing to even
    sampler = shard_batches(BatchSampler(SequentialSampler(range(7)), 3, False), num_replicas=2, rank=0)
    with pytest.raises(TypeError, match="even_batches should be True or False"):
        sampler.even_batches = 1  # type: ignore[assignment]
    varying = shard_batches([[0], [1, 2]], num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=r"even_batches=True needs the wrapped batch sampler's batch_size"):
        varying.even_batches = True
