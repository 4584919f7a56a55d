"""The skip ledger: skipped plan positions never train, at any world size and across restarts; all else once."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader, DistributedSampler

from shardwise import (
    MalformedStateError,
    MixtureSampler,
    ScheduledBatchSampler,
    ShardedSampler,
    StateMismatchError,
    rebase_state,
    skip_steps,
    when,
    which,
)
from shardwise._core.skips import SkipLedger
from tests.conformance import CASES, Case, key


def test_ledger_maps_compacted_positions_to_the_plan() -> None:
    """Overlapping and touching ranges merge; compacted positions skip them, in order, and map back."""
    ledger = SkipLedger().add(0, 5, 8).add(0, 2, 4).add(0, 4, 6).add(0, 20, 30).add(1, 0, 1)
    assert ledger.to_state() == [[0, 2, 8], [0, 20, 30], [1, 0, 1]]
    kept = [p for p in range(25) if not (2 <= p < 8 or 20 <= p < 30)]
    assert ledger.size(0, 25) == len(kept)
    assert ledger.to_plan(0, np.arange(len(kept)), 25).tolist() == kept
    assert [ledger.from_plan(0, p) for p in kept] == list(range(len(kept)))
    assert ledger.from_plan(0, 7) is None and ledger.from_plan(2, 7) == 7
    assert SkipLedger.from_state(ledger.to_state()).to_state() == ledger.to_state()


@pytest.mark.parametrize("bad", [[[0, 5, 3]], [[0, -1, 3]], [[0, 1]], "0,1,2", [[0, 1.5, 3]]])
def test_malformed_ledger_is_refused(bad: Any) -> None:
    """A ledger that is not rows of [epoch, first <= stop] of non-negative ints is a malformed state."""
    with pytest.raises(MalformedStateError, match=r"state\['skip'\]"):
        SkipLedger.from_state(bad)


def _units(sampler: Any, stop: int | None = None) -> list[Any]:
    out = []
    for unit in sampler:
        out.append(key(unit))
        if stop is not None and len(out) == stop:
            break
    return out


def _flat(units: list[Any], scheduled: bool) -> list[Any]:
    """A ScheduledBatchSampler's plan is of samples (its batches depend on W): compare samples."""
    return [i for unit in units for i in unit] if scheduled else units


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_skipped_never_train_and_the_rest_trains_once_across_a_resize(case: Case) -> None:
    """Skip two ranges at W=4, train 2 units a rank, resume at W=3: exactly the plan minus the skipped units."""
    n, epoch = max(60, case.min_n), 1
    probe = case.make(n, num_replicas=1, rank=0, seed=3)
    scheduled = isinstance(probe, ScheduledBatchSampler)
    total = probe._raw_plan_size(epoch)
    plan = [key(u) for u in probe._plan_units(epoch, np.arange(total), 1)]  # every position of the global plan
    if total < 12:
        pytest.skip("plan too short for two ranges")
    skips = [(total // 3, total // 3 + 3), (total - 4, total - 1)]
    skipped = Counter(plan[p] for first, stop in skips for p in range(first, stop))
    kept = Counter(plan) - skipped
    head: list[Any] = []
    state = None
    for rank in range(4):
        sampler = case.make(n, num_replicas=4, rank=rank, seed=3)
        sampler.set_epoch(epoch)
        for first, stop in skips:
            sampler.skip_positions(epoch, first, stop)
        head += _flat(_units(sampler, stop=2), scheduled)
        state = sampler.state_dict() if rank == 0 else state
    assert state is not None and len(state["skip"]) == 2
    tail: list[Any] = []
    lengths = set()
    for rank in range(3):
        resumed = case.make(n, num_replicas=3, rank=rank, seed=3)
        resumed.load_state_dict(json.loads(json.dumps(state)))  # the ledger survives JSON
        resumed.set_epoch(epoch)
        units = _units(resumed)
        lengths.add(len(units))
        tail += _flat(units, scheduled)
    assert len(lengths) == 1  # equal steps per rank after the resize
    trained = Counter(head + tail)
    assert not set(trained) & (set(skipped) - set(kept))  # a unit only at skipped positions never trains
    slack = 9 if scheduled else 2  # padding repeats, or drop cuts, less than one global step at W=3
    assert sum((trained - kept).values()) <= slack and sum((kept - trained).values()) <= slack
    assert trained - kept == Counter() or kept - trained == Counter()  # padding or dropping, never both


def test_ten_thousand_ranges_at_8_ranks_then_6_lose_and_repeat_nothing() -> None:
    """10^4 skipped ranges over 1e6 samples, W=8 then W=6: 0 lost, 0 repeated, 0 skipped trained, state < 1 MB."""
    n, epoch = 1_000_000, 0
    rng = np.random.default_rng(0)
    starts = np.sort(rng.choice(n // 50, 10_000, replace=False)) * 50  # disjoint: ranges of up to 40
    ends = starts + rng.integers(1, 41, size=starts.size)
    editor = ShardedSampler(n, num_replicas=8, rank=0, seed=5, drop_last=True)
    editor.skip_ranges(epoch, np.stack([starts, ends], axis=1))
    ledger = editor.state_dict()
    assert len(ledger["skip"]) == 10_000
    samplers = [ShardedSampler(n, num_replicas=8, rank=r, seed=5, drop_last=True) for r in range(8)]
    for sampler in samplers:
        sampler.load_state_dict(ledger)
    assert len({len(s) for s in samplers}) == 1
    trained = [np.asarray(_units(s, stop=20_000)) for s in samplers]
    state = samplers[0].state_dict()
    assert len(json.dumps(state)) < 1_000_000
    for rank in range(6):
        resumed = ShardedSampler(n, num_replicas=6, rank=rank, seed=5, drop_last=True)
        resumed.load_state_dict(state)
        trained.append(np.asarray(_units(resumed)))
    assert len({len(t) for t in trained[8:]}) == 1  # equal steps per rank after the resize
    everything = np.concatenate(trained)
    plan = np.asarray(_units(ShardedSampler(n, num_replicas=1, rank=0, seed=5)))
    mask = np.zeros(n, dtype=bool)
    for first, stop in zip(starts.tolist(), ends.tolist(), strict=True):
        mask[first:stop] = True
    counts = np.bincount(everything, minlength=n)
    assert counts.max() == 1  # 0 repeated
    assert counts[plan[mask]].sum() == 0  # 0 skipped trained
    lost = int((counts[plan[~mask]] == 0).sum())
    # 0 lost but drop_last's cut of the last partial step at W=6 (fewer than 6 samples)
    assert lost == (n - int(mask.sum()) - 8 * 20_000) % 6


def test_skip_steps_removes_what_which_named_and_keeps_equal_steps() -> None:
    """After a checkpoint, skipping steps 3-5 (as which numbers them) removes exactly their samples."""
    first = ShardedSampler(400, num_replicas=4, rank=0, seed=8)
    for step, _ in enumerate(DataLoader(range(400), batch_size=5, sampler=first)):
        if step == 3:
            break
    state = first.state_dict()
    named = {i for s in range(3, 6) for b in which(first, epoch=0, step=s, batch_size=5, start=state["consumed"],
                                                  world_size=2) for i in b.indices}  # fmt: skip
    editor = ShardedSampler(400, num_replicas=2, rank=0, seed=8)
    editor.load_state_dict(state)
    skip_steps(editor, epoch=0, steps=range(3, 6), batch_size=5, start=state["consumed"], world_size=2)
    edited = editor.state_dict()
    assert edited["consumed"] == state["consumed"] and len(named) == 30
    rest: list[int] = []
    lengths = set()
    for rank in range(2):
        resumed = ShardedSampler(400, num_replicas=2, rank=rank, seed=8)
        resumed.load_state_dict(edited)
        units = _units(resumed)
        lengths.add(len(units))
        rest += units
    before = {i for s in range(4) for b in which(first, epoch=0, step=s, batch_size=5, world_size=4)
              for i in b.indices}  # fmt: skip
    assert len(lengths) == 1 and not named & set(rest) and not before & set(rest)
    assert sorted(before | set(rest) | named) == list(range(400)) and len(rest) == len(set(rest))


def test_skip_before_what_was_trained_or_mid_pass_is_refused() -> None:
    """A skip cannot undo training, nor change a pass being iterated."""
    sampler = ShardedSampler(100, num_replicas=2, rank=0, seed=1)
    sampler.set_epoch(2)
    with pytest.raises(ValueError, match="a skip cannot undo training"):
        sampler.skip_positions(1, 50, 60)
    iterator = iter(sampler)
    next(iterator)
    with pytest.raises(RuntimeError, match="while a pass is being iterated"):
        sampler.skip_positions(3, 0, 10)
    with pytest.raises(ValueError, match="steps should be a non-empty range"):
        skip_steps(ShardedSampler(10, num_replicas=2, rank=0), epoch=0, steps=range(2, 2), batch_size=1)


PROVENANCE_CASES = [c for c in CASES if not c.name.startswith("shard")]  # shard() wrappers: which only


@pytest.mark.parametrize("case", PROVENANCE_CASES, ids=[c.name for c in PROVENANCE_CASES])
def test_which_and_when_follow_the_ledger(case: Case) -> None:
    """With skipped ranges, ``which`` still names each rank's batch and ``when`` never names a skipped position."""
    n, world_size, epoch = 50, 3, 1
    probe = case.make(n, num_replicas=world_size, rank=0, seed=2)
    skips = [[2, 5], [probe._raw_plan_size(epoch) - 3, probe._raw_plan_size(epoch) - 1]]
    probe.skip_ranges(epoch, skips)
    batch_size = None if not isinstance(probe, DistributedSampler) else 3
    seen: dict[int, list[tuple[int, int]]] = {}
    for rank in range(world_size):
        sampler = case.make(n, num_replicas=world_size, rank=rank, seed=2)
        sampler.set_epoch(epoch)
        sampler.skip_ranges(epoch, skips)
        units = _units(sampler)
        steps = [units[i : i + batch_size] for i in range(0, len(units), batch_size)] if batch_size else units
        for step, unit in enumerate(steps):
            indices = [int(i) for i in unit] if isinstance(unit, (list, tuple)) else [int(unit)]
            assert which(probe, epoch=epoch, step=step, rank=rank, batch_size=batch_size)[0].indices == indices
            for index in indices:
                seen.setdefault(index, []).append((step, rank))
    universe = sum(int(s) for s in probe.sizes) if hasattr(probe, "sizes") else getattr(probe, "num_weights", n)
    for index in range(universe):
        found = [(t.step, t.rank) for t in when(probe, index, epochs=epoch, batch_size=batch_size)]
        assert found == sorted(seen.get(index, [])), index


def test_state_of_other_data_is_refused_and_rebase_state_is_the_override() -> None:
    """Other data is refused naming what differs; rebase_state resumes at the same position, warning with the diff."""
    saved = ShardedSampler(500, num_replicas=2, rank=0, seed=4)
    iterator = iter(saved)
    for _ in range(30):
        next(iterator)
    editor = ShardedSampler(500, num_replicas=2, rank=0, seed=4)
    editor.load_state_dict(saved.state_dict())
    editor.skip_positions(0, 200, 210)
    state = editor.state_dict()
    other = ShardedSampler(480, num_replicas=2, rank=0, seed=4)
    with pytest.raises(StateMismatchError, match="num_samples=500, but this sampler has num_samples=480"):
        other.load_state_dict(state)
    with pytest.warns(UserWarning, match="num_samples: 500 -> 480"):
        rebased = rebase_state(state, other)
    other.load_state_dict(rebased)
    assert other.state_dict()["consumed"] == 60 and other.skip_ledger == [[0, 200, 210]]
    mixture = MixtureSampler([10, 20], [0.5, 0.5], num_samples=40, num_replicas=1, rank=0)
    with pytest.raises(StateMismatchError, match="sizes"):
        MixtureSampler([10, 21], [0.5, 0.5], num_samples=40, num_replicas=1, rank=0).load_state_dict(
            mixture.state_dict()
        )
    with pytest.raises(ValueError, match="saved by 'MixtureSampler', but this sampler is 'ShardedSampler'"):
        rebase_state(mixture.state_dict(), other)


class _Subclassed(ShardedSampler):
    """A user subclass whose hooks call the parent's: the ledger must apply once, not twice."""

    def _plan_size(self, epoch: int) -> int:
        return super()._plan_size(epoch)

    def _open_pass(self, *args: Any) -> Any:
        return super()._open_pass(*args)


def test_a_subclass_calling_super_applies_the_ledger_once() -> None:
    """A subclass overriding the plan hooks through super() skips exactly the ledger's positions."""
    plain = ShardedSampler(100, num_replicas=1, rank=0, seed=1)
    sub = _Subclassed(100, num_replicas=1, rank=0, seed=1)
    for sampler in (plain, sub):
        sampler.skip_positions(0, 10, 30)
    assert len(sub) == 80 and list(sub) == list(plain)
