"""Real multi-process runs: spawned gloo groups, an all_reduce every step, indices gathered and checked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from shardwise import ShardedSampler, shard, shard_batches
from shardwise.tools.launch import run_distributed
from tests.classic import TwoStreamBatchSampler
from tests.lockstep import lockstep_epochs, worker_context

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

N = 1_003


def _step_all(loader, epochs: int = 2) -> tuple[list[list], list[int]]:
    """Each epoch's batches and step count, iterated in lockstep with the other ranks."""
    sampler = loader.sampler if hasattr(loader.sampler, "set_epoch") else loader.batch_sampler
    seen = lockstep_epochs(loader, sampler, epochs)
    return seen, [len(batches) for batches in seen]


def _samplers_main(rank: int, world_size: int) -> dict:
    dataset = list(range(N))
    out = {}
    # Rank and world size come from the initialised process group: no arguments.
    plain = ShardedSampler(dataset, seed=17)
    out["resolved"] = (plain.rank, plain.num_replicas)
    # Ranks are ordinary processes: they can start DataLoader workers, as torchrun ranks do.
    workers = 2 if world_size == 2 else 0  # once is enough: workers cost seconds per epoch
    out["sharded"] = _step_all(DataLoader(dataset, batch_size=16, sampler=plain, num_workers=workers,
                                          multiprocessing_context=worker_context() if workers else None))
    wrapped = shard(RandomSampler(dataset), seed=17)
    out["shard"] = _step_all(DataLoader(dataset, batch_size=16, sampler=wrapped))
    batches = shard_batches(BatchSampler(RandomSampler(dataset), 16, drop_last=False), seed=17)
    out["shard_batches"] = _step_all(DataLoader(dataset, batch_sampler=batches))
    return out


# What each world size's ranks run, one start of them for all: the samplers test on 2, 3 and 4 ranks, the plans on 2,
# the two-stream acceptance on 3 (last: it seeds the global np.random).
RUNS = {2: ["samplers", "sharded"], 3: ["samplers", "two_stream"], 4: ["samplers"]}


def _runs_main(rank: int, world_size: int, names: list[str]) -> dict[str, Any]:
    mains = {"samplers": _samplers_main, "sharded": _sharded_main, "two_stream": _two_stream_main}
    return {name: mains[name](rank, world_size) for name in names}


@pytest.fixture(scope="module")
def ranks() -> Callable[[int, str], list[Any]]:
    """``ranks(world_size, name)``: each rank's result of ``name``; a world size's ranks start once, at first use."""
    runs: dict[int, list[dict[str, Any]]] = {}

    def results(world_size: int, name: str) -> list[Any]:
        if world_size not in runs:
            runs[world_size] = run_distributed(_runs_main, world_size, RUNS[world_size], timeout=180)
        return [rank[name] for rank in runs[world_size]]

    return results


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_rank_steps_together_and_draws_disjoint_shards(ranks: Callable[[int, str], list[Any]], world_size: int) -> None:
    """On W real ranks each sampler gives equal steps, disjoint indices (but padding) and full coverage."""
    reports = ranks(world_size, "samplers")
    assert [r["resolved"] for r in reports] == [(rank, world_size) for rank in range(world_size)]
    for name in ("sharded", "shard", "shard_batches"):
        for epoch in range(2):
            steps = {r[name][1][epoch] for r in reports}
            assert len(steps) == 1, (name, steps)
            drawn = Counter(i for r in reports for batch in r[name][0][epoch] for i in batch)
            assert set(drawn) == set(range(N)), name
            padding = sum(drawn.values()) - N
            assert 0 <= padding <= 16 * (world_size - 1)
        assert reports[0][name][0][0] != reports[0][name][0][1], f"{name}: epoch orders should differ"


def _expected_sharded(rank: int, world_size: int, epoch: int) -> list[int]:
    sampler = ShardedSampler(N, num_replicas=world_size, rank=rank, seed=17)
    sampler.set_epoch(epoch)
    return list(sampler)


def _sharded_main(rank: int, world_size: int) -> list[list[int]]:
    sampler = ShardedSampler(N, seed=17)
    return [list(sampler) for _ in range(2)]  # epoch 0, then the automatic advance to epoch 1


def test_plans_are_identical_across_processes(ranks: Callable[[int, str], list[Any]]) -> None:
    """What spawned ranks draw equals what this process computes for the same (seed, epoch, rank)."""
    reports = ranks(2, "sharded")
    for rank, report in enumerate(reports):
        for epoch in range(2):
            assert report[epoch] == _expected_sharded(rank, 2, epoch)


def _two_stream_main(rank: int, world_size: int) -> dict:
    # The inner sampler draws from the global np.random; every rank seeds its global RNG differently
    # on purpose, as unseeded processes would: shard_batches must still agree across ranks.
    np.random.seed(1000 + rank)
    primary, secondary = np.arange(0, 30), np.arange(30, 90)
    sampler = shard_batches(TwoStreamBatchSampler(primary, secondary, 6, 3), seed=5)
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = []
        for batch in sampler:
            flag = torch.ones(1)
            dist.all_reduce(flag)
            batches.append(batch)
        seen.append(batches)
    return {"seen": seen, "len": len(sampler), "caller_rng": np.random.randint(1 << 30)}


def test_two_stream_acceptance_on_three_ranks(ranks: Callable[[int, str], list[Any]]) -> None:
    """The classic two-stream batch sampler under shard_batches on 3 ranks: disjoint, equal, as one process."""
    reports = ranks(3, "two_stream")
    single = shard_batches(
        TwoStreamBatchSampler(np.arange(0, 30), np.arange(30, 90), 6, 3), seed=5, num_replicas=1, rank=0
    )
    for epoch in range(2):
        single.set_epoch(epoch)
        plan = list(single)
        assert len(plan) == 10
        for rank, report in enumerate(reports):
            assert report["seen"][epoch] == [plan[(rank + 3 * k) % len(plan)] for k in range(report["len"])]
        assert len({len(r["seen"][epoch]) for r in reports}) == 1
        primaries = [i for r in reports for batch in r["seen"][epoch] for i in batch[:3]]
        # 10 batches over 3 ranks: 2 padded batches repeat; the first 9 batches are disjoint.
        assert len(set(primaries)) == 30
    # The caller's own np.random stream was left alone: each rank draws what its own seed gives.
    for rank, report in enumerate(reports):
        np.random.seed(1000 + rank)
        assert report["caller_rng"] == np.random.randint(1 << 30)


def _mismatched_main(rank: int, world_size: int) -> int:
    # A deliberately broken job: rank 1 sees a longer dataset, so it takes one more step than rank 0.
    sampler = ShardedSampler(100 + 50 * rank, seed=0)
    steps = 0
    for _ in DataLoader(list(range(100 + 50 * rank)), batch_size=10, sampler=sampler):
        flag = torch.ones(1)
        dist.all_reduce(flag)
        steps += 1
    return steps


def test_a_length_mismatch_fails_instead_of_hanging() -> None:
    """If ranks disagree on lengths the run fails within its timeout, it never waits forever."""
    with pytest.raises((RuntimeError, TimeoutError)):
        run_distributed(_mismatched_main, 2, timeout=60, collective_timeout=5)
