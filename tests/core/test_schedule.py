"""BatchSizeSchedule: values, segments, the step plan it induces, and bad input."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise import BatchSizeSchedule
from shardwise._core.epoch_sizes import EpochSizes, check_per_epoch, epoch_value
from shardwise._core.schedule import as_schedule, plan_steps


def test_module_examples_run() -> None:
    """The Example sections of the schedule modules run as written."""
    from shardwise._core import schedule as _schedule
    from shardwise.samplers import scheduled as _scheduled

    for module in (_schedule, _scheduled):
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0, module.__name__


def test_by_epoch_holds_from_each_key() -> None:
    """by_epoch gives the size of the last key <= epoch, whatever the sample count."""
    schedule = BatchSizeSchedule.by_epoch({0: 256, 10: 128, 20: 64})
    assert [schedule(e, 10**9).batch_size for e in (0, 9, 10, 19, 20, 500)] == [256, 256, 128, 128, 64, 64]
    assert schedule.segment(3, 77) == (256, None, None)
    assert not schedule.has_payload


def test_by_samples_changes_at_thresholds() -> None:
    """by_samples switches at each threshold of run-wide samples and says when the next change is."""
    schedule = BatchSizeSchedule.by_samples({0: 32, 50_000: 64})
    assert schedule.segment(0, 0) == (32, None, 50_000)
    assert schedule.segment(7, 49_999) == (32, None, 50_000)
    assert schedule.segment(0, 50_000) == (64, None, None)


def test_payloads_travel_with_sizes() -> None:
    """(size, payload) entries give a payload per step."""
    schedule = BatchSizeSchedule.by_epoch({0: (256, {"size": 128}), 10: (128, {"size": 224})})
    assert schedule.has_payload
    assert schedule(12, 0) == (128, {"size": 224})
    assert BatchSizeSchedule.constant(4, payload="x")(5, 5) == (4, "x")


def test_ramp_matches_megatron_arithmetic() -> None:
    """ramp: start + increment * floor(samples * k / over_samples), end from over_samples on."""
    start, end, increment, over = 32, 256, 32, 1_000_000
    schedule = BatchSizeSchedule.ramp(start=start, end=end, increment=increment, over_samples=over)
    count = (end - start) // increment
    for samples in [0, 1, 142_856, 142_857, 142_858, 500_000, 999_999, 1_000_000, 5_000_000]:
        expected = end if samples >= over else start + increment * (samples * count // over)
        assert schedule(0, samples).batch_size == expected, samples
    assert "ramp(start=32, end=256, increment=32, over_samples=1000000)" in repr(schedule)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 50), st.integers(0, 6), st.integers(1, 9), st.integers(0, 300), st.integers(0, 400)
)  # fmt: skip
def test_ramp_segments_agree_with_values(start: int, count: int, increment: int, over: int, samples: int) -> None:
    """A ramp's segment end is the first sample count at which its value changes."""
    end = start + count * increment
    schedule = BatchSizeSchedule.ramp(start=start, end=end, increment=increment, over_samples=over)
    size, _, until = schedule.segment(0, samples)
    assert start <= size <= end
    if until is None:
        assert schedule(0, samples + 1000).batch_size == size
    else:
        assert until > samples
        assert schedule(0, until - 1).batch_size == size
        assert schedule(0, until).batch_size > size


def test_callable_schedule_is_checked_on_every_call() -> None:
    """A function schedule may return sizes or (size, payload) pairs, consistently, positive ints only."""
    schedule = BatchSizeSchedule(lambda epoch, samples: 4 if samples < 10 else 8)
    assert schedule(0, 9).batch_size == 4
    assert schedule(0, 10).batch_size == 8
    paired = BatchSizeSchedule(lambda epoch, samples: (2, epoch))
    assert paired(3, 0) == (2, 3)
    assert paired.has_payload
    with pytest.raises(TypeError, match=r"returned 2.5 \(float\) at epoch=0, samples=0"):
        BatchSizeSchedule(lambda epoch, samples: 2.5)(0, 0)
    with pytest.raises(ValueError, match="returned 0"):
        BatchSizeSchedule(lambda epoch, samples: 0)(0, 0)
    flip = BatchSizeSchedule(lambda epoch, samples: 2 if samples == 0 else (2, "p"))
    flip(0, 0)
    with pytest.raises(TypeError, match="return the same shape every time"):
        flip(0, 1)


def test_as_schedule_accepts_int_schedule_and_callable() -> None:
    """batch_size may be an int, a schedule or a callable; anything else names batch_size."""
    assert as_schedule(np.int64(3))(0, 0).batch_size == 3
    schedule = BatchSizeSchedule.by_epoch({0: 2})
    assert as_schedule(schedule) is schedule
    assert as_schedule(lambda e, s: 5)(1, 1).batch_size == 5
    with pytest.raises(TypeError, match="batch_size should be a positive int, a BatchSizeSchedule"):
        as_schedule("32")
    with pytest.raises(TypeError, match="batch_size should be an integer, but got batch_size=True"):
        as_schedule(True)
    with pytest.raises(ValueError, match="batch_size should be a positive integer, but got batch_size=0"):
        as_schedule(0)


@pytest.mark.parametrize(
    ("sizes", "error", "match"),
    [
        ({0: 0}, ValueError, r"sizes\[0\] should be a positive integer, but got sizes\[0\]=0"),
        ({0: -4}, ValueError, r"sizes\[0\] should be a positive integer"),
        ({0: 2.0}, TypeError, r"sizes\[0\] should be a positive int or a \(batch_size, payload\) pair"),
        ({0: (2, "a", "b")}, TypeError, r"sizes\[0\] should be a positive int or a \(batch_size, payload\) pair"),
        ({0: 8, 10: 4, 5: 2}, ValueError, "thresholds should be strictly increasing, but got 5 after 10"),
        ({0: 8, -1: 4}, ValueError, "sizes key should be a non-negative integer, but got sizes key=-1"),
        ({3: 8}, ValueError, "should start at .* 0"),
        ({}, TypeError, "sizes should be a non-empty mapping"),
        ([(0, 8)], TypeError, "sizes should be a non-empty mapping"),
        ({0: (8, "small"), 4: 2}, ValueError, "a payload for every entry or for none"),
        ({0: 8, True: 4}, TypeError, "sizes key should be an integer"),
    ],
)
@pytest.mark.parametrize("constructor", [BatchSizeSchedule.by_epoch, BatchSizeSchedule.by_samples])
def test_bad_mappings_fail_at_construction(constructor, sizes, error, match) -> None:
    """Non-positive sizes, unordered or negative thresholds and malformed entries raise naming sizes."""
    with pytest.raises(error, match=match):
        constructor(sizes)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"start": 0, "end": 8, "increment": 2, "over_samples": 10}, ValueError, "start should be a positive"),
        ({"start": 8, "end": 4, "increment": 2, "over_samples": 10}, ValueError, "end should be >= start=8"),
        ({"start": 4, "end": 9, "increment": 2, "over_samples": 10}, ValueError, "multiple of increment=2"),
        ({"start": 4, "end": 8, "increment": 0, "over_samples": 10}, ValueError, "increment should be a positive"),
        ({"start": 4, "end": 8, "increment": 2, "over_samples": -1}, ValueError, "over_samples should be a non-neg"),
        ({"start": 4, "end": 8, "increment": 2, "over_samples": 1.5}, TypeError, "over_samples should be an integer"),
    ],
)
def test_bad_ramps_fail_at_construction(kwargs, error, match) -> None:
    """A ramp with bad bounds, increment or length raises naming the parameter."""
    with pytest.raises(error, match=match):
        BatchSizeSchedule.ramp(**kwargs)


def test_non_callable_function_is_refused() -> None:
    """BatchSizeSchedule(x) needs a callable."""
    with pytest.raises(TypeError, match="function should be a callable"):
        BatchSizeSchedule(32)  # type: ignore[arg-type]


def _steps(schedule: BatchSizeSchedule, **kw: int | bool) -> list[tuple[int, int]]:
    """(start position, size) of every step."""
    world_size = int(kw["world_size"])
    return [
        (run.first + k * world_size * run.batch_size, run.batch_size)
        for run in plan_steps(schedule, **kw)  # type: ignore[arg-type]
        for k in range(run.steps)
    ]


schedules = st.one_of(
    st.builds(BatchSizeSchedule.constant, st.integers(1, 7)),
    st.dictionaries(st.integers(1, 90), st.integers(1, 7), max_size=4).map(
        lambda d: BatchSizeSchedule.by_samples({0: 3, **dict(sorted(d.items()))})
    ),
    st.just(BatchSizeSchedule(lambda epoch, samples: 1 + (samples // 7) % 5)),
)


@settings(max_examples=150, deadline=None)
@given(schedules, st.integers(0, 3), st.integers(0, 60), st.integers(1, 6), st.booleans(), st.data())
def test_plan_steps_tiles_the_epoch(schedule, epoch, total, world_size, drop_last, data) -> None:
    """Steps tile [start, total): each takes W * (its schedule value) positions; only the last is cut."""
    start = data.draw(st.integers(0, total))
    steps = _steps(schedule, epoch=epoch, total=total, start=start, world_size=world_size, drop_last=drop_last)
    position = start
    for k, (first, size) in enumerate(steps):
        assert first == position
        scheduled = schedule(epoch, epoch * total + first).batch_size
        if first + world_size * scheduled <= total:
            assert size == scheduled
        else:  # the short last step, cut to ceil(remaining / W) per rank
            assert not drop_last
            assert k == len(steps) - 1
            assert size == -(-(total - first) // world_size) <= scheduled
        position = first + world_size * size
    remaining = total - position
    if drop_last:
        assert 0 <= remaining < world_size * schedule(epoch, epoch * total + position).batch_size or total == start
    else:
        assert -world_size < remaining <= 0 or (total == start and not steps)


def test_per_epoch_schedules_are_told_apart() -> None:
    """Batch samplers with their own plan take constant, by_epoch and epoch-aligned sample schedules."""
    check_per_epoch(BatchSizeSchedule.constant(4), "batch_size", 10, "X")
    check_per_epoch(BatchSizeSchedule.by_epoch({0: 4, 3: 2}), "batch_size", 10, "X")
    aligned = BatchSizeSchedule.by_samples({0: 4, 20: 2})
    check_per_epoch(aligned, "batch_size", 10, "X")
    assert [epoch_value(aligned, e, 10).batch_size for e in range(4)] == [4, 4, 2, 2]
    with pytest.raises(ValueError, match=r"X changes max_tokens at epoch starts only.*samples \[25\]"):
        check_per_epoch(BatchSizeSchedule.by_samples({0: 4, 25: 2}), "max_tokens", 10, "X")
    with pytest.raises(ValueError, match="a function can change at any step"):
        check_per_epoch(BatchSizeSchedule(lambda e, s: 4), "batch_size", 10, "X")


def test_epoch_sizes_pass_ints_through_and_read_schedules_per_epoch() -> None:
    """EpochSizes: ints untouched, per-epoch schedules read at each epoch, payloads and mid-epoch refused."""
    sizes = EpochSizes("X", 10, a=4, b=BatchSizeSchedule.by_epoch({0: 3, 2: 5}))
    assert sizes
    assert not EpochSizes("X", 10, a=4)
    assert sizes.initial("a", 4) == 4 and sizes.initial("b", None) == 3
    assert [sizes.at("b", e, 0) for e in range(4)] == [3, 3, 5, 5]
    assert sizes.at("a", 7, 4) == 4
    assert sizes.epochs() == [0, 2]
    assert sizes.fingerprint() == {"b_schedule": "BatchSizeSchedule.by_epoch({0: 3, 2: 5})"}
    with pytest.raises(ValueError, match="X takes no payloads"):
        EpochSizes("X", 10, a=BatchSizeSchedule.by_epoch({0: (3, "p")}))
    with pytest.raises(ValueError, match="X changes a at epoch starts only"):
        EpochSizes("X", 10, a=BatchSizeSchedule.by_samples({0: 3, 5: 4}))
