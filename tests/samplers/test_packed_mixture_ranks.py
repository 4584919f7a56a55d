"""PackedMixtureSampler on real gloo ranks: SIGKILL mid-epoch with DataLoader workers, resume at another world size.

Job 1 (2 ranks, 2 workers each) trains, rank 0 checkpoints ``sampler.state_dict()`` every 2 steps,
and rank 1 kills itself with SIGKILL at step 5. Job 2 (3 ranks, a new process group) loads the
last checkpoint and trains to the end of epoch 1. Every piece (document, token range) trained
before the checkpoint plus every piece of job 2 is the global plan's (what one process yields),
with only the documented padding repeated: at most ``W - 1`` batches at each epoch end.
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

EPOCHS, CRASH, EVERY = 2, 5, 2
RNG = np.random.default_rng(7)
LENGTHS = [RNG.integers(5, 40, 60), RNG.integers(20, 90, 25), RNG.integers(60, 200, 8)]


def make(**world: Any) -> shardwise.PackedMixtureSampler:
    return shardwise.PackedMixtureSampler(LENGTHS, [0.5, 0.3, 0.2], max_len=64, rows_per_batch=2, seed=13, **world)


def pieces(items: list[Any]) -> list[list[int]]:
    """The collate: each document piece as ``[sample, start, stop]`` (what a model would get, as numbers)."""
    return [[int(item.sample), int(item.start), int(item.start) + len(item.tokens)] for item in items]


def loader(sampler: Any) -> DataLoader:
    data = shardwise.PackedDataset(shardwise.Mixture([[np.arange(n) for n in lengths] for lengths in LENGTHS]))
    return DataLoader(data, batch_sampler=sampler, collate_fn=pieces, num_workers=2, persistent_workers=True,
                      multiprocessing_context=worker_context())  # fmt: skip


def _first_job(rank: int, world_size: int, directory: str) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    sampler = make()
    data, step = loader(sampler), 0
    with open(Path(directory) / f"first.rank{rank}.jsonl", "w") as log:
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            for batch in data:
                step += 1
                if step == CRASH and rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)  # with two live DataLoader workers
                log.write(json.dumps({"step": step, "pieces": batch}) + "\n")
                log.flush()
                dist.all_reduce(torch.ones(1))
                if step % EVERY == 0 and rank == 0:
                    temporary = Path(directory) / "ckpt.tmp"
                    torch.save({"epoch": epoch, "step": step, "state": sampler.state_dict()}, temporary)
                    os.replace(temporary, Path(directory) / "ckpt")
    raise RuntimeError("rank 1 should have been killed")


def _second_job(rank: int, world_size: int, directory: str) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    sampler = make()
    saved = torch.load(Path(directory) / "ckpt", weights_only=False)
    sampler.load_state_dict(saved["state"])
    data = loader(sampler)
    with open(Path(directory) / f"second.rank{rank}.jsonl", "w") as log:
        for epoch in range(saved["epoch"], EPOCHS):
            sampler.set_epoch(epoch)
            for batch in data:
                log.write(json.dumps({"pieces": batch}) + "\n")
                dist.all_reduce(torch.ones(1))


def _records(directory: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(f"{prefix}.rank*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_sigkill_with_workers_then_resume_at_three_ranks_loses_and_repeats_no_piece(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"rank 1 exited with code -9"):
        run_distributed(_first_job, 2, str(tmp_path), timeout=120, collective_timeout=30)
    run_distributed(_second_job, 3, str(tmp_path), timeout=120, collective_timeout=30)
    saved = torch.load(tmp_path / "ckpt", weights_only=False)["step"]
    assert saved == CRASH - 1
    trained: Counter[tuple[int, ...]] = Counter()
    for record in _records(tmp_path, "first"):
        if record["step"] <= saved:
            trained.update(tuple(p) for p in record["pieces"])
    for record in _records(tmp_path, "second"):
        trained.update(tuple(p) for p in record["pieces"])
    plan, one = Counter(), make(num_replicas=1, rank=0)
    for epoch in range(EPOCHS):
        one.set_epoch(epoch)
        plan.update((int(i), i.start, i.stop) for batch in one for i in batch)
    lost, repeated = plan - trained, trained - plan
    largest = max(len(batch) for batch in make(num_replicas=1, rank=0))
    assert not lost, sorted(lost)[:5]
    assert sum(repeated.values()) <= 2 * 2 * largest  # W - 1 = 2 padded batches at each of 2 epoch ends (3 ranks)
