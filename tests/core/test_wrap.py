"""The padding wrap (NOTE [ Padding wrap ] in ``shardwise._core.plan``) and its inverses."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.plan import Even, padded_positions, rank_count, rank_positions, wrap
from shardwise._core.provenance import run_occurrences, run_step_positions, unit_occurrences
from shardwise._core.schedule import BatchSizeSchedule, plan_steps


def test_period_total_is_the_plain_modulo() -> None:
    """period=None and period=total are p % total, for many random plans and positions."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        total = int(rng.integers(1, 60))
        positions = rng.integers(0, 4 * total + 5, size=int(rng.integers(1, 20)))
        expected = (positions % total).tolist()
        assert wrap(positions, total).tolist() == expected
        assert wrap(positions, total, total).tolist() == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 80), st.integers(1, 24), st.integers(0, 200))
def test_wrapped_is_p_s_slot_one_period_back_for_each_period_past(total: int, period: int, past: int) -> None:
    """p = total + d reads the (d // B + 1)-th latest position below total with q = p mod B (cycling through them
    once used up); if there is none, p % total."""
    p = total + past
    q = int(wrap(np.asarray([p]), total, period)[0])
    below = sorted((c for c in range(total) if c % period == p % period), reverse=True)
    if below:
        assert q == below[(past // period) % len(below)]
    else:
        assert q == p % total


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 80), st.integers(1, 24), st.integers(0, 80))
def test_padded_positions_read_distinct_units(total: int, period: int, count: int) -> None:
    """Up to total - B + 1 padded positions read as many distinct plan positions (with B = 1: the last ones, backwards)."""
    count = min(count, max(0, total - period + 1))
    read = wrap(np.arange(total, total + count), total, period).tolist()
    assert len(set(read)) == count
    if period == 1:
        assert read == list(range(total - 1, total - 1 - count, -1))


def test_positions_below_total_are_untouched_and_the_input_kept() -> None:
    """Only positions at or past total move; wrap never writes into its argument."""
    positions = np.asarray([0, 9, 10, 3, 13], dtype=np.int64)
    assert wrap(positions, 10, 4).tolist() == [0, 9, 6, 3, 9]
    assert positions.tolist() == [0, 9, 10, 3, 13]
    assert wrap(positions[:2], 10, 4) is not None and wrap(positions[:2], 10, 4).tolist() == [0, 9]


def test_a_plan_shorter_than_the_period_mixes_both_rules() -> None:
    """total=3, B=8: positions 8, 9, 10 have a congruent position below 3 (0, 1, 2); 3..7 fall back to p % 3."""
    assert wrap(np.arange(3, 11), 3, 8).tolist() == [0, 1, 2, 0, 1, 0, 1, 2]


def test_rank_positions_take_the_period() -> None:
    """The dealing wraps as wrap() does: B=4, W=4, 10 units: rank 2's padding re-reads its own slot, position 6."""
    assert rank_positions(0, 2, 4, 0, 3, 10, 4).tolist() == [2, 6, 6]
    assert rank_positions(0, 2, 4, 0, 3, 10).tolist() == [2, 6, 0]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.sampled_from([None, 1, 2, 3, 4, 6, 8, 16]), st.integers(0, 60), st.integers(0, 60),
       st.integers(0, 45))
def test_padded_positions_inverts_wrap(total: int, period: int | None, low: int, span: int, position: int) -> None:
    """The dealt positions in [low, high) reading plan position x are exactly those wrap() sends to x."""
    position %= total
    high = low + span
    dealt = np.arange(low, high, dtype=np.int64)
    expected = dealt[wrap(dealt, total, period) == position].tolist()
    assert padded_positions(position, total, period, low, high).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.integers(1, 12), st.integers(0, 29), st.sampled_from([None, 2, 4, 6]))
def test_unit_occurrences_are_every_dealing_of_a_position(total: int, world_size: int, start: int,
                                                          period: int | None) -> None:  # fmt: skip
    """(rank, unit) of each occurrence of every position, padding included, even a plan shorter than W."""
    start %= total
    count = rank_count(total, start, world_size, Even.PAD)
    dealt: dict[int, list[tuple[int, int]]] = {}
    for rank in range(world_size):
        for unit, p in enumerate(rank_positions(start, rank, world_size, 0, count, total, period).tolist()):
            dealt.setdefault(p, []).append((rank, unit))
    for position in range(total):
        found = unit_occurrences(position, start, world_size, count, total, period)
        assert sorted(found) == sorted(dealt.get(position, []))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.integers(1, 4), st.sampled_from([None, 2, 4]))
def test_run_occurrences_invert_the_step_dealing(total: int, world_size: int, size: int, period: int | None) -> None:
    """Step dealing (ScheduledBatchSampler): run_occurrences finds every (rank, step) run_step_positions reads."""
    runs = plan_steps(BatchSizeSchedule.constant(size), epoch=0, total=total, start=0, world_size=world_size,
                      drop_last=False)  # fmt: skip
    dealt: dict[int, list[tuple[int, int]]] = {}
    for step in range(sum(run.steps for run in runs)):
        for rank in range(world_size):
            for p in run_step_positions(runs, world_size, total, step, rank, period).tolist():
                dealt.setdefault(p, []).append((rank, step))
    assert set(dealt) == set(range(total))
    for position in range(total):
        assert sorted(run_occurrences(runs, world_size, total, position, period)) == sorted(dealt[position])
