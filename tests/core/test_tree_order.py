"""The keyed tree order within a group: a bijection, its inverse, balanced runs at every power of two."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.groups import group_keys
from shardwise._core.ordering import GroupShuffle, neighbour_shuffle
from shardwise._core.tree_order import tree_position, tree_rank


def _spearman(order: np.ndarray) -> float:
    return float(np.corrcoef(np.arange(order.size), np.argsort(np.argsort(order)))[0, 1])


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 200), key=st.integers(0, 2**64 - 1), first=st.integers(-1, 199))
def test_tree_rank_is_a_bijection_and_tree_position_its_inverse(size: int, key: int, first: int) -> None:
    """Every group size: the positions map onto the cost ranks one to one, and back; ``first`` comes first."""
    first = min(first, size - 1)
    positions = np.arange(size, dtype=np.int64)
    sizes, keys = np.full(size, size), group_keys(key, np.zeros(size, dtype=np.int64))
    firsts = np.full(size, first)
    ranks = tree_rank(positions, sizes, keys, firsts)
    assert sorted(ranks.tolist()) == positions.tolist()
    assert tree_position(ranks, sizes, keys, firsts).tolist() == positions.tolist()
    if first >= 0:
        assert ranks[0] == first


@pytest.mark.parametrize("block", [1, 2, 4, 8, 16, 32, 64])
def test_every_aligned_power_of_two_block_is_a_run_of_cost_neighbours(block: int) -> None:
    """The W batches of a step (W a power of two dividing the group) are W consecutive cost ranks."""
    for key in range(20):
        ranks = GroupShuffle(256, 64, key, within=True).cost_rank(np.arange(256))
        for step in ranks.reshape(-1, block):
            assert step.max() - step.min() == block - 1


def test_the_order_within_groups_changes_and_no_longer_ascends() -> None:
    """Within a group of 64 the cost is uncorrelated with the position on average (ascending: 1.0)."""
    orders = [GroupShuffle(64, 64, key, within=True).cost_rank(np.arange(64)) for key in range(200)]
    assert len({tuple(order.tolist()) for order in orders}) == 200
    assert abs(np.mean([_spearman(order) for order in orders])) < 0.1
    ascending = GroupShuffle(64, 64, 3).cost_rank(np.arange(64))
    assert ascending.tolist() == list(range(64))  # within=False: the order before (plan 1)


@pytest.mark.parametrize("count", [1, 25, 64, 100, 129])
def test_first_puts_that_batch_at_position_zero(count: int) -> None:
    """first: plan position 0 holds that cost rank, full group or short; a bijection with its inverse."""
    for key in range(10):
        for first in {0, count // 2, count - 1}:
            shuffle = GroupShuffle(count, 64, key, within=True, first=first)
            ranks = shuffle.cost_rank(np.arange(count))
            assert ranks[0] == first
            assert sorted(ranks.tolist()) == list(range(count))
            assert shuffle.plan_position(ranks).tolist() == list(range(count))
            if count >= 64:  # the full groups stay aligned: step blocks of 64 are runs of cost-neighbours
                for block in ranks[: count // 64 * 64].reshape(-1, 64):
                    assert block.max() - block.min() == 63 or count % 64
    with pytest.raises(ValueError, match="needs within=True"):
        GroupShuffle(10, 4, 1, first=3)


def test_neighbour_shuffle_moves_positions_less_than_a_window_and_inverts() -> None:
    """A bijection of the stream, each position within a window of its place; inverse undoes it."""
    n, window = 1000, 32
    for key in range(5):
        moved = neighbour_shuffle(np.arange(n), n, window, key)
        assert sorted(moved.tolist()) == list(range(n))
        assert np.abs(moved - np.arange(n)).max() < window
        assert neighbour_shuffle(moved, n, window, key, inverse=True).tolist() == list(range(n))
    assert not np.array_equal(neighbour_shuffle(np.arange(n), n, window, 1), neighbour_shuffle(np.arange(n), n, window, 2))
