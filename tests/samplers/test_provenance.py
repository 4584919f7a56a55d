"""Provenance: ``which`` gives what a rank trains at a step, ``when`` where a sample trains, checked against real runs."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader

import shardwise
from shardwise import (
    BatchSizeSchedule,
    Mixture,
    MixtureSampler,
    ProvenanceUnsupported,
    ScheduledBatchSampler,
    ShardedSampler,
    skip_steps,
    when,
    which,
)
from shardwise._core.permutation import Permutation, positions_of
from shardwise.tools.launch import run_distributed
from tests.conformance import CASES, Case


def _flat(unit: Any) -> list[int]:
    return [int(i) for i in unit] if isinstance(unit, (list, tuple)) else [int(unit)]


def _is_batch_sampler(sampler: Any) -> bool:
    return not isinstance(sampler, torch.utils.data.DistributedSampler)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_which_equals_what_every_rank_iterates(case: Case) -> None:
    """For every conformance sampler, each rank's batch at each step of two epochs is what ``which`` says."""
    n, world_size = max(37, case.min_n), 3
    probe = case.make(n, num_replicas=world_size, rank=0, seed=11)
    batch_size = None if _is_batch_sampler(probe) else 4
    for epoch in range(2):
        for rank in range(world_size):
            sampler = case.make(n, num_replicas=world_size, rank=rank, seed=11)
            sampler.set_epoch(epoch)
            units = list(sampler)
            steps = [units[i : i + batch_size] for i in range(0, len(units), batch_size)] if batch_size else units
            for step, unit in enumerate(steps):
                expected = [i for u in unit for i in _flat(u)] if batch_size else _flat(unit)
                got = which(probe, epoch=epoch, step=step, rank=rank, batch_size=batch_size)
                assert [b.indices for b in got] == [expected], (epoch, rank, step)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_rank_at_once_equals_each_rank_alone(case: Case) -> None:
    """``rank=None`` (one call over every rank's positions) gives each rank's own answer, padded last step too."""
    n, world_size = max(37, case.min_n), 4
    probe = case.make(n, num_replicas=world_size, rank=0, seed=6)
    probe.set_epoch(1)
    batch_size = None if _is_batch_sampler(probe) else 3
    last = len(probe) - 1 if batch_size is None else -(-len(probe) // batch_size) - 1
    for step in sorted({0, last // 2, last}):
        together = which(probe, epoch=1, step=step, batch_size=batch_size)
        alone = [which(probe, epoch=1, step=step, rank=r, batch_size=batch_size)[0] for r in range(world_size)]
        assert together == alone, step


def test_which_every_rank_and_query_leaves_position_alone() -> None:
    """rank=None answers for every rank at that global step; the queried sampler keeps its state."""
    sampler = ShardedSampler(100, num_replicas=4, rank=2, seed=3)
    sampler.set_epoch(1)
    it = iter(sampler)
    head = [next(it) for _ in range(5)]
    before = sampler.state_dict()
    batches = which(sampler, epoch=1, step=0, batch_size=5)
    assert [b.rank for b in batches] == [0, 1, 2, 3]
    assert batches[2].indices == head
    assert sampler.state_dict() == before
    assert sorted(i for b in which(sampler, epoch=1, step=0, batch_size=25) for i in b.indices) == list(range(100))


def test_which_after_a_resume_counts_steps_from_the_state() -> None:
    """``start=state['consumed']`` numbers the steps of a run resumed at another world size from 0."""
    first = ShardedSampler(90, num_replicas=3, rank=0, seed=2)
    loader = DataLoader(range(90), batch_size=4, sampler=first)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    state = first.state_dict()
    for rank in range(2):
        resumed = ShardedSampler(90, num_replicas=2, rank=rank, seed=2)
        resumed.load_state_dict(state)
        for step, batch in enumerate(DataLoader(range(90), batch_size=4, sampler=resumed)):
            got = which(resumed, epoch=0, step=step, rank=rank, batch_size=4, start=state["consumed"])
            assert got[0].indices == batch.tolist()


def test_which_reads_a_dataloader_and_a_torch_batch_sampler() -> None:
    """A DataLoader gives its batch_size and drop_last; a BatchSampler over a shardwise sampler its own."""
    sampler = ShardedSampler(50, num_replicas=2, rank=1, seed=9)
    loader = DataLoader(range(50), batch_size=6, drop_last=True, sampler=sampler)
    batches = [b.tolist() for b in loader]
    assert [which(loader, epoch=0, step=s, rank=1)[0].indices for s in range(len(batches))] == batches
    with pytest.raises(ValueError, match=r"step should be in \[0, 3\]"):
        which(loader, epoch=0, step=4, rank=1)
    wrapped = BatchSampler(sampler, 7, drop_last=False)
    sampler.set_epoch(0)  # the loader's complete pass advanced it to epoch 1
    assert which(wrapped, epoch=0, step=3, rank=1)[0].indices == list(wrapped)[3]


def test_mixture_batches_name_source_and_index_within_it() -> None:
    """A mixture's batch gives each sample's source name and its index within that source."""
    data = Mixture({"web": range(100), "code": range(1000, 1040), "books": range(2000, 2007)})
    sampler = MixtureSampler(data, [0.5, 0.3, 0.2], num_samples=120, num_replicas=2, rank=0, seed=4)
    batch = which(sampler, epoch=1, step=3, rank=1, batch_size=8)[0]
    assert batch.sources is not None and batch.source_indices is not None
    for index, name, within in zip(batch.indices, batch.sources, batch.source_indices, strict=True):
        source = data.names.index(name)
        assert data.locate(index) == (source, within)


def test_which_bad_input_names_the_parameter() -> None:
    """Missing batch_size, a batch_size for a batch sampler, a rank or step out of range are refused."""
    sampler = ShardedSampler(10, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="batch_size should be the DataLoader's batch_size"):
        which(sampler, epoch=0, step=0)
    with pytest.raises(ValueError, match="batch_size has no effect"):
        which(ScheduledBatchSampler(10, batch_size=2, num_replicas=2, rank=0), epoch=0, step=0, batch_size=2)
    with pytest.raises(ValueError, match=r"rank should be .*1"):
        which(sampler, epoch=0, step=0, rank=2, batch_size=2)
    with pytest.raises(ValueError, match="step"):
        which(sampler, epoch=0, step=3, batch_size=2)
    with pytest.raises(TypeError, match="shardwise sampler"):
        which(range(3), epoch=0, step=0)


# -- the reverse ----------------------------------------------------------------------------------
def test_inverse_permutation_at_every_size_class() -> None:
    """``positions_of`` inverts the keyed permutation: the table path and the Feistel path up to 1e12."""
    for n in (1, 2, 10, 1 << 16, (1 << 16) + 1, 10**9, 10**12):
        permutation = Permutation(n, key=987)
        positions = np.unique(np.linspace(0, n - 1, num=min(n, 4000), dtype=np.int64))
        assert np.array_equal(positions_of(permutation, permutation(positions)), positions)


MIXTURES = [c for c in CASES if c.name.startswith("Mixture")]
REVERSIBLE = [c for c in CASES if not c.name.startswith("shard")]  # every sampler; shard() wrappers re-run theirs


@pytest.mark.parametrize("case", REVERSIBLE, ids=[c.name for c in REVERSIBLE])
def test_when_finds_every_time_a_sample_trains(case: Case) -> None:
    """For each sample, ``when`` lists exactly the (epoch, step, rank) at which the ranks yield it."""
    n, world_size = 41, 3
    probe = case.make(n, num_replicas=world_size, rank=0, seed=5)
    batch_size = None if _is_batch_sampler(probe) else 3
    seen: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for epoch in range(2):
        for rank in range(world_size):
            sampler = case.make(n, num_replicas=world_size, rank=rank, seed=5)
            sampler.set_epoch(epoch)
            units = list(sampler)
            steps = [units[i : i + batch_size] for i in range(0, len(units), batch_size)] if batch_size else units
            for step, unit in enumerate(steps):
                for index in [i for u in unit for i in _flat(u)] if batch_size else _flat(unit):
                    seen[index].append((epoch, step, rank))
    universe = sum(int(s) for s in probe.sizes) if hasattr(probe, "sizes") else getattr(probe, "num_weights", n)
    for index in range(universe):
        found = [(t.epoch, t.step, t.rank) for t in when(probe, index, epochs=range(2), batch_size=batch_size)]
        assert found == sorted(seen.get(index, [])), index


def test_when_is_refused_where_the_plan_is_not_inverted() -> None:
    """A sampler whose plan is not inverted says so, and points to ``which``."""
    sampler = shardwise.shard(torch.utils.data.RandomSampler(range(30)), num_replicas=2, rank=0)
    with pytest.raises(ProvenanceUnsupported, match=r"ShardedWrapper cannot yet .* shardwise.which"):
        when(sampler, 3, epochs=0, batch_size=2)
    with pytest.raises(ValueError, match=r"index should be a sample id in \[0, 9\] \(ShardedSampler draws from 10 sample ids\), but got index=10"):
        when(ShardedSampler(10, num_replicas=2, rank=0), 10, epochs=0, batch_size=2)


# -- against a real run: gloo ranks, DataLoader workers, a batch-size schedule, a resume at another W --
SIZE = 300
SCHEDULE = BatchSizeSchedule.by_samples({0: 3, 120: 5})
KEEP = 4  # steps the W=3 run trains before its checkpoint


def _mixture() -> MixtureSampler:
    return MixtureSampler([200, 70, 30], [0.5, 0.3, 0.2], num_samples=SIZE, seed=13, num_replicas=1, rank=0)


def _loaders() -> tuple[Any, Any, Any, Any]:
    scheduled = ScheduledBatchSampler(_mixture(), batch_size=SCHEDULE)
    sharded = ShardedSampler(SIZE, seed=13)
    return (
        scheduled,
        DataLoader(range(SIZE), batch_sampler=scheduled, num_workers=2, persistent_workers=True),
        sharded,
        DataLoader(range(SIZE), batch_size=4, sampler=sharded),  # workers on the scheduled loader only: fewer processes
    )


def _record(loader: Any, stop: int | None = None) -> list[list[int]]:
    drawn = []
    for batch in loader:
        dist.all_reduce(torch.ones(1))  # a DDP step
        drawn.append(batch.tolist())
        if stop is not None and len(drawn) == stop:
            break
    return drawn


def _before(rank: int, world_size: int) -> dict[str, Any]:
    scheduled, by_schedule, sharded, by_index = _loaders()
    drawn = {"scheduled": _record(by_schedule, KEEP), "sharded": _record(by_index, KEEP)}
    return {"drawn": drawn, "states": {"scheduled": scheduled.state_dict(), "sharded": sharded.state_dict()}}


def _after(rank: int, world_size: int, states: dict[str, Any]) -> dict[str, Any]:
    scheduled, by_schedule, sharded, by_index = _loaders()
    scheduled.load_state_dict(states["scheduled"])
    sharded.load_state_dict(states["sharded"])
    drawn: dict[str, list[list[list[int]]]] = {"scheduled": [], "sharded": []}
    for epoch in range(2):
        for name, sampler, loader in (("scheduled", scheduled, by_schedule), ("sharded", sharded, by_index)):
            sampler.set_epoch(epoch)  # epoch 0 keeps the loaded position
            drawn[name].append(_record(loader))
    return drawn


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_which_and_when_agree_with_a_real_run_resumed_at_another_world_size() -> None:
    """3 gloo ranks with 2 workers each train 4 steps and checkpoint; 2 steps after it are skipped; 2 ranks resume.

    ``which`` names every batch of both runs, and ``when`` every step of epoch 1, as the loaders yielded them.
    """
    before = run_distributed(_before, 3, timeout=240)
    states = before[0]["states"]
    skipped: dict[str, set[int]] = {}
    for name, batch_size in (("scheduled", None), ("sharded", 4)):  # skip steps 1-2 after the checkpoint, at W=2
        editor = _loaders()[0 if name == "scheduled" else 2]
        editor.load_state_dict(states[name])
        steps = dict(epoch=0, batch_size=batch_size, world_size=2, start=states[name]["consumed"])
        skipped[name] = {i for s in (1, 2) for b in which(editor, step=s, **steps) for i in b.indices}
        skip_steps(editor, steps=range(1, 3), **steps)
        states[name] = editor.state_dict()
    after = run_distributed(_after, 2, states, timeout=240)
    seen: dict[str, dict[int, list[tuple[int, int, int]]]] = {
        "scheduled": defaultdict(list),
        "sharded": defaultdict(list),
    }
    for name, batch_size in (("scheduled", None), ("sharded", 4)):
        probe = _loaders()[0 if name == "scheduled" else 2]
        probe.load_state_dict(states[name])  # the ledger: which/when number the steps the run really trained
        consumed = states[name]["consumed"]
        if name == "sharded":  # each sample once an epoch: a skipped one is nowhere in the rest of epoch 0
            assert skipped[name] and not skipped[name] & {i for r in after for b in r[name][0] for i in b}
        for rank, result in enumerate(before):
            for step, batch in enumerate(result["drawn"][name]):
                assert (
                    which(probe, epoch=0, step=step, rank=rank, world_size=3, batch_size=batch_size)[0].indices == batch
                )
        for rank, result in enumerate(after):
            for epoch, batches in enumerate(result[name]):
                start = consumed if epoch == 0 else 0
                for step, batch in enumerate(batches):
                    got = which(probe, epoch=epoch, step=step, rank=rank, world_size=2, batch_size=batch_size,
                                start=start)  # fmt: skip
                    assert got[0].indices == batch, (name, epoch, rank, step)
                    if epoch == 1:
                        for index in batch:
                            seen[name][index].append((epoch, step, rank))
        assert sum(len(b) for r in after for b in r[name][1]) >= SIZE  # the whole of epoch 1 was checked
        for index in range(SIZE):
            found = [(t.epoch, t.step, t.rank) for t in when(probe, index, epochs=1, world_size=2,
                                                             batch_size=batch_size)]  # fmt: skip
            assert found == sorted(seen[name][index]), (name, index)


@pytest.mark.parametrize(
    "make",
    [
        lambda: shardwise.BucketBatchSampler(np.arange(3000) * 7 % 5 + 1, batch_size=7, seed=3, num_replicas=3, rank=0),
        lambda: shardwise.BucketBatchSampler(np.arange(3000) * 7 % 50 + 1, max_tokens=200, batch_size_multiple=2,
                                             seed=3, num_replicas=3, rank=0),
        lambda: shardwise.BucketBatchSampler(np.arange(3000) % 9 + 1, max_tokens=40, sort_window=256, seed=3,
                                             num_replicas=3, rank=0),
        lambda: shardwise.BucketBatchSampler(np.arange(3000) % 30 + 1, max_tokens=25, oversized="skip", seed=3,
                                             num_replicas=3, rank=0, drop_last=True),
        lambda: shardwise.PackedBatchSampler(np.arange(3000) * 7 % 90 + 1, max_len=64, rows_per_batch=2, seed=3,
                                             num_replicas=3, rank=0),
    ],
    ids=["batch-large-groups", "tokens-multiple", "sort_window", "oversized-skip", "packed-split"],
)
def test_when_at_large_groups_agrees_with_which(make: Any) -> None:
    """Groups of hundreds of equal lengths (the Feistel tie shuffle inverted), a sort_window, skipped oversized;
    a packed plan of several strata, samples longer than max_len split across rows."""
    sampler = make()
    sampler.set_epoch(2)  # len() is epoch 2's (a token budget cuts each epoch's stream differently)
    seen: dict[int, list[tuple[int, int]]] = defaultdict(list)
    steps = len(sampler)
    for step in range(steps):
        for batch in which(sampler, epoch=2, step=step):
            for index in batch.indices:
                seen[index].append((step, batch.rank))
    rng = np.random.default_rng(0)
    for index in rng.choice(3000, 300, replace=False).tolist():
        assert [(t.step, t.rank) for t in when(sampler, index, epochs=2)] == sorted(seen.get(index, [])), index
