"""Properties of the staggered-streams keyed permutation (``_core.streams``, NOTE [ Staggered streams ]).

That the plan is a bijection, inverted by ``positions_of``, and depends on the position only is tested
for both locality plans in test_locality.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.streams import StreamPermutation
from tests.core.test_locality import keys, shard_sizes


def live_shards(shards: np.ndarray) -> np.ndarray:
    """At each position, the shards between their first and last read (what a cache must hold)."""
    first = {int(s): i for i, s in reversed(list(enumerate(shards.tolist())))}
    last = {int(s): i for i, s in enumerate(shards.tolist())}
    events = np.zeros(len(shards) + 1, dtype=np.int64)
    for s, begin in first.items():
        events[begin] += 1
        events[last[s] + 1] -= 1
    return np.cumsum(events)[:-1]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_reads_about_streams_shards_at_a_time(k: int) -> None:
    """One shard a stream at a time: at most one more a stream where two meet inside a block, ``k + 1`` on average."""
    sizes = np.random.default_rng(k).integers(20, 400, size=60)
    perm = StreamPermutation(sizes, streams=k, key=11)
    live = live_shards(perm.shard_of(perm(np.arange(int(sizes.sum())))))
    assert live.max() <= 2 * k
    assert live.mean() <= k + 1


def test_one_stream_reads_shard_after_shard_in_the_shard_order() -> None:
    """streams=1 starts the shards in the epoch's shard order, two at once only where they meet in a block."""
    sizes = [50, 70, 30, 90]
    perm = StreamPermutation(sizes, streams=1, key=3)
    shards = perm.shard_of(perm(np.arange(240)))
    assert list(dict.fromkeys(shards.tolist())) == perm.shard_order().tolist()
    assert live_shards(shards).max() <= 2


@settings(max_examples=60, deadline=None)
@given(shard_sizes, st.integers(1, 6), keys, st.data())
def test_upcoming_shards_start_with_what_the_positions_read(sizes: list[int], k: int, key: int,
                                                             data: st.DataObject) -> None:
    """The prefetch list holds every shard a rank's positions read, then the next shard of each stream."""
    n = sum(sizes)
    perm = StreamPermutation(sizes, streams=k, key=key)
    world_size = data.draw(st.integers(1, 4))
    start = data.draw(st.integers(0, n - 1))
    positions = np.arange(start, n, world_size)[:8]
    upcoming = perm.upcoming_shards(positions, 1)
    read = set(perm.shard_of(perm(positions)).tolist())
    assert read <= set(upcoming.tolist())
    assert len(set(upcoming.tolist())) == len(upcoming)
    following = np.arange(positions[-1] + 1, n)
    if following.size:  # a shard read after these positions is prefetched too: each stream's next
        # (the first read may be another: shards smaller than a block are shuffled within it, plan 2)
        nxt = [s for s in perm.shard_of(perm(following)).tolist() if s not in read]
        if nxt:
            assert set(nxt) & set(upcoming.tolist())


def test_epochs_and_keys_differ_and_streams_beyond_the_shards_clamp() -> None:
    sizes = np.full(20, 10)
    a, b = StreamPermutation(sizes, streams=3, key=1), StreamPermutation(sizes, streams=3, key=2)
    assert a(np.arange(200)).tolist() != b(np.arange(200)).tolist()
    assert StreamPermutation(sizes, streams=50, key=1).streams == 20


def test_memory_is_independent_of_the_number_of_samples() -> None:
    """1e9 samples in 1e5 shards: the plan's arrays are O(shards), a few MB."""
    sizes = np.full(100_000, 10_000, dtype=np.int64)
    perm = StreamPermutation(sizes, streams=16, key=5)
    held = sum(getattr(perm, name).nbytes for name in ("_order", "_shard_starts", "_sm_starts"))
    assert held < 4 * 2**20
    positions = np.array([0, 123_456_789, 10**9 - 1])
    np.testing.assert_array_equal(perm.positions_of(perm(positions)), positions)


@pytest.mark.parametrize("streams", [0, -1, 1.5, "2"])
def test_bad_streams_is_named(streams: object) -> None:
    with pytest.raises((ValueError, TypeError), match="streams"):
        StreamPermutation([3, 4], streams=streams, key=1)  # type: ignore[arg-type]


def test_prefetch_skips_empty_shards_to_the_next_one_read() -> None:
    """An empty shard next in a stream is not "the next shard": the one after it, which holds samples, is prefetched.

    (Found by hypothesis: with sizes [0, 8, 4] and one stream, ahead=1 used to name only the empty shard.)
    """
    perm = StreamPermutation([0, 8, 4], streams=1, key=8)
    positions = np.arange(0, 8)
    read = set(perm.shard_of(perm(positions)).tolist())
    following = [s for s in perm.shard_of(perm(np.arange(8, 12))).tolist() if s not in read]
    assert following and following[0] in set(perm.upcoming_shards(positions, 1).tolist())
