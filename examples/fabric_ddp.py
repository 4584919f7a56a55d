"""Lightning Fabric with every kind of shardwise sampler, on CPU with 2 processes: nothing to add.

``fabric.setup_dataloaders(loader)`` with its default ``use_distributed_sampler=True`` leaves a
shardwise sampler in place (an index sampler is a ``DistributedSampler``; a batch sampler's rebuild
returns the very same object), and Fabric sets the epoch itself on every ``iter(loader)``.

Run (Fabric starts the second process itself)::

    python examples/fabric_ddp.py --out /tmp/fabric

Resume: ``--save`` trains each kind up to its save point (mid-epoch 1, or just after epoch 0's
loop), saves a checkpoint with ``fabric.save`` and stops there, as a crashed run would;
``--resume`` (a new run, any number of devices) loads it and trains to the end. Fabric's own epoch
count restarts at 0 in a new process; ``shardwise.integrations.fabric.load_state_dict`` makes it
continue from the sampler's saved epoch::

    python examples/fabric_ddp.py --out /tmp/fabric --save
    python examples/fabric_ddp.py --out /tmp/fabric --resume

Each rank writes, per sampler kind, the batches it trained on to ``<out>/<phase>-rank<r>.json``
(phase ``run``, ``save`` or ``resume``).
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
from shardwise.integrations import fabric as shardwise_fabric

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


def save_point(kind: str) -> tuple[int, int | None]:
    """Where ``--save`` checkpoints ``kind``: ``(epoch, after that many steps)``, or after the epoch's loop (None)."""
    return (1, 2) if list(KINDS).index(kind) % 2 == 0 else (0, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS), help="sampler kinds to run")
    phases = parser.add_mutually_exclusive_group()
    phases.add_argument("--save", action="store_true", help="stop every kind at its save point, with a checkpoint")
    phases.add_argument("--resume", action="store_true", help="load every kind's checkpoint and train to the end")
    args = parser.parse_args()
    phase = "save" if args.save else "resume" if args.resume else "run"

    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy="ddp")
    fabric.launch()
    model = torch.nn.Linear(1, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.0))

    seen: dict[str, list[list[int]]] = {}
    for kind in args.kinds:
        loader = fabric.setup_dataloaders(build_loader(kind))  # the default: use_distributed_sampler=True
        checkpoint = os.path.join(args.out, f"{kind}.ckpt")
        start = 0
        if phase == "resume":
            remainder = fabric.load(checkpoint, {"model": model, "optimizer": optimizer})
            start = shardwise_fabric.load_state_dict(loader, remainder["sampler"])  # the epoch to continue
        seen[kind] = []
        stop_epoch, stop_step = save_point(kind) if phase == "save" else (None, None)
        for epoch in range(start, EPOCHS):  # Fabric calls set_epoch on the sampler at every iter(loader)
            for step, batch in enumerate(loader, start=1):
                loss = model(batch.float().unsqueeze(1)).sum() * 0.0  # DDP all-reduces: ranks stay in lockstep
                fabric.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                seen[kind].append([epoch, *batch.tolist()])
                if epoch == stop_epoch and step == stop_step:
                    break
            if epoch == stop_epoch:
                state = {"model": model, "optimizer": optimizer, "sampler": shardwise_fabric.state_dict(loader)}
                fabric.save(checkpoint, state)
                break  # the "crash": nothing after the checkpoint is trained
    with open(os.path.join(args.out, f"{phase}-rank{fabric.global_rank}.json"), "w") as file:
        json.dump(seen, file)
    if fabric.global_rank == 0:
        print(phase, " ".join(f"{kind}: {len(batches)} batches" for kind, batches in seen.items()))
    # A clean exit with gloo: no collective in flight, the DDP model freed before the process group.
    fabric.barrier()
    del model, optimizer
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
