"""PackedMixtureSampler with adaptive weights on real gloo ranks: SIGKILL with workers, resume at another world size.

Job 1 (2 ranks, 2 DataLoader workers each) trains, reports every token's loss
(``record_tokens``), updates the weights when due and, right after each update, rank 0 saves
``sampler.state_dict()`` (position and ledger); rank 1 kills itself with SIGKILL at step 7. Job 2
(3 ranks, a new process group) loads the last checkpoint and trains to the end of epoch 1. Then:

- every piece (document, token range) trained before the checkpoint plus every piece of job 2 is
  the global plan's, with only the documented padding repeated (``W - 1`` batches an epoch end);
- the ledger at the end is bit-identical to one process's uninterrupted run: the losses are a
  function of the document, and statistics are fixed-point sums, so world size and crash leave no
  trace in the weights;
- ``which`` names, for every step a rank of job 1 logged, exactly the pieces it trained.
"""

from __future__ import annotations

import json
import os
import signal
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardwise
from shardwise.tools.launch import run_distributed
from tests.lockstep import worker_context

EPOCHS, CRASH, NUM_BATCHES = 2, 7, 24
RNG = np.random.default_rng(7)
LENGTHS = [RNG.integers(5, 40, 60), RNG.integers(20, 90, 25), RNG.integers(60, 200, 8)]


def make(**world: Any) -> shardwise.PackedMixtureSampler:
    """Updates every 6 batches (a whole number of steps at 1, 2 and 3 ranks); lag 2 covers the workers' prefetch."""
    weights = shardwise.AdaptiveWeights(shardwise.Exp3(smoothing=0.5), interval=6, lag=2)
    return shardwise.PackedMixtureSampler(LENGTHS, weights, max_len=64, rows_per_batch=2, num_batches=NUM_BATCHES,
                                          seed=13, **world)  # fmt: skip


def pieces(items: list[Any]) -> list[list[int]]:
    """The collate: each document piece as ``[sample, start, stop]`` (what a model would get, as numbers)."""
    return [[int(item.sample), int(item.start), int(item.start) + len(item.tokens)] for item in items]


def loader(sampler: Any) -> DataLoader:
    data = shardwise.PackedDataset(shardwise.Mixture([[np.arange(n) for n in lengths] for lengths in LENGTHS]))
    return DataLoader(data, batch_sampler=sampler, collate_fn=pieces, num_workers=2, persistent_workers=True,
                      multiprocessing_context=worker_context())  # fmt: skip


def report(sampler: shardwise.PackedMixtureSampler, batch: list[list[int]]) -> None:
    """Each token's loss, a function of its document alone (as a model's would be, without the noise)."""
    samples = np.asarray([p[0] for p in batch])
    sample_ids = np.repeat(samples, [p[2] - p[1] for p in batch])
    sampler.adaptive.record_tokens(1.0 + 0.5 * sampler.sources_of(sample_ids) + 0.01 * (sample_ids % 5), sample_ids)


def train(sampler: Any, batches: Any, on_step: Any = None) -> None:
    for batch in batches:
        report(sampler, batch)
        if on_step is not None:
            on_step(batch)
        if sampler.adaptive.update_due():
            sampler.adaptive.update()
            if on_step is not None:
                on_step(None)  # right after an update: a checkpoint carries the whole trajectory


def _first_job(rank: int, world_size: int, directory: str) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    sampler, step = make(), 0
    data = loader(sampler)
    with open(Path(directory) / f"first.rank{rank}.jsonl", "w") as log:

        def on_step(batch: Any) -> None:
            nonlocal step
            if batch is None:
                if rank == 0:
                    torch.save({"step": step, "state": sampler.state_dict()}, Path(directory) / "ckpt.tmp")
                    os.replace(Path(directory) / "ckpt.tmp", Path(directory) / "ckpt")
                return
            step += 1
            if step == CRASH and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # with two live DataLoader workers
            log.write(json.dumps({"step": step, "pieces": batch}) + "\n")
            log.flush()
            dist.all_reduce(torch.ones(1))

        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            train(sampler, data, on_step)
    raise RuntimeError("rank 1 should have been killed")


def _second_job(rank: int, world_size: int, directory: str) -> None:
    warnings.filterwarnings("ignore")
    sampler = make()
    saved = torch.load(Path(directory) / "ckpt", weights_only=False)
    sampler.load_state_dict(saved["state"])
    data = loader(sampler)
    with open(Path(directory) / f"second.rank{rank}.jsonl", "w") as log:
        for epoch in range(saved["state"]["epoch"], EPOCHS):
            sampler.set_epoch(epoch)
            train(sampler, data, lambda batch: batch is not None and log.write(json.dumps({"pieces": batch}) + "\n"))
    if rank == 0:
        torch.save(sampler.adaptive.ledger.shares.tolist(), Path(directory) / "ledger")


def _records(directory: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(f"{prefix}.rank*.jsonl")):
        rank = int(path.name.split(".rank")[1].split(".")[0])
        out += [{**json.loads(line), "rank": rank} for line in path.read_text().splitlines() if line.strip()]
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_sigkill_with_workers_then_resume_at_three_ranks_keeps_pieces_and_ledger_exact(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"rank 1 exited with code -9"):
        run_distributed(_first_job, 2, str(tmp_path), timeout=120, collective_timeout=30)
    run_distributed(_second_job, 3, str(tmp_path), timeout=120, collective_timeout=30)
    saved = torch.load(tmp_path / "ckpt", weights_only=False)
    assert saved["step"] == 6 and saved["state"]["adaptive"]["updates"] == 2  # the update after step 6 (12 batches)

    trained: Counter[tuple[int, ...]] = Counter()
    for record in _records(tmp_path, "first"):
        if record["step"] <= saved["step"]:
            trained.update(tuple(p) for p in record["pieces"])
    for record in _records(tmp_path, "second"):
        trained.update(tuple(p) for p in record["pieces"])

    reference, plan = make(num_replicas=1, rank=0), Counter()  # the uninterrupted run, one process
    for epoch in range(EPOCHS):
        reference.set_epoch(epoch)
        batches = ([[int(i), i.start, i.stop] for i in batch] for batch in reference)
        train(reference, batches, lambda batch: batch is not None and plan.update(tuple(p) for p in batch))
    lost, repeated = plan - trained, trained - plan
    assert not lost and not repeated, (sorted(lost)[:5], sorted(repeated)[:5])  # 24 batches: no padding at 2 or 3
    assert reference.adaptive.ledger.updates == EPOCHS * NUM_BATCHES // 6
    assert torch.load(tmp_path / "ledger", weights_only=False) == reference.adaptive.ledger.shares.tolist()
    # which() answers in packed terms what each rank trained: document, row and token range, step by step
    for record in _records(tmp_path, "first"):
        (found,) = shardwise.which(reference, epoch=0, step=record["step"] - 1, rank=record["rank"], world_size=2)
        rows = [[i, start, stop] for i, (_, start, stop) in zip(found.indices, found.pieces or [], strict=True)]
        assert rows == record["pieces"], record["step"]
