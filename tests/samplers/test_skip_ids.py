"""Skipping sample ids: never trained in any later epoch, at any world size, across restarts; all else as before."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardwise import (
    BucketBatchSampler,
    LocalitySampler,
    MalformedStateError,
    MixtureSampler,
    ProvenanceUnsupported,
    ScheduledBatchSampler,
    ShardedSampler,
    WeightedSampler,
    when,
    which,
)
from shardwise._core.skips import IdSkips
from shardwise.tools.launch import run_distributed
from tests.lockstep import lockstep_epochs

N = 60


def _make(name: str, world_size: int, rank: int) -> Any:
    kw: dict[str, Any] = {"num_replicas": world_size, "rank": rank, "seed": 4}
    if name == "sharded":
        return ShardedSampler(N, drop_last=True, **kw)
    if name == "sharded-pad":
        return ShardedSampler(N, **kw)
    if name == "locality":
        return LocalitySampler([7] * 8 + [4], window=3, drop_last=True, **kw)
    if name == "mixture":
        return MixtureSampler([40, 15, 5], [0.5, 0.3, 0.2], num_samples=N, drop_last=True, **kw)
    if name == "scheduled":
        return ScheduledBatchSampler(N, batch_size=2, drop_last=True, **kw)
    raise AssertionError(name)


def _flat(units: list[Any]) -> list[int]:
    return [int(i) for u in units for i in (u if isinstance(u, list) else [u])]


def _pass(sampler: Any, stop: int | None = None) -> list[Any]:
    out = []
    for unit in sampler:
        out.append(unit)
        if stop is not None and len(out) == stop:
            break
    return out


NAMES = ["sharded", "sharded-pad", "locality", "mixture", "scheduled"]


def _merged(name: str, per_rank: list[list[Any]]) -> list[int]:
    """The ranks' units put back in plan order: unit dealing by stride, or (scheduled) step by step, rank slices."""
    if name == "scheduled":
        return [i for step in zip(*per_rank, strict=True) for batch in step for i in batch]
    return [int(per_rank[q % len(per_rank)][q // len(per_rank)]) for q in range(sum(len(u) for u in per_rank))]


@pytest.mark.parametrize("name", NAMES)
def test_skipped_ids_never_train_again_across_a_resize_and_later_epochs(name: str) -> None:
    """W=3 trains 2 units, ids are skipped on its state, W=2 resumes: each epoch is the plan without those ids."""
    first_run = [_make(name, 3, r) for r in range(3)]
    for sampler in first_run:
        _pass(sampler, stop=2)
    state = first_run[0].state_dict()
    editor = _make(name, 2, 0)
    editor.load_state_dict(state)
    editor.skip_ids(10, 16)
    editor.skip_ids(30, 31)
    edited = editor.state_dict()
    assert edited["skip_ids"] == [[0, state["consumed"], 10, 16], [0, state["consumed"], 30, 31]]
    assert json.loads(json.dumps(edited)) == edited
    skipped = set(range(10, 16)) | {30}
    for epoch in (0, 1, 2):
        resumed = [_make(name, 2, r) for r in range(2)]
        for sampler in resumed:
            sampler.load_state_dict(edited)
            if epoch:
                sampler.set_epoch(epoch)
        got = [_pass(s) for s in resumed]
        assert len({len(g) for g in got}) == 1  # equal steps per rank
        whole = _make(name, 1, 0)  # the epoch's plan, without the skip
        whole.set_epoch(epoch)
        plan = _flat(_pass(whole))[state["consumed"] if epoch == 0 else 0 :]
        expected = [i for i in plan if i not in skipped]
        merged = _merged(name, got)
        if name == "sharded-pad":  # padding wraps to the start of what is left
            assert merged[: len(expected)] == expected and len(merged) - len(expected) < 2
        else:  # drop_last: at most the last step's cut is left out
            assert merged == expected[: len(merged)] and len(expected) - len(merged) < 2 * (2 if name == "scheduled" else 1)
        assert not skipped & set(merged)
        # which and when follow the skipped ids: every unit each rank yielded, at its step, and nothing else
        per_step = None if name == "scheduled" else 1
        start = state["consumed"] if epoch == 0 else 0
        seen: dict[int, list[tuple[int, int]]] = {}
        for rank, units in enumerate(got):
            for step, unit in enumerate(units):
                batch = which(resumed[0], epoch=epoch, step=step, rank=rank, world_size=2, batch_size=per_step,
                              start=start)[0].indices  # fmt: skip
                assert batch == _flat([unit]), (epoch, rank, step)
                for index in batch:
                    seen.setdefault(index, []).append((step, rank))
        for index in range(60):
            found = [(t.step, t.rank) for t in when(resumed[0], index, epochs=epoch, world_size=2, batch_size=per_step,
                                                    start=start)]  # fmt: skip
            assert found == sorted(seen.get(index, [])), (epoch, index)


def test_an_epoch_under_way_keeps_what_it_trained() -> None:
    """An id trained before the skip was added stays trained in that epoch; the next epoch never has it."""
    first = ShardedSampler(N, num_replicas=1, rank=0, seed=2)
    head = _pass(first, stop=5)
    sampler = ShardedSampler(N, num_replicas=1, rank=0, seed=2)
    sampler.load_state_dict(first.state_dict())
    sampler.skip_ids(head[0], head[0] + 1)  # already trained in epoch 0
    rest = _pass(sampler)
    assert head[0] not in rest and sorted(head + rest) == list(range(N))
    sampler.set_epoch(1)
    assert sorted(_pass(sampler)) == [i for i in range(N) if i != head[0]]
    assert [t.epoch for t in when(sampler, head[0], epochs=range(2), batch_size=1)] == [0]  # before the skip


def test_state_without_skip_ids_loads_and_a_malformed_one_is_refused() -> None:
    """A state saved before ids could be skipped (no "skip_ids") loads as none; a bad field is refused."""
    old = {"version": 1, "epoch": 0, "consumed": 7, "seed": 4,
           "fingerprint": {"kind": "ShardedSampler", "num_samples": 60, "shuffle": True}}  # fmt: skip
    sampler = ShardedSampler(N, num_replicas=1, rank=0, seed=4)
    sampler.load_state_dict(old)
    assert sampler.skipped_ids == [] and "skip_ids" not in sampler.state_dict() and len(_pass(sampler)) == N - 7
    with pytest.raises(MalformedStateError, match=r"state\['skip_ids'\]"):
        sampler.load_state_dict({**old, "skip_ids": [[0, 0, 5, 5]]})
    with pytest.raises(MalformedStateError, match=r"state\['skip_ids'\]"):
        IdSkips.from_state([[0, -1, 2, 3]])


def test_unsupported_samplers_and_bad_ids_are_refused_by_name() -> None:
    bucket = BucketBatchSampler(np.arange(1, 40), max_tokens=80, num_replicas=1, rank=0)
    with pytest.raises(ProvenanceUnsupported, match=r"BucketBatchSampler cannot skip sample ids.*skip_steps"):
        bucket.skip_ids(1, 2)
    weighted = WeightedSampler(np.ones(20), num_samples=20, num_replicas=1, rank=0)
    with pytest.raises(ProvenanceUnsupported, match="WeightedSampler cannot skip sample ids"):
        weighted.skip_ids(1, 2)
    sharded = ShardedSampler(N, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"stop should be at most 60: .* sample ids in \[0, 59\]"):
        sharded.skip_ids(50, 70)
    with pytest.raises(ValueError, match="stop should be an integer >= 6"):
        sharded.skip_ids(5, 5)
    trained = ShardedSampler(N, num_replicas=1, rank=0)
    trained.set_epoch(2)
    _pass(trained, stop=1)
    sharded.load_state_dict(trained.state_dict())
    with pytest.raises(ValueError, match="epoch should be an integer >= 2"):
        sharded.skip_ids(1, 2, epoch=1)


def test_many_skipped_ids_are_translated_once_per_epoch() -> None:
    """The id-to-position translation is cached: a second pass over the epoch does not redo it."""
    sampler = ShardedSampler(100_000, num_replicas=2, rank=0, seed=1)
    sampler.skip_ids(0, 20_000)
    calls = []
    translate = sampler._positions_of_ids
    sampler._positions_of_ids = lambda epoch, ids: calls.append(ids.size) or translate(epoch, ids)  # type: ignore[method-assign]
    assert len(sampler) == 40_000 and len(sampler) == 40_000
    sampler.set_epoch(1)
    assert len(sampler) == 40_000
    assert calls == [20_000, 20_000]  # once for epoch 0, once for epoch 1


# -- real gloo ranks, a DataLoader, a resume at another world size -------------------------------------
SIZE = 240


def _loader(world_size: int, rank: int) -> tuple[ScheduledBatchSampler, DataLoader[Any]]:
    mixture = MixtureSampler([150, 60, 30], [0.5, 0.3, 0.2], num_samples=SIZE, seed=9, num_replicas=world_size,
                             rank=rank)  # fmt: skip
    sampler = ScheduledBatchSampler(mixture, batch_size=4, drop_last=True)
    return sampler, DataLoader(range(SIZE), batch_sampler=sampler, num_workers=1)


def _train_then_save(rank: int, world_size: int) -> dict[str, Any]:
    sampler, loader = _loader(world_size, rank)
    drawn = []
    for batch in loader:
        dist.all_reduce(torch.ones(1))
        drawn.append(batch.tolist())
        if len(drawn) == 5:
            break
    return {"drawn": drawn, "state": sampler.state_dict()}


def _resume(rank: int, world_size: int, state: dict[str, Any]) -> list[list[list[int]]]:
    sampler, loader = _loader(world_size, rank)
    sampler.load_state_dict(state)
    epochs = lockstep_epochs(loader, sampler, epochs=2)  # epoch 0 from the state, then epoch 1 whole
    return epochs


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_gloo_ranks_resumed_at_another_world_size_never_train_skipped_ids() -> None:
    """3 gloo ranks train 5 steps; ids 0-19 and 200-204 are skipped on the checkpoint; 2 ranks resume 2 epochs."""
    before = run_distributed(_train_then_save, 3, timeout=240)
    state = before[0]["state"]
    editor, _ = _loader(2, 0)
    editor.load_state_dict(state)
    editor.skip_ids(0, 20)
    editor.skip_ids(200, 205)
    after = run_distributed(_resume, 2, editor.state_dict(), timeout=240)
    skipped = set(range(20)) | set(range(200, 205))
    early = {i for r in before for b in r["drawn"] for i in b}
    assert skipped & early  # some were trained before the checkpoint: they stay trained, in the past
    for epoch in range(2):
        assert len({len(r[epoch]) for r in after}) == 1  # equal steps per rank
        merged = _merged("scheduled", [r[epoch] for r in after])
        plain, _ = _loader(1, 0)  # the epoch's plan without the skip
        plain.set_epoch(epoch)
        plan = [i for b in plain for i in b][state["consumed"] if epoch == 0 else 0 :]
        expected = [i for i in plan if i not in skipped]
        assert not skipped & set(merged), epoch
        assert merged == expected[: len(merged)] and len(expected) - len(merged) < 2 * 4, epoch  # drop_last's cut


def test_ten_thousand_id_ranges_at_8_ranks_then_6_lose_and_repeat_nothing() -> None:
    """10^4 id ranges added on a W=8 checkpoint, resumed at W=6: 0 lost, 0 repeated, 0 skipped trained, small state."""
    n = 200_000
    rng = np.random.default_rng(0)
    starts = np.sort(rng.choice(n // 20, 10_000, replace=False)) * 20
    ranges = np.stack([starts, starts + rng.integers(1, 11, size=starts.size)], axis=1)
    first = [ShardedSampler(n, num_replicas=8, rank=r, seed=5, drop_last=True) for r in range(8)]
    trained = [np.asarray(_pass(s, stop=2_000)) for s in first]
    editor = ShardedSampler(n, num_replicas=6, rank=0, seed=5, drop_last=True)
    editor.load_state_dict(first[0].state_dict())
    editor.skip_id_ranges(ranges)
    state = editor.state_dict()
    assert len(state["skip_ids"]) == 10_000 and len(json.dumps(state)) < 1_000_000
    resumed = [ShardedSampler(n, num_replicas=6, rank=r, seed=5, drop_last=True) for r in range(6)]
    for sampler in resumed:
        sampler.load_state_dict(state)
    after = [np.asarray(_pass(s)) for s in resumed]
    assert len({a.size for a in after}) == 1  # equal steps per rank
    skipped = np.zeros(n, dtype=bool)
    for a, b in ranges.tolist():
        skipped[a:b] = True
    before = np.bincount(np.concatenate(trained), minlength=n)
    counts = before + np.bincount(np.concatenate(after), minlength=n)
    assert counts.max() == 1  # 0 repeated
    assert (counts[skipped] - before[skipped]).sum() == 0  # 0 skipped trained after the skip
    lost = int(((counts == 0) & ~skipped).sum())
    assert lost < 6  # 0 lost but drop_last's cut of the last partial step at W=6
