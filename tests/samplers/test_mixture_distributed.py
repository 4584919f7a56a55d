"""MixtureSampler on real gloo ranks: lockstep epochs, and a curriculum saved at W=3 resumed on 2 real ranks."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardwise import Mixture, MixtureSampler, WeightSchedule
from shardwise.tools.launch import run_distributed
from tests.lockstep import lockstep_epochs

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SIZES = [700, 120, 13]
SCHEDULE = WeightSchedule.by_samples({0: [0.6, 0.3, 0.1], 2_400: [0.2, 0.4, 0.4]})
NUM_SAMPLES = 1_000
STOP_AFTER = 9  # steps of 8 per rank at W=3 before the checkpoint; the schedule changes later in that epoch


def _data() -> Mixture:
    return Mixture({"web": range(700), "code": range(1000, 1120), "books": range(2000, 2013)})


def _sampler(**world: int) -> MixtureSampler:
    return MixtureSampler(_data(), SCHEDULE, num_samples=NUM_SAMPLES, seed=21, **world)


def _ranks_main(rank: int, world_size: int, state: dict) -> dict:
    sampler = _sampler()  # rank and world size from the process group
    loader = DataLoader(_data(), batch_size=8, sampler=sampler)
    epochs = lockstep_epochs(loader, sampler, epochs=2)
    resumed = _sampler()
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])  # what a framework does after restoring: keeps the position
    tail = []
    for batch in DataLoader(_data(), batch_size=8, sampler=resumed):
        dist.all_reduce(torch.ones(1))  # a DDP step: a rank with an extra batch would fail here
        tail += batch.tolist()
    return {"epochs": epochs, "tail": tail}


def _plan(epoch: int) -> Counter[int]:
    sampler = _sampler(num_replicas=1, rank=0)
    sampler.set_epoch(epoch)
    data = _data()
    return Counter(data[i] for i in sampler)


def test_mixture_on_real_ranks_and_elastic_resume_across_the_schedule_change() -> None:
    """Two gloo ranks step together over a Mixture, then finish an epoch whose first part ran on three ranks."""
    head: list[int] = []
    state = None
    for rank in range(3):  # the first part of epoch 2 at W=3, before the weight change at sample 2400
        sampler = _sampler(num_replicas=3, rank=rank)
        sampler.set_epoch(2)
        for step, batch in enumerate(DataLoader(_data(), batch_size=8, sampler=sampler)):
            head += batch.tolist()
            if step + 1 == STOP_AFTER:
                break
        state = state or sampler.state_dict()
    assert state is not None and state["consumed"] == 3 * 8 * STOP_AFTER
    reports = run_distributed(_ranks_main, 2, state, timeout=180)
    for epoch in range(2):
        drawn = Counter(i for r in reports for batch in r["epochs"][epoch] for i in batch)
        assert not _plan(epoch) - drawn and sum((drawn - _plan(epoch)).values()) <= 1
    seen = Counter(head) + Counter(i for r in reports for i in r["tail"])
    assert not _plan(2) - seen and sum((seen - _plan(2)).values()) <= 1
