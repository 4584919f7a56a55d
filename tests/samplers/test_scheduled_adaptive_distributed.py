"""ScheduledBatchSampler over an adaptive MixtureSampler on real gloo ranks: one plan, one ledger, any world size.

Job 1 (2 ranks) trains two epochs in DDP lockstep (one all_reduce a step), batch size 1 then 2 from
sample 24 (a change mid-epoch), each rank recording a per-sample value that is a function of the
sample id alone (so any split of the samples reports the same sums) and calling
``sampler.adaptive.update()`` when ``update_due()``; rank 0 keeps the state saved right after the
update at run position 48 (mid-epoch 0). Job 2 (3 ranks) resumes from that state and trains on.
An interval of 12 samples is a whole number of global steps at both world sizes (2 or 4 samples a
step at W=2, 3 or 6 at W=3), so every update reports exactly its interval's samples and the two
runs' statistics, and so their ledgers and plans, agree. The test checks, in this process, that
each rank's batches are the plan read after all updates (a fresh sampler at that rank loading the
final state), that the ranks agree on the ledger, and that the resumed run's steps, interleaved
over its ranks, are the uninterrupted run's from position 48 on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardwise import AdaptiveWeights, BatchSizeSchedule, ExponentiatedGradient, MixtureSampler, ScheduledBatchSampler
from shardwise.tools.launch import run_distributed

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

NUM_SAMPLES, INTERVAL, EPOCHS = 72, 12, 2
SCHEDULE = BatchSizeSchedule.by_samples({0: 1, 24: 2})
"""Per rank: 1 a batch, then 2 from sample 24 of epoch 0 (run positions 24..143)."""
SAVE_AT = 48  # the run position trained through at the saved state: update 4, mid-epoch 0


def _sampler(num_replicas: int | None = None, rank: int | None = None) -> ScheduledBatchSampler:
    """The batch sampler every rank builds (world from the process group), or a reader at ``(num_replicas, rank)``."""
    weights = AdaptiveWeights(ExponentiatedGradient(rate=1.0), interval=INTERVAL, lag=1)
    mixture = MixtureSampler([100, 50], weights, num_samples=NUM_SAMPLES, block=36, seed=3,
                             num_replicas=num_replicas, rank=rank)  # fmt: skip
    return ScheduledBatchSampler(mixture, batch_size=SCHEDULE, num_replicas=num_replicas, rank=rank)


def _value(indices: list[int]) -> np.ndarray:
    """A per-sample loss, a function of the sample id alone: source 1 (ids 100..149) the harder."""
    array = np.asarray(indices)
    return (array % 7) / 3.0 + 2.0 * (array >= 100)


def _train(sampler: ScheduledBatchSampler, epochs: range, save_at: int | None = None) -> dict[str, Any]:
    """Lockstep epochs on this rank: record, one collective a step, update when due; the batches and the ledger."""
    import torch
    import torch.distributed as dist

    adaptive = sampler.adaptive
    assert adaptive is not None
    batches: list[list[int]] = []
    saved = None
    for epoch in epochs:
        sampler.set_epoch(epoch)
        planned = torch.tensor([len(sampler)])
        dist.all_reduce(planned, op=dist.ReduceOp.MAX)
        if int(planned) != len(sampler):
            raise RuntimeError(f"this rank plans {len(sampler)} steps, another plans {int(planned)}")
        for batch in sampler:
            indices = [int(i) for i in batch]
            adaptive.record(_value(indices), sampler.data.sources_of(indices))
            batches.append(indices)
            dist.all_reduce(torch.ones(1))  # a DDP step: a rank with a step more or less fails here, never hangs
            if adaptive.update_due():
                adaptive.update()
                if adaptive.trained_position() == save_at:
                    assert adaptive.pending == 0  # an update boundary: the state carries everything recorded
                    saved = sampler.state_dict()
    return {"batches": batches, "ledger": adaptive.ledger.to_state(), "state": saved,
            "final": sampler.state_dict(), "world": sampler.world.world_size}  # fmt: skip


def _job_whole(rank: int, world_size: int) -> dict[str, Any]:
    return _train(_sampler(), range(EPOCHS), save_at=SAVE_AT)


def _job_resumed(rank: int, world_size: int, state: dict[str, Any]) -> dict[str, Any]:
    sampler = _sampler()
    sampler.load_state_dict(state)
    return _train(sampler, range(state["epoch"], EPOCHS))


def _interleave(per_rank: list[list[list[int]]]) -> list[int]:
    """Plan order from the ranks' batches: global step ``s`` is rank 0's batch ``s``, then rank 1's, ..."""
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, f"the ranks trained different numbers of steps: {steps}"
    return [index for step in zip(*per_rank, strict=True) for batch in step for index in batch]


def _read_after_updates(state: dict[str, Any], num_replicas: int, rank: int) -> list[list[int]]:
    """This rank's batches of the plan of ``state``'s ledger, every epoch read whole with no update in between."""
    reader = _sampler(num_replicas, rank)
    reader.load_state_dict(state)
    batches: list[list[int]] = []
    for epoch in range(EPOCHS):
        reader.set_epoch(epoch)
        batches += [[int(i) for i in batch] for batch in reader]
    return batches


def _global_plan(state: dict[str, Any]) -> list[int]:
    """The mixture's plan of ``state``'s ledger in one process (W=1), positions 0..EPOCHS * NUM_SAMPLES - 1."""
    reader = _sampler(1, 0)
    reader.load_state_dict(state)  # hands the ledger to the mixture, whose own position stays at 0
    mixture = reader.data
    drawn: list[int] = []
    for epoch in range(EPOCHS):
        mixture.set_epoch(epoch)
        drawn += [int(i) for i in mixture]
    return drawn


def test_two_ranks_train_the_plan_read_after_all_updates_and_a_resume_at_three_ranks_continues_it() -> None:
    """W=2 lockstep with a batch-size change mid-epoch; a state saved at an update mid-epoch resumes at W=3."""
    whole = run_distributed(_job_whole, 2, timeout=90, collective_timeout=20)
    assert [result["world"] for result in whole] == [2, 2]
    # (b) one ledger on both ranks, every interval reported: 2 epochs of 72 samples, one update every 12
    assert whole[0]["ledger"] == whole[1]["ledger"] and whole[0]["ledger"]["updates"] == EPOCHS * NUM_SAMPLES // 12
    weights = np.asarray(whole[0]["ledger"]["shares"], dtype=float).reshape(-1, 2)  # a row an update, flattened
    assert weights[-1][1] > weights[0][1]  # the weights moved to the harder source: the plan depends on the updates
    # the sizes follow the schedule: 24 steps of 1 per rank (samples 0..23 at 2 a step), then steps of 2
    per_rank = [result["batches"] for result in whole]
    assert [len(b) for b in per_rank[0]] == [1] * 12 + [2] * 12 + [2] * 18 == [len(b) for b in per_rank[1]]
    # (a) each rank's batches are its batches of the plan read after all updates
    final = whole[0]["final"]
    for rank in range(2):
        assert per_rank[rank] == _read_after_updates(final, 2, rank)
    trained = _interleave(per_rank)
    assert trained == _global_plan(final)  # and the steps, interleaved, are that plan's positions in order
    # (c) the state saved at run position 48 (mid-epoch 0, after the size change) resumes at W=3
    state = whole[0]["state"]
    assert state is not None and state == whole[1]["state"]
    assert state["epoch"] == 0 and state["consumed"] == SAVE_AT and state["adaptive"]["updates"] == SAVE_AT // 12
    resumed = run_distributed(_job_resumed, 3, state, timeout=90, collective_timeout=20)
    assert [result["world"] for result in resumed] == [3, 3, 3]
    assert [len(result["batches"]) for result in resumed] == [4 + 12] * 3  # steps of 6 samples: 24 left, then 72
    assert _interleave([result["batches"] for result in resumed]) == trained[SAVE_AT:]
    assert all(result["ledger"] == whole[0]["ledger"] for result in resumed)
