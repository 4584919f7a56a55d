"""Properties of the locality-aware keyed permutation (``_core.locality``), and those both locality plans share."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.locality import LocalityPermutation
from shardwise._core.seeds import derive_seed
from shardwise._core.streams import StreamPermutation

shard_sizes = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=30).filter(lambda s: sum(s) > 0)
windows = st.integers(min_value=1, max_value=40)
keys = st.integers(min_value=0, max_value=2**64 - 1)


PLANS = {"windows": lambda sizes, window, key: LocalityPermutation(sizes, window=window, key=key),
         "streams": lambda sizes, window, key: StreamPermutation(sizes, streams=window, key=key)}


@pytest.mark.parametrize("mixing", sorted(PLANS))
@settings(max_examples=150, deadline=None)
@given(shard_sizes, windows, keys)
def test_is_a_permutation_and_positions_of_inverts_it(mixing: str, sizes: list[int], window: int, key: int) -> None:
    """Every global sample id appears exactly once in an epoch's plan, and ``positions_of`` finds where."""
    n = sum(sizes)
    perm = PLANS[mixing](sizes, window, key)
    ids = perm(np.arange(n))
    assert sorted(ids.tolist()) == list(range(n))
    np.testing.assert_array_equal(perm.positions_of(ids), np.arange(n))


@pytest.mark.parametrize("mixing", sorted(PLANS))
@settings(max_examples=100, deadline=None)
@given(shard_sizes, windows, keys, st.data())
def test_function_of_position_only(mixing: str, sizes: list[int], window: int, key: int, data: st.DataObject) -> None:
    """Ids depend only on (key, position): any subset, in any order, at any world size's stride, agrees."""
    n = sum(sizes)
    whole = PLANS[mixing](sizes, window, key)(np.arange(n))
    world_size = data.draw(st.integers(1, 8))
    fresh = PLANS[mixing](sizes, window, key)
    for rank in range(world_size):
        positions = np.arange(rank, n, world_size)[::-1]
        np.testing.assert_array_equal(fresh(positions), whole[positions])


@settings(max_examples=100, deadline=None)
@given(shard_sizes, st.integers(1, 5), keys)
def test_reads_window_shards_at_a_time(sizes: list[int], window: int, key: int) -> None:
    """The plan reads the shards of one window, then the next: never more than ``window`` shards at once."""
    perm = LocalityPermutation(sizes, window=window, key=key)
    n = sum(sizes)
    shards = perm.shard_of(perm(np.arange(n)))
    windows = perm.window_of(np.arange(n))
    assert np.all(np.diff(windows) >= 0)
    for w in np.unique(windows):
        read = set(shards[windows == w].tolist())
        assert read <= set(perm.window_shards(int(w)).tolist())
        assert len(read) <= window


def test_window_one_reads_shard_after_shard() -> None:
    """window=1 reads each shard whole before the next, in a shuffled shard order."""
    sizes = [5, 7, 3, 9]
    perm = LocalityPermutation(sizes, window=1, key=3)
    shards = perm.shard_of(perm(np.arange(24)))
    runs = [int(s) for i, s in enumerate(shards) if i == 0 or s != shards[i - 1]]
    assert runs == perm.shard_order().tolist()


def test_window_of_all_shards_is_uniform() -> None:
    """window >= number of shards: the first sample is uniform over all ids (chi-square over 4000 keys)."""
    sizes = [4, 1, 6, 3, 6]
    n = sum(sizes)
    counts = np.zeros(n)
    trials = 4000
    for k in range(trials):
        perm = LocalityPermutation(sizes, window=len(sizes), key=derive_seed(11, k))
        counts[perm(np.arange(1))[0]] += 1
    expected = trials / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45.3  # 99.99th percentile of chi-square with 19 degrees of freedom


def test_small_window_keeps_locality() -> None:
    """With 100 shards and window 4, almost no consecutive pair comes from shards of different windows."""
    sizes = np.full(100, 50)
    perm = LocalityPermutation(sizes, window=4, key=1)
    shards = perm.shard_of(perm(np.arange(5000)))
    assert len(np.unique(shards[:200])) == 4
    assert float(np.mean(shards[1:] == shards[:-1])) > 0.2


def test_epochs_differ() -> None:
    """Another key (epoch) gives another shard order and another order inside windows."""
    a = LocalityPermutation(np.full(20, 10), window=3, key=derive_seed(0, 0))
    b = LocalityPermutation(np.full(20, 10), window=3, key=derive_seed(0, 1))
    assert a.shard_order().tolist() != b.shard_order().tolist()
    assert a(np.arange(200)).tolist() != b(np.arange(200)).tolist()


def test_feistel_windows() -> None:
    """Windows above the materialised size (65,536) use the Feistel path and stay a permutation."""
    sizes = [40_000, 30_000, 1]
    perm = LocalityPermutation(sizes, window=2, key=5)
    ids = perm(np.arange(70_001))
    assert np.array_equal(np.sort(ids), np.arange(70_001))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sizes": [], "window": 1}, "sizes should hold at least one shard"),
        ({"sizes": [1, -1], "window": 1}, r"sizes should hold non-negative sample counts, but got sizes\[1\]=-1"),
        ({"sizes": [1.5], "window": 1}, "sizes should hold integer sample counts"),
        ({"sizes": [3], "window": 0}, "window should be a positive integer, but got window=0"),
    ],
)
def test_bad_input(kwargs: dict[str, object], match: str) -> None:
    """Bad sizes or window fail at construction, naming the parameter and the value."""
    with pytest.raises((ValueError, TypeError), match=match):
        LocalityPermutation(key=0, **kwargs)  # type: ignore[arg-type]


def test_docstring_examples_run() -> None:
    """The Example sections of the locality modules run as written."""
    import doctest

    from shardwise._core import locality
    from shardwise.samplers import locality as sampler_module

    for module in (locality, sampler_module):
        assert doctest.testmod(module).failed == 0, module.__name__
