"""Lightning Fabric with every kind of shardwise sampler, on CPU with 2 processes: nothing to add.

``fabric.setup_dataloaders(loader)`` with its default ``use_distributed_sampler=True`` leaves a
shardwise sampler in place (an index sampler is a ``DistributedSampler``; a batch sampler's rebuild
returns the very same object), and Fabric sets the epoch itself on every ``iter(loader)``.

Run (Fabric starts the second process itself)::

    python examples/fabric_ddp.py --out /tmp/fabric

Each rank writes, per sampler kind, the batches it trained on to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from lightning.fabric import Fabric
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

import shardwise

N, BATCH, EPOCHS = 48, 4, 2
LENGTHS = np.arange(N) * 7 % 13 + 1
LABELS = np.arange(N) % 4

# Every kind of shardwise sampler; rank and world size come from the process group unless given.
KINDS: dict[str, Callable[..., Any]] = {
    "ShardedSampler": lambda **world: shardwise.ShardedSampler(range(N), seed=1, **world),
    "WeightedSampler": lambda **world: shardwise.WeightedSampler(LABELS + 1, num_samples=N, seed=1, **world),
    "shard": lambda **world: shardwise.shard(RandomSampler(range(N)), seed=1, **world),
    "BucketBatchSampler": lambda **world: shardwise.BucketBatchSampler(LENGTHS, max_tokens=32, seed=1, **world),
    "ClassBalancedBatchSampler": lambda **world: shardwise.ClassBalancedBatchSampler(
        LABELS, classes_per_batch=2, samples_per_class=2, seed=1, **world),
    "TwoStreamBatchSampler": lambda **world: shardwise.TwoStreamBatchSampler(
        range(16), range(16, N), primary_batch_size=2, secondary_batch_size=2, seed=1, **world),
    "ScheduledBatchSampler": lambda **world: shardwise.ScheduledBatchSampler(
        N, batch_size=shardwise.BatchSizeSchedule.by_epoch({0: 2, 1: 4}), seed=1, **world),
    "shard_batches": lambda **world: shardwise.shard_batches(
        BatchSampler(RandomSampler(range(N)), BATCH, drop_last=False), seed=1, **world),
}  # fmt: skip


def build_loader(kind: str, **world: Any) -> DataLoader[Any]:
    """A plain DataLoader over ``range(N)``: index samplers get ``batch_size``, batch samplers ``batch_sampler``."""
    sampler = KINDS[kind](**world)
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        return DataLoader(list(range(N)), sampler=sampler, batch_size=BATCH)
    return DataLoader(list(range(N)), batch_sampler=sampler)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    model = torch.nn.Linear(1, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.0))

    seen: dict[str, list[list[int]]] = {}
    for kind in KINDS:
        loader = fabric.setup_dataloaders(build_loader(kind))  # the default: use_distributed_sampler=True
        seen[kind] = []
        for epoch in range(EPOCHS):  # Fabric calls set_epoch(epoch) on the sampler at every iter(loader)
            for batch in loader:
                loss = model(batch.float().unsqueeze(1)).sum() * 0.0  # DDP all-reduces: ranks stay in lockstep
                fabric.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                seen[kind].append([epoch, *batch.tolist()])
    with open(os.path.join(args.out, f"rank{fabric.global_rank}.json"), "w") as file:
        json.dump(seen, file)
    if fabric.global_rank == 0:
        print(" ".join(f"{kind}: {len(batches)} batches" for kind, batches in seen.items()))
    # A clean exit with gloo: no collective in flight, the DDP model freed before the process group.
    fabric.barrier()
    del model, optimizer
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
