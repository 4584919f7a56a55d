"""Adaptive mixture weights on real gloo ranks: one trajectory at any world size, through SIGKILL, and loud failures.

Job 1 (2 ranks, 2 DataLoader workers on rank 0) first checks that ranks which disagree fail on every
rank (samplers built differently; reports for different updates), then trains two epochs in DDP
lockstep, recording a per-sample loss (a function of the sample, so that any split of the samples
reports the same sums) and updating the weights every 48 samples; rank 0 checkpoints after each
update, and rank 1 kills itself with SIGKILL two steps after one. Job 2 (3 ranks, no workers)
resumes from the last checkpoint and finishes; then one rank skips an update: it stops at the
interval boundary (PendingWeightsError) and the others fail in the update's collective, never
drawing from other weights. The test compares what the ranks trained, interleaved back into plan
order, and the final ledger with one process's uninterrupted run: identical.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardwise import AdaptiveWeights, Exp3, Mixture, MixtureSampler
from shardwise.samplers.feedback import all_reduce_report
from shardwise.tools.launch import run_distributed
from tests.lockstep import worker_context

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

NUM_SAMPLES, INTERVAL, BATCH, EPOCHS = 480, 48, 8, 2  # 48 = 3 global steps at W=2, 2 at W=3, 6 at W=1
KILL_AT = 44  # rank 1's SIGKILL, in batches: two after the update (and checkpoint) at 42 batches


def _data() -> Mixture:
    return Mixture({"prose": range(150), "code": range(1000, 1090), "noise": range(2000, 2040)})


def _sampler(interval: int = INTERVAL) -> MixtureSampler:
    return MixtureSampler(
        _data(), AdaptiveWeights(Exp3(), interval=interval, lag=2), num_samples=NUM_SAMPLES, block=64, seed=7
    )


def _loss(values: list[int]) -> np.ndarray:
    array = np.asarray(values)
    return (array % 11) / 4.0 + 1.5 * (array // 1000)


def _step(sampler: MixtureSampler, batch: torch.Tensor, log: Any) -> bool:
    """One DDP-style step: record the batch's losses, a collective, update when due; True after an update."""
    import torch.distributed as dist

    values = batch.tolist()
    starts = {0: 0, 1000: 150, 2000: 240}
    sampler.adaptive.record(_loss(values), sampler.sources_of([starts[v // 1000 * 1000] + v % 1000 for v in values]))
    log.write(json.dumps(values) + "\n")
    log.flush()
    dist.all_reduce(torch.ones(1))  # a rank with a batch more or less fails here
    if sampler.adaptive.update_due():
        sampler.adaptive.update()
        return True
    return False


def _loader(sampler: MixtureSampler, workers: int) -> Any:
    from torch.utils.data import DataLoader

    context = worker_context() if workers else None
    return DataLoader(_data(), batch_size=BATCH, sampler=sampler, num_workers=workers, multiprocessing_context=context)


def _disagreements(rank: int) -> list[str]:
    """Ranks whose samplers differ, or who report different updates, fail on every rank."""
    caught = []
    sampler = _sampler(INTERVAL if rank == 0 else INTERVAL // 2)
    iterator = iter(sampler)
    for _ in range(INTERVAL // 2):  # 24 units a rank: 48 positions, both samplers' updates are due
        next(iterator)
    try:
        sampler.adaptive.update()
    except RuntimeError as error:
        caught.append(str(error))
    try:
        all_reduce_report(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), 3 + rank, 5)
    except RuntimeError as error:
        caught.append(str(error))
    return caught


def _job_1(rank: int, world_size: int, directory: str) -> None:
    folder = Path(directory)
    (folder / f"disagree-{rank}.json").write_text(json.dumps(_disagreements(rank)))
    sampler = _sampler()
    batches = 0
    with open(folder / f"w2-rank{rank}.jsonl", "w") as log:
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            # Rank 0's loader prefetches through 2 workers; rank 1, the one SIGKILLed, has none (a killed rank's
            # forkserver workers would outlive it).
            for batch in _loader(sampler, workers=2 if rank == 0 else 0):
                if rank == 1 and batches == KILL_AT:
                    os.kill(os.getpid(), signal.SIGKILL)
                updated = _step(sampler, batch, log)
                batches += 1
                if updated and rank == 0:
                    temporary = folder / "checkpoint.tmp"
                    torch.save({"sampler": sampler.state_dict(), "batches": batches}, temporary)
                    os.replace(temporary, folder / "checkpoint.pt")


def _job_2(rank: int, world_size: int, directory: str) -> None:
    folder = Path(directory)
    checkpoint = torch.load(folder / "checkpoint.pt", weights_only=True)
    sampler = _sampler()
    sampler.load_state_dict(checkpoint["sampler"])
    with open(folder / f"w3-rank{rank}.jsonl", "w") as log:
        for epoch in range(checkpoint["sampler"]["epoch"], EPOCHS):
            sampler.set_epoch(epoch)
            for batch in _loader(sampler, workers=0):
                _step(sampler, batch, log)
    if rank == 0:
        (folder / "ledger.json").write_text(json.dumps(sampler.adaptive.ledger.to_state()))
    # A rank that skips its update: it stops at the boundary, the others fail in the update's collective.
    fresh = _sampler()
    for index, _ in enumerate(fresh):
        if index + 1 == INTERVAL // world_size and rank != 2:
            fresh.adaptive.update()


def _reference() -> tuple[list[list[int]], dict[str, Any]]:
    """One process, uninterrupted: each epoch's plan (values in order) and the final ledger."""
    import torch.distributed as dist

    sampler = MixtureSampler(_data(), AdaptiveWeights(Exp3(), interval=INTERVAL, lag=2), num_samples=NUM_SAMPLES, block=64,
                             seed=7, num_replicas=1, rank=0)  # fmt: skip
    assert not dist.is_initialized()
    data, starts = _data(), {0: 0, 1000: 150, 2000: 240}
    epochs = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        drawn: list[int] = []
        for index in sampler:
            drawn.append(data[index])
            if len(drawn) % BATCH == 0:
                values = drawn[-BATCH:]
                sampler.adaptive.record(
                    _loss(values), sampler.sources_of([starts[v // 1000 * 1000] + v % 1000 for v in values])
                )
                if sampler.adaptive.update_due():
                    sampler.adaptive.update()
        epochs.append(drawn)
    return epochs, sampler.adaptive.ledger.to_state()


def _interleave(logs: list[list[list[int]]]) -> list[int]:
    """Plan order from per-rank batches: step s of rank r holds positions W * (BATCH * s + k) + r."""
    order = []
    for step in range(min(len(log) for log in logs)):
        for k in range(BATCH):
            order += [log[step][k] for log in logs]
    return order


def _read(path: Path) -> list[list[int]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sigkill_and_resume_at_another_world_size_give_the_same_ledger_and_draws(tmp_path: Path) -> None:
    """W=2 with workers, SIGKILL, resume at W=3 without: the trained data and the ledger equal one process's run."""
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 of 2 failed.*(code -9|no result)"):
        run_distributed(_job_1, 2, str(tmp_path), timeout=150, collective_timeout=20)
    for rank in range(2):
        caught = json.loads((tmp_path / f"disagree-{rank}.json").read_text())
        assert len(caught) == 2 and "MixtureSamplers differ" in caught[0] and "different updates" in caught[1], caught
    with pytest.raises(RuntimeError, match=r"PendingWeightsError: plan position 146 of epoch 0"):
        run_distributed(_job_2, 3, str(tmp_path), timeout=150, collective_timeout=20)
    reference, ledger = _reference()
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["batches"] == 42 and saved["sampler"]["epoch"] == 1
    head = [line for line in _read(tmp_path / "w2-rank0.jsonl")][: saved["batches"]]
    w2 = _interleave([head, _read(tmp_path / "w2-rank1.jsonl")[: saved["batches"]]])
    w3 = _interleave([_read(tmp_path / f"w3-rank{rank}.jsonl") for rank in range(3)])
    assert w2[:NUM_SAMPLES] == reference[0]
    assert w2[NUM_SAMPLES:] + w3 == reference[1]
    assert json.loads((tmp_path / "ledger.json").read_text()) == json.loads(json.dumps(ledger))
    assert ledger["updates"] == EPOCHS * NUM_SAMPLES // INTERVAL
