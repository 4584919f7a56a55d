"""The keyed permutation of ``[0, n)``: bijective, deterministic, keyed, uniform, and strict on input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.permutation import MAX_SIZE, TABLE_MAX, Permutation
from tests.strategies import domain_sizes, seeds

EDGE_SIZES = sorted(
    {0, 1, 2, 3, 4, 5, 6, 7, 10, 100, 1000}
    | {2**k + d for k in range(1, 13) for d in (-1, 0, 1)}
    | {TABLE_MAX - 1, TABLE_MAX, TABLE_MAX + 1}
)

UNIFORMITY_KEYS = range(2000)
"""A fixed set of keys: the statistical tests are deterministic, their tolerances generous."""


def orders(n: int, *, table_max: int = TABLE_MAX, keys: range = UNIFORMITY_KEYS) -> np.ndarray:
    """``(len(keys), n)``: the whole permutation of ``[0, n)`` under each key."""
    positions = np.arange(n)
    return np.stack([Permutation(n, key, table_max=table_max)(positions) for key in keys])


def chi_square(counts: np.ndarray) -> float:
    """Pearson's statistic of ``counts`` against equal expected counts."""
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


# Upper 99.99% point of chi-square with 9 degrees of freedom is 33.7: 10 bins stay well below 45.
CHI2_9_LIMIT = 45.0


@pytest.mark.parametrize("table_max", [TABLE_MAX, 0], ids=["table", "feistel"])
@pytest.mark.parametrize("n", EDGE_SIZES)
def test_bijective_on_edge_sizes(n: int, table_max: int) -> None:
    """Every n around powers of two, on both paths, maps [0, n) onto [0, n) exactly once each."""
    indices = Permutation(n, 99, table_max=table_max)(np.arange(n))
    assert indices.dtype == np.int64
    assert indices.shape == (n,)
    assert np.array_equal(np.sort(indices), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(domain_sizes, seeds, st.booleans())
def test_bijective_for_any_size_and_key(n: int, key: int, feistel: bool) -> None:
    """Any size and any 64-bit key gives a bijection, on the table and the Feistel path alike."""
    indices = Permutation(n, key, table_max=0 if feistel else TABLE_MAX)(np.arange(n))
    assert np.array_equal(np.sort(indices), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=TABLE_MAX + 1, max_value=2**40), seeds, st.data())
def test_each_position_maps_alone_as_in_a_batch(n: int, key: int, data: st.DataObject) -> None:
    """An index depends on its position only, not on the other positions asked with it."""
    permutation = Permutation(n, key)
    positions = np.array(data.draw(st.lists(st.integers(min_value=0, max_value=n - 1), min_size=1, max_size=50)))
    together = permutation(positions)
    alone = np.concatenate([permutation(positions[i : i + 1]) for i in range(positions.size)])
    assert np.array_equal(together, alone)
    assert np.array_equal(permutation(positions[::-1]), together[::-1])


@pytest.mark.parametrize("n", [2**20 + 1, 10**10, 2**40 - 1, 2**40, 2**40 + 1, MAX_SIZE])
def test_huge_sizes_map_into_range_and_distinct_positions_to_distinct_indices(n: int) -> None:
    """Up to 2**62, a sample of positions lands in [0, n) and never collides."""
    rng = np.random.default_rng(n % 2**32)
    positions = np.unique(np.concatenate([rng.integers(0, n, size=20_000), [0, 1, n - 2, n - 1]]))
    indices = Permutation(n, 5)(positions)
    assert indices.min() >= 0
    assert indices.max() < n
    assert np.unique(indices).size == positions.size


@pytest.mark.parametrize("shape", [(2, 5), (3, 1, 4), ()])
@pytest.mark.parametrize("n", [1000, 10**6])
def test_keeps_the_shape_of_its_positions(n: int, shape: tuple[int, ...]) -> None:
    """Positions of any shape give int64 indices of that shape, element by element."""
    permutation = Permutation(n, 8)
    positions = np.arange(int(np.prod(shape))).reshape(shape)
    indices = permutation(positions)
    assert indices.shape == shape
    assert indices.dtype == np.int64
    assert np.array_equal(indices.ravel(), permutation(positions.ravel()))


@pytest.mark.parametrize("n", [3, 10, 1000, TABLE_MAX + 3, 10**9])
def test_different_keys_give_different_orders(n: int) -> None:
    """Twenty keys give twenty different orders (n = 3 has only 6: every one of them appears)."""
    head = np.arange(min(n, 64))
    seen = {tuple(Permutation(n, key)(head).tolist()) for key in range(20)}
    assert len(seen) == (6 if n == 3 else 20)


@pytest.mark.parametrize("n", [1, 50, TABLE_MAX + 1, 10**12])
def test_deterministic(n: int) -> None:
    """The same n and key give the same order, in a new object and in another call."""
    positions = np.arange(min(n, 5000))
    first = Permutation(n, 2**64 - 1)(positions)
    assert np.array_equal(first, Permutation(n, 2**64 - 1)(positions))
    assert np.array_equal(first, Permutation(n, 2**64 - 1)(positions))


def test_orders_are_pinned_across_releases() -> None:
    """The orders are part of the resume contract: a saved position must mean the same index later."""
    assert Permutation(10, 1234)(np.arange(10)).tolist() == [5, 6, 3, 9, 7, 4, 1, 2, 8, 0]
    assert Permutation(10**9, 1234)(np.arange(4)).tolist() == [763006526, 846889990, 86023984, 880133514]
    assert Permutation(2**40 + 1, 3)(np.array([0, 1])).tolist() == [426941309738, 379569083776]


@pytest.mark.parametrize("table_max", [TABLE_MAX, 0], ids=["table", "feistel"])
def test_position_of_an_index_is_uniform_over_keys(table_max: int) -> None:
    """Over 2000 keys, where an index lands and which index a position holds spread evenly (chi-square)."""
    n = 500
    permutations = orders(n, table_max=table_max)  # (keys, n)
    bins = np.arange(n) * 10 // n
    for index in (0, 1, 257, n - 1):
        landed = np.argmax(permutations == index, axis=1)
        assert chi_square(np.bincount(bins[landed], minlength=10)) < CHI2_9_LIMIT
    for position in (0, 1, 257, n - 1):
        assert chi_square(np.bincount(bins[permutations[:, position]], minlength=10)) < CHI2_9_LIMIT


@pytest.mark.parametrize("table_max", [TABLE_MAX, 0], ids=["table", "feistel"])
def test_fixed_points_and_pair_order_match_a_uniform_shuffle(table_max: int) -> None:
    """A uniform shuffle has one fixed point on average, and orders any two positions either way half the time."""
    n = 500
    permutations = orders(n, table_max=table_max)
    fixed = (permutations == np.arange(n)).sum(axis=1)
    assert 0.85 < fixed.mean() < 1.15  # each point is fixed with probability 1/n
    for a, b in [(0, 1), (1, 2), (10, 400)]:
        assert 0.45 < (permutations[:, a] < permutations[:, b]).mean() < 0.55


def test_huge_domains_are_uniform_over_keys() -> None:
    """At n = 1e9 + 7 (Feistel with cycle walking) the index at a position spreads evenly over deciles."""
    n = 10**9 + 7
    positions = np.array([0, 12_345, n - 1])
    indices = np.stack([Permutation(n, key)(positions) for key in UNIFORMITY_KEYS])  # (keys, 3)
    for column in indices.T:
        assert chi_square(np.bincount(column * 10 // n, minlength=10)) < CHI2_9_LIMIT
    # Neighbouring positions are unrelated: their indices fall in the same decile about a tenth of the time.
    assert 0.07 < np.mean(indices[:, 0] * 10 // n == indices[:, 1] * 10 // n) < 0.13


def test_repr_names_size_and_method() -> None:
    """repr says n and which path is used."""
    assert repr(Permutation(10, 1)) == "Permutation(n=10, method='table')"
    assert repr(Permutation(10, 1, table_max=0)) == "Permutation(n=10, method='feistel')"
    assert len(Permutation(10**10, 1)) == 10**10


def test_negative_size_is_refused() -> None:
    """n < 0 raises ValueError naming n."""
    with pytest.raises(ValueError, match=r"n should be a non-negative integer, but got n=-1"):
        Permutation(-1, 0)


def test_size_above_the_maximum_is_refused() -> None:
    """n > MAX_SIZE raises ValueError naming n and the maximum."""
    with pytest.raises(ValueError, match=rf"n should be an integer <= {MAX_SIZE}, but got n={MAX_SIZE + 1}"):
        Permutation(MAX_SIZE + 1, 0)


@pytest.mark.parametrize("n", [True, 3.0, "10", None])
def test_non_integer_size_is_refused(n: object) -> None:
    """bool, float, str or None as n raise TypeError naming n."""
    with pytest.raises(TypeError, match=r"n should be an integer, but got n="):
        Permutation(n, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "error", "message"),
    [
        (-1, ValueError, r"key should be a non-negative integer, but got key=-1"),
        (2**64, ValueError, rf"key should be an integer <= {2**64 - 1}, but got key={2**64}"),
        (1.5, TypeError, r"key should be an integer, but got key=1.5"),
        (False, TypeError, r"key should be an integer, but got key=False"),
        ("7", TypeError, r"key should be an integer, but got key='7'"),
    ],
)
def test_bad_key_is_refused(key: object, error: type[Exception], message: str) -> None:
    """A key outside [0, 2**64) or not an integer raises naming key."""
    with pytest.raises(error, match=message):
        Permutation(10, key)  # type: ignore[arg-type]
