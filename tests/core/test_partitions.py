"""Properties of the partitioned locality plan (``_core.partitions``, NOTE [ Shard partitions ])."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.locality import LocalityPermutation
from shardwise._core.partitions import PartitionedPermutation, PartitionLayout, partition_quotas

# Layouts with empty and one-sample shards among the others, and more partitions than shards.
shard_sizes = st.lists(st.sampled_from([0, 1, 1, 2, 3, 7, 19, 40]), min_size=1, max_size=25).filter(lambda s: sum(s) > 0)
partitions = st.integers(min_value=1, max_value=6)
groups = st.integers(min_value=1, max_value=4)
windows = st.integers(min_value=1, max_value=6)
keys = st.integers(min_value=0, max_value=2**64 - 1)


def _plan(sizes: list[int], p: int, g: int, window: int, key: int | None) -> PartitionedPermutation:
    layout = PartitionLayout(sizes, partitions=p, ranks_per_partition=g, key=11)
    return PartitionedPermutation(layout, window=window, key=key)


def _shards(sizes: list[int], ids: np.ndarray) -> np.ndarray:
    starts = np.cumsum(sizes)
    found: np.ndarray = np.searchsorted(starts, ids, side="right")
    return found


@settings(max_examples=200, deadline=None)
@given(shard_sizes, partitions, groups, windows, st.one_of(st.none(), keys))
def test_is_a_bijection_and_inverts(sizes: list[int], p: int, g: int, window: int, key: int | None) -> None:
    """Every sample id appears exactly once in an epoch's plan, and positions_of inverts it."""
    n = sum(sizes)
    perm = _plan(sizes, p, g, window, key)
    ids = perm(np.arange(n))
    assert sorted(ids.tolist()) == list(range(n))
    np.testing.assert_array_equal(perm.positions_of(ids), np.arange(n))


@settings(max_examples=100, deadline=None)
@given(shard_sizes, partitions, groups, windows, keys, st.integers(1, 9))
def test_independent_of_the_world_size(sizes: list[int], p: int, g: int, window: int, key: int, world: int) -> None:
    """Each rank's strided positions, asked in any order of a fresh plan, get the whole plan's ids."""
    n = sum(sizes)
    whole = _plan(sizes, p, g, window, key)(np.arange(n))
    fresh = _plan(sizes, p, g, window, key)
    for rank in range(world):
        positions = np.arange(rank, n, world)[::-1]
        np.testing.assert_array_equal(fresh(positions), whole[positions])


@settings(max_examples=150, deadline=None)
@given(shard_sizes, partitions, groups, windows, keys, st.integers(1, 3))
def test_rank_reads_only_its_partition(sizes: list[int], p: int, g: int, window: int, key: int, nodes: int) -> None:
    """When P*G divides W, rank r reads (and prefetches) only shards of partition (r // G) % P."""
    n = sum(sizes)
    perm = _plan(sizes, p, g, window, key)
    layout = perm._layout
    world = p * g * nodes
    for rank in range(world):
        positions = np.arange(rank, n, world)
        if positions.size == 0:
            continue
        mine = (rank // g) % p
        np.testing.assert_array_equal(perm.partition_of(positions), mine)
        first, stop = layout.partition_pieces(mine)
        allowed = set(layout.piece_shards[first:stop].tolist())
        read = set(_shards(sizes, perm(positions)).tolist())
        prefetched = set(perm.upcoming_shards(positions, 1).tolist())
        assert read <= prefetched <= allowed


@settings(max_examples=100, deadline=None)
@given(shard_sizes, partitions, groups)
def test_quotas_are_what_the_interleave_reads(sizes: list[int], p: int, g: int) -> None:
    """Partition k holds exactly the positions p with (p // G) % P == k: no tail, balanced within G."""
    n = sum(sizes)
    quotas = partition_quotas(n, p, g)
    counted = np.bincount((np.arange(n) // g) % p, minlength=p)
    np.testing.assert_array_equal(quotas, counted)
    assert quotas.max() - quotas.min() <= g


@given(keys)
@settings(max_examples=30, deadline=None)
def test_one_partition_splits_nothing(key: int) -> None:
    """One partition is the whole dataset in one stream: no shard is split."""
    sizes = [5, 0, 3, 9, 1]
    layout = PartitionLayout(sizes, partitions=1, ranks_per_partition=3, key=key)
    assert sorted(layout.piece_shards.tolist()) == [0, 2, 3, 4]


def test_balanced_layout_splits_few_small_shards() -> None:
    """37 uneven shards in 4 partitions: at most P-1 shards are split, and small ones."""
    sizes = np.random.default_rng(0).integers(1000, 6000, 37)
    layout = PartitionLayout(sizes, partitions=4, ranks_per_partition=2, key=1)
    split = len(layout.piece_shards) - 37
    assert split <= 3
    share = sizes.sum() * layout.quotas / layout.quotas.sum()
    assert (layout.shard_bytes(sizes) / share).max() <= 1.06  # bytes ~ samples here


def test_locality_inverse_and_upcoming() -> None:
    """LocalityPermutation.positions_of inverts it; upcoming_shards names this window and the next."""
    sizes = [4, 0, 6, 3, 5, 2]
    perm = LocalityPermutation(sizes, window=2, key=5)
    ids = perm(np.arange(20))
    np.testing.assert_array_equal(perm.positions_of(ids), np.arange(20))
    order = perm.shard_order()
    np.testing.assert_array_equal(perm.upcoming_shards(np.arange(0, 3), 1), order[:4])


@pytest.mark.parametrize(("name", "kwargs"), [("partitions", {"partitions": 0}),
                                              ("ranks_per_partition", {"ranks_per_partition": True})])
def test_bad_layout_arguments_name_the_parameter(name: str, kwargs: dict[str, object]) -> None:
    """A bad partitions or ranks_per_partition is an error naming it."""
    arguments: dict[str, object] = {"partitions": 2, "ranks_per_partition": 1, "key": 0, **kwargs}
    with pytest.raises((ValueError, TypeError), match=name):
        PartitionLayout([3, 4], **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(("p", "nodes"), [(4, 2), (4, 1), (6, 3), (6, 2)])
def test_fewer_nodes_than_partitions_read_their_share(p: int, nodes: int) -> None:
    """W = c nodes of G ranks with c dividing P: a node's ranks read exactly P / c partitions."""
    g, n = 2, 997
    perm = _plan([7, 1, 0, 30, 12, 9, 40, 3] * 4 + [n - 408], p, g, 3, 5)
    world = nodes * g
    for node in range(nodes):
        parts = {int(k) for rank in range(node * g, (node + 1) * g)
                 for k in perm.partition_of(np.arange(rank, n, world))}  # fmt: skip
        assert len(parts) == p // nodes
