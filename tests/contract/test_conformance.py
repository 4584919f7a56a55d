"""The conformance harness over every sampler in ``tests.conformance.CASES``."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from shardwise import Even
from tests.conformance import CASES, Case, dealt, key, plan_of, run_epoch
from tests.strategies import world_and_size

cases = pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])


def _even(sampler) -> Even:
    return sampler.even


@cases
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world_and_size())
def test_dealt_by_position_with_equal_lengths(case: Case, shape: tuple[int, int]) -> None:
    """Every rank yields len() units, the same number on all ranks: plan positions r, r+W, ... wrapped."""
    world_size, n = shape
    n = max(n, case.min_n)
    plan = plan_of(case, n)
    lengths = set()
    for rank in range(world_size):
        sampler = case.make(n, num_replicas=world_size, rank=rank, seed=0)
        expected_len = len(sampler)  # before iterating: afterwards len() describes the next epoch
        got = run_epoch(sampler)
        assert len(got) == expected_len
        lengths.add(len(got))
        assert got == dealt(plan, 0, rank, world_size, len(got), sampler.plan.wrap_period)
    assert len(lengths) == 1
    count = lengths.pop()
    if _even(case.make(n, num_replicas=world_size, rank=0)) is Even.PAD:
        assert count == -(-len(plan) // world_size)
    else:
        assert count == len(plan) // world_size


@cases
@settings(max_examples=25, deadline=None)
@given(world_and_size())
def test_disjoint_and_covering(case: Case, shape: tuple[int, int]) -> None:
    """One epoch over all ranks covers the plan; repeats are padding only (at most W-1 units)."""
    world_size, n = shape
    n = max(n, case.min_n)
    everything: Counter = Counter()
    for rank in range(world_size):
        everything.update(run_epoch(case.make(n, num_replicas=world_size, rank=rank, seed=5)))
    plan = Counter(plan_of(case, n, seed=5))
    expected = case.expected(n)
    if expected is not None:
        assert plan == expected
    even = _even(case.make(n, num_replicas=world_size, rank=0))
    repeats = everything - plan
    missing = plan - everything
    if even is Even.PAD:
        assert not missing
        assert sum(repeats.values()) <= world_size - 1
    else:
        assert not repeats
        assert sum(missing.values()) <= world_size - 1


@cases
def test_deterministic_for_same_seed_and_epoch(case: Case) -> None:
    """Fresh samplers with the same (config, seed, epoch) yield the same units; other seeds differ."""
    n = max(40, case.min_n)
    first = plan_of(case, n, seed=11, epoch=3)
    assert first == plan_of(case, n, seed=11, epoch=3)
    if case.shuffles:
        assert first != plan_of(case, n, seed=12, epoch=3)


@cases
def test_order_changes_between_epochs(case: Case) -> None:
    """set_epoch changes the order; without set_epoch the epoch advances after each full pass."""
    n = max(60, case.min_n)
    sampler = case.make(n, num_replicas=2, rank=1, seed=3)
    auto = [run_epoch(sampler) for _ in range(3)]
    explicit = []
    for epoch in range(3):
        fresh = case.make(n, num_replicas=2, rank=1, seed=3)
        fresh.set_epoch(epoch)
        explicit.append(run_epoch(fresh))
    assert auto == explicit
    if case.shuffles:
        assert auto[0] != auto[1] != auto[2]
    again = case.make(n, num_replicas=2, rank=1, seed=3)
    again.set_epoch(1)
    run_epoch(again)
    again.set_epoch(1)  # explicit set_epoch wins over auto-advance
    assert run_epoch(again) == explicit[1]


@cases
def test_resume_at_every_position_equals_uninterrupted(case: Case) -> None:
    """Stopping after k units, saving rank 0's state and resuming gives the uninterrupted sequence."""
    n, world_size, epoch = max(23, case.min_n), 3, 2
    uninterrupted = []
    for rank in range(world_size):
        sampler = case.make(n, num_replicas=world_size, rank=rank, seed=9)
        sampler.set_epoch(epoch)
        uninterrupted.append(run_epoch(sampler))
    count = len(uninterrupted[0])
    for stop in range(count + 1):
        states, heads = [], []
        for rank in range(world_size):
            sampler = case.make(n, num_replicas=world_size, rank=rank, seed=9)
            sampler.set_epoch(epoch)
            iterator = iter(sampler)
            heads.append([next(iterator) for _ in range(stop)])
            states.append(sampler.state_dict())
        assert all(state == states[0] for state in states)
        for rank in range(world_size):
            resumed = case.make(n, num_replicas=world_size, rank=rank, seed=9)
            resumed.load_state_dict(states[0])
            resumed.set_epoch(epoch)  # what a framework does after restoring: must keep the position
            tail = run_epoch(resumed)
            assert [*(run_epoch(heads[rank])), *tail] == uninterrupted[rank]


@cases
@pytest.mark.parametrize(("before", "after"), [(2, 3), (4, 1), (3, 2)])
def test_elastic_resume_loses_and_repeats_nothing(case: Case, before: int, after: int) -> None:
    """A state saved at world size W loads at W'; the union is one pass, repeats are padding only."""
    n = max(50, case.min_n)
    plan = plan_of(case, n, seed=4, epoch=1)
    steps = len(plan) // before // 2
    seen: list = []
    state = None
    for rank in range(before):
        sampler = case.make(n, num_replicas=before, rank=rank, seed=4)
        sampler.set_epoch(1)
        iterator = iter(sampler)
        seen += [key(next(iterator)) for _ in range(steps)]
        state = state or sampler.state_dict()
    for rank in range(after):
        resumed = case.make(n, num_replicas=after, rank=rank, seed=4)
        resumed.load_state_dict(state)
        seen += run_epoch(resumed)
    even = _even(case.make(n, num_replicas=after, rank=0))
    extra = Counter(seen) - Counter(plan)
    missing = Counter(plan) - Counter(seen)
    if even is Even.PAD:
        assert not missing
        assert sum(extra.values()) <= after - 1
    else:
        assert not extra
        assert sum(missing.values()) <= max(before, after) - 1


@cases
def test_a_sample_id_out_of_range_is_one_clear_error(case: Case) -> None:
    """``when`` and ``plan_positions_of`` of an id outside ``[0, id_count)`` raise naming ``index`` and the range.

    One rule for every sampler (no ``[]``, no answer about another sample, no IndexError); a
    ``shard()`` wrapper knows no ids and refuses ``when`` itself.
    """
    import shardwise

    n = max(20, case.min_n)
    sampler = case.make(n, num_replicas=2, rank=0, seed=1)
    batch_size = None if not isinstance(sampler, torch.utils.data.DistributedSampler) else 2
    count = sampler.plan.id_count
    if case.name.startswith("shard"):
        assert count is None
        with pytest.raises(shardwise.ProvenanceUnsupported):
            shardwise.when(sampler, 0, epochs=0, batch_size=batch_size)
        return
    assert isinstance(count, int) and count >= n
    assert isinstance(shardwise.when(sampler, count - 1, epochs=0, batch_size=batch_size), list)
    for bad in (count, count + 70_000, -1):
        wanted = rf"index should be a sample id in \[0, {count - 1}\] \({type(sampler).__name__} draws from {count}"
        with pytest.raises(ValueError, match=wanted + r".*but got index=" + str(bad)):
            shardwise.when(sampler, bad, epochs=[0, 1], batch_size=batch_size)
        with pytest.raises(ValueError, match=wanted):
            sampler.plan.positions_of(0, bad)


@cases
@pytest.mark.parametrize("set_epoch", [False, True], ids=["no-set_epoch", "set_epoch"])
def test_a_new_pass_after_a_partial_one_starts_the_epoch(case: Case, set_epoch: bool) -> None:
    """A pass broken off after k units (a loop's break, a sanity check) leaves the next pass the whole epoch, as torch."""
    n, epoch = max(30, case.min_n), 2
    whole = case.make(n, num_replicas=2, rank=1, seed=6)
    whole.set_epoch(epoch)
    expected, following = run_epoch(whole), run_epoch(whole)  # the epoch, then the one it advances to
    for stop in (1, len(expected) // 2):
        sampler = case.make(n, num_replicas=2, rank=1, seed=6)
        sampler.set_epoch(epoch)
        iterator = iter(sampler)
        head = [key(next(iterator)) for _ in range(stop)]
        assert head == expected[:stop]
        clone = pickle.loads(pickle.dumps(sampler))  # pickled mid-pass: no pass of its own yet
        if set_epoch:
            sampler.set_epoch(epoch)  # Lightning sets the epoch again before each validation run
            clone.set_epoch(epoch)
        assert run_epoch(sampler) == expected
        assert run_epoch(sampler) == following  # the complete pass advanced the epoch, as before
        assert run_epoch(clone) == expected


@cases
def test_load_state_dict_stops_a_running_iterator(case: Case) -> None:
    """A state loaded while an iterator runs: that iterator raises at its next unit; iterating again resumes."""
    n, epoch = max(30, case.min_n), 1
    saved = case.make(n, num_replicas=2, rank=0, seed=8)
    saved.set_epoch(epoch)
    expected = run_epoch(saved)
    saved.set_epoch(epoch)
    head = iter(saved)
    [next(head) for _ in range(2)]
    state = saved.state_dict()
    sampler = case.make(n, num_replicas=2, rank=0, seed=8)
    running = iter(sampler)
    next(running)
    sampler.load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"load_state_dict\(\) was called while this iterator was running.*iterate"):
        next(running)
    sampler.set_epoch(epoch)  # keeps the loaded position, as always
    assert run_epoch(sampler) == expected[2:]


@cases
def test_plan_pass_arithmetic_is_what_the_sampler_deals(case: Case) -> None:
    """``sampler.plan.pass_units`` / ``consumed_after`` (what the integrations count steps and positions with)
    equal ``len()``, the state after ``k`` units, and the length of a pass resumed at another world size."""
    n, world_size, epoch = max(23, case.min_n), 3, 2
    sampler = case.make(n, num_replicas=world_size, rank=0, seed=9)
    sampler.set_epoch(epoch)
    count = len(sampler)
    assert sampler.plan.pass_units(epoch, 0, world_size) == count
    for stop in sorted({0, 1, count // 2, count - 1, count} - {-1}):
        head = case.make(n, num_replicas=world_size, rank=0, seed=9)
        head.set_epoch(epoch)
        iterator = iter(head)
        for _ in range(stop):
            next(iterator)
        state = head.state_dict()
        assert head.plan.consumed_after(epoch, 0, world_size, stop) == state["consumed"], stop
        if stop == count:
            continue
        resumed = case.make(n, num_replicas=2, rank=1, seed=9)
        resumed.load_state_dict(state)
        assert resumed.plan.pass_units(epoch, state["consumed"], 2) == len(run_epoch(resumed)), stop
