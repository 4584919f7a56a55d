"""The shared constructor keywords (shardwise.samplers.keywords): checked once, even= a deprecated alias."""

from __future__ import annotations

import pytest
from torch.utils.data import BatchSampler, SequentialSampler

import shardwise
from shardwise import Even, MixtureSampler, ShardedSampler, TwoStreamBatchSampler, shard, shard_batches


def _mixture(**kw: object) -> MixtureSampler:
    return MixtureSampler([7, 4], [2, 1], num_samples=9, num_replicas=2, rank=1, seed=3, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("even", "drop_last"), [("drop", True), ("pad", False), (Even.DROP, True)])
def test_mixture_even_is_a_deprecated_alias_of_drop_last(even: object, drop_last: bool) -> None:
    """MixtureSampler(even=...) warns, naming drop_last, and builds exactly the drop_last sampler."""
    with pytest.warns(DeprecationWarning, match=rf"even=\.\.\.\) is deprecated.*drop_last={drop_last}") as caught:
        old = _mixture(even=even)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    new = _mixture(drop_last=drop_last)
    assert old.drop_last is new.drop_last is drop_last
    assert old.even is new.even
    assert list(old) == list(new) and len(old) == len(new)
    assert old.state_dict() == new.state_dict()


def test_shard_even_is_a_deprecated_alias_of_drop_last() -> None:
    """shard()/shard_batches()/the wrappers take drop_last; even= still works, with a DeprecationWarning."""
    new = shard(SequentialSampler(range(7)), num_replicas=2, rank=1, drop_last=True)
    with pytest.warns(DeprecationWarning, match="drop_last=True"):
        old = shard(SequentialSampler(range(7)), num_replicas=2, rank=1, even="drop")
    assert list(old) == list(new) == [1, 3, 5]
    assert new.drop_last and new.even is Even.DROP
    batches = BatchSampler(SequentialSampler(range(7)), 3, False)
    assert list(shard_batches(batches, num_replicas=2, rank=1, drop_last=True)) == [[3, 4, 5]]


@pytest.mark.parametrize("make", [lambda: _mixture(even="drop", drop_last=True), lambda: _mixture(even="pad", drop_last=False),
                                  lambda: shard(SequentialSampler(range(4)), even="pad", drop_last=False)])
def test_even_and_drop_last_together_is_an_error(make: object) -> None:
    """Passing drop_last and its deprecated alias even= is refused, even when they agree."""
    with pytest.raises(ValueError, match=r"got both drop_last=.* and even=.*deprecated alias; pass drop_last only"):
        make()  # type: ignore[operator]


def test_an_unknown_keyword_is_refused() -> None:
    """A misspelt shared keyword is a TypeError naming it (the keywords arrive as **options)."""
    with pytest.raises(TypeError, match=r"ShardedSampler\(\) got an unexpected keyword argument 'drop_lst'"):
        ShardedSampler(10, drop_lst=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"'cache_dir'"):
        ShardedSampler(10, cache_dir=None)  # type: ignore[call-arg]


def test_two_stream_keeps_its_documented_drop_last_default() -> None:
    """TwoStreamBatchSampler drops the short primary batch unless told otherwise (NOTE in its module)."""
    kept = TwoStreamBatchSampler(range(7), range(100, 104), primary_batch_size=2, secondary_batch_size=1,
                                 num_replicas=1, rank=0)
    assert kept.drop_last and len(kept) == 3
    assert len(TwoStreamBatchSampler(range(7), range(100, 104), primary_batch_size=2, secondary_batch_size=1,
                                     num_replicas=1, rank=0, drop_last=False)) == 4


def test_every_sampler_checks_its_shared_keywords_the_same_way() -> None:
    """The same bad drop_last gets the same message from every sampler: one check serves them all."""
    makers = [
        lambda: ShardedSampler(4, drop_last="no"),
        lambda: _mixture(drop_last="no"),
        lambda: shard(SequentialSampler(range(4)), drop_last="no"),
        lambda: shardwise.WeightedSampler([1.0, 2.0], num_samples=2, drop_last="no"),
        lambda: shardwise.LocalitySampler([2, 2], drop_last="no"),
    ]
    messages = set()
    for make in makers:
        with pytest.raises(TypeError) as error:
            make()
        messages.add(str(error.value))
    assert messages == {"drop_last should be True or False, but got drop_last='no'"}


def test_a_subclass_with_its_own_init_passes_the_keywords_on() -> None:
    """A user subclass whose __init__ calls super().__init__(..., seed=...) is checked by its base's keywords."""

    class FromSeed(ShardedSampler):
        def __init__(self, dataset: object, seed: int) -> None:
            super().__init__(dataset, seed=seed, num_replicas=2, rank=0)

    class TinyChunks(ShardedSampler):
        _CHUNK = 3

    import inspect

    assert list(inspect.signature(FromSeed).parameters) == ["dataset", "seed"]
    assert list(FromSeed(10, 4)) == list(ShardedSampler(10, seed=4, num_replicas=2, rank=0))
    assert list(TinyChunks(10, seed=4, num_replicas=2, rank=0)) == list(FromSeed(10, 4))
    with pytest.raises(TypeError, match="drop_lst"):
        TinyChunks(10, drop_lst=True)  # type: ignore[call-arg]
