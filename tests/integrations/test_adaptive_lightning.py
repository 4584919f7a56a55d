"""AdaptiveMixtureCallback under a real Lightning ``Trainer(strategy="ddp", devices=2)`` on CPU.

Each rank's ``training_step`` returns per-sample losses (a function of the sample, so that any split
of the samples over ranks reports the same sums) and the batch carries each sample's source
(``Mixture(source_key=...)``); the callback records them and updates the weights every interval.
Both ranks must end with the ledger of one process's plain loop, bit for bit, and have trained
the plan that ledger defines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardwise import (
    AdaptiveWeights,
    BatchSizeSchedule,
    ExponentiatedGradient,
    Mixture,
    MixtureSampler,
    ScheduledBatchSampler,
)
from shardwise.tools.launch import run_distributed
from tests.integrations.test_lightning import _join_as_ddp, _trainer

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

NUM_SAMPLES, INTERVAL, BATCH = 96, 24, 4  # 24 = 3 steps at W=2 with 4 a rank; 2 epochs: 8 updates


def _data() -> Mixture:
    return Mixture({"prose": range(40), "code": range(1000, 1030), "noise": range(2000, 2010)}, source_key="source")


def _sampler(**world: Any) -> MixtureSampler:
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=0.5, floor=0.1), interval=INTERVAL)
    return MixtureSampler(_data(), adaptive, num_samples=NUM_SAMPLES, block=10, seed=3, **world)


def _loss(values: Any) -> Any:
    return (values % 5).double() / 2.0 + 2.0 * (values // 1000).double()


def _module(loader: Callable[[], DataLoader[Any]]) -> Any:
    """A LightningModule that trains nothing, keeps the values of every batch and returns per-sample losses."""
    from lightning.pytorch import LightningModule

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[list[int]] = []

        def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            values, _ = batch
            self.seen.append(values.tolist())
            loss = self.layer(values.float().unsqueeze(1)).sum() * 0.0
            return {"loss": loss, "sample_losses": _loss(values)}

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def train_dataloader(self) -> Any:
            return loader()

    return Module()


def _fit(rank: int, world_size: int) -> dict[str, Any]:
    from shardwise.integrations.lightning import AdaptiveMixtureCallback

    _join_as_ddp(rank)
    sampler = _sampler()
    module = _module(lambda: DataLoader(_data(), batch_size=BATCH, sampler=sampler))
    _trainer(callbacks=[AdaptiveMixtureCallback(sampler)]).fit(module)
    return {"ledger": sampler.adaptive.ledger.to_state(), "seen": module.seen}


def _reference() -> tuple[dict[str, Any], list[list[int]]]:
    """One process's plain loop: the same losses, recorded in plan order; its ledger and each epoch's plan."""
    sampler, data = _sampler(num_replicas=1, rank=0), _data()
    plans = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        plan: list[int] = []
        for index in sampler:
            plan.append(data[index][0])
            if len(plan) % BATCH == 0:
                values = torch.tensor(plan[-BATCH:])
                sampler.adaptive.record(_loss(values), sampler.sources_of(_ids(values)))
                if sampler.adaptive.update_due():
                    sampler.adaptive.update()
        plans.append(plan)
    return sampler.adaptive.ledger.to_state(), plans


def _ids(values: Any) -> list[int]:
    starts = {0: 0, 1000: 40, 2000: 70}
    return [starts[v // 1000 * 1000] + v % 1000 for v in values.tolist()]


def test_the_callback_gives_every_rank_the_ledger_and_plan_of_one_process() -> None:
    """Two DDP ranks under Lightning: the ledger equals a plain loop's, and the ranks trained that plan."""
    results = run_distributed(_fit, 2, timeout=200)
    ledger, plans = _reference()
    assert ledger["updates"] == 2 * NUM_SAMPLES // INTERVAL
    for result in results:
        assert result["ledger"] == ledger
    steps_per_epoch = NUM_SAMPLES // (2 * BATCH)
    for epoch in range(2):
        batches = [result["seen"][epoch * steps_per_epoch : (epoch + 1) * steps_per_epoch] for result in results]
        drawn = [batches[rank][step][k] for step in range(steps_per_epoch) for k in range(BATCH) for rank in range(2)]
        assert drawn == plans[epoch]
    assert not np.allclose(ledger["shares"][:3], ledger["shares"][-3:])


SCHEDULE = BatchSizeSchedule.by_samples({0: 2, 48: 4})
"""Per rank: 2 a batch, then 4 from sample 48 of epoch 0; every step of W=1 or W=2 ends inside one interval of 24."""


def _scheduled(**world: Any) -> ScheduledBatchSampler:
    return ScheduledBatchSampler(_sampler(**world), batch_size=SCHEDULE, **world)


def _fit_scheduled(rank: int, world_size: int) -> dict[str, Any]:
    from shardwise.integrations.lightning import AdaptiveMixtureCallback, FollowEpochLength

    _join_as_ddp(rank)
    sampler = _scheduled()
    module = _module(lambda: DataLoader(_data(), batch_sampler=sampler))
    _trainer(callbacks=[FollowEpochLength(), AdaptiveMixtureCallback(sampler)]).fit(module)
    adaptive = sampler.adaptive
    assert adaptive is not None
    return {"ledger": adaptive.ledger.to_state(), "seen": module.seen}


def _scheduled_reference() -> tuple[dict[str, Any], list[int]]:
    """One process's plain loop over the batch sampler (W=1): its ledger and the values it trained, in plan order."""
    sampler, data = _scheduled(num_replicas=1, rank=0), _data()
    adaptive = sampler.adaptive
    assert adaptive is not None
    drawn: list[int] = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for batch in sampler:
            values = torch.tensor([data[index][0] for index in batch])
            adaptive.record(_loss(values), sampler.data.sources_of(batch))
            drawn += values.tolist()
            if adaptive.update_due():
                adaptive.update()
    return adaptive.ledger.to_state(), drawn


def test_the_callback_over_a_scheduled_batch_sampler_gives_every_rank_the_ledger_and_plan_of_one_process() -> None:
    """Progressive batch sizes (ScheduledBatchSampler over the mixture) under Lightning DDP: as a plain loop."""
    from shardwise.integrations.lightning import AdaptiveMixtureCallback

    with pytest.raises(ValueError, match=r"or a ScheduledBatchSampler over such a MixtureSampler"):
        AdaptiveMixtureCallback(ScheduledBatchSampler(96, batch_size=SCHEDULE, num_replicas=1, rank=0))
    results = run_distributed(_fit_scheduled, 2, timeout=200)
    ledger, drawn = _scheduled_reference()
    assert ledger["updates"] == 2 * NUM_SAMPLES // INTERVAL
    assert all(result["ledger"] == ledger for result in results)
    seen = [result["seen"] for result in results]
    assert [len(batch) for batch in seen[0]] == [2] * 12 + [4] * 6 + [4] * 12 == [len(batch) for batch in seen[1]]
    assert [value for step in zip(*seen, strict=True) for batch in step for value in batch] == drawn
    assert not np.allclose(ledger["shares"][:3], ledger["shares"][-3:])
