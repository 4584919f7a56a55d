"""Samples lost and repeated by one resume, per checkpoint path (issue #16): before/after figures.

Two ranks (explicit ``num_replicas=2``, one process: the ranks are independent given their rank)
train epoch 0 of N=240 samples with batches of 10 (``ShardedSampler`` under ``batch_size=10``,
``BucketBatchSampler(batch_size=10)``); rank 0's state is saved at one of four points; three new
ranks load it and train to the end of epoch 1 with the recipe of docs/torchrun.md (plain
``DataLoader``: save ``sampler.state_dict()``) or docs/torchdata.md (``StatefulDataLoader``:
save ``loader.state_dict()``). Printed: samples lost / samples repeated over epochs 0 and 1, all
ranks together, against the global plan (repeats include the documented padding, 0 here).

Points: ``mid`` after 3 batches; ``end_in_loop`` inside the loop just after the last batch;
``end`` after the epoch's loop; ``next`` after ``set_epoch(1)``.

Run (seconds; no lock needed)::

    python -m bench.resume_loss
    python -m bench.resume_loss --quick   # no DataLoader workers (a smoke test)
"""

from __future__ import annotations

import argparse
import warnings
from collections import Counter
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

import shardwise
from shardwise.tools.scenarios import IndexDataset

N, BATCH, WORLD, NEW_WORLD = 240, 10, 2, 3
POINTS = ("mid", "end_in_loop", "end", "next")


def make(kind: str, world_size: int, rank: int) -> Any:
    world = {"num_replicas": world_size, "rank": rank, "seed": 7}
    if kind == "sharded":
        return shardwise.ShardedSampler(N, **world)
    return shardwise.BucketBatchSampler(np.arange(N) % 17 + 1, batch_size=BATCH, **world)


def loader(kind: str, sampler: Any, path: str, workers: int) -> Any:
    kind_of_loader: Any = DataLoader
    if path == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        kind_of_loader = StatefulDataLoader
    if kind == "sharded":
        return kind_of_loader(IndexDataset(N), sampler=sampler, batch_size=BATCH, num_workers=workers)
    return kind_of_loader(IndexDataset(N), batch_sampler=sampler, num_workers=workers)


def plan(kind: str, epoch: int) -> Counter[int]:
    sampler = make(kind, 1, 0)
    sampler.set_epoch(epoch)
    return Counter(i for unit in sampler for i in ([unit] if kind == "sharded" else unit))


def run(kind: str, path: str, workers: int, point: str, k: int = 3) -> tuple[int, int]:
    """Samples ``(lost, repeated)`` over epochs 0 and 1 through one save and resume."""
    trained: Counter[int] = Counter()
    saved: dict[str, Any] = {}
    for rank in range(WORLD):
        sampler = make(kind, WORLD, rank)
        batches = loader(kind, sampler, path, workers)

        def save(epoch: int, sampler: Any = sampler, batches: Any = batches) -> dict[str, Any]:
            return {"epoch": epoch, "state": sampler.state_dict() if path == "plain" else batches.state_dict()}

        sampler.set_epoch(0)
        checkpoint: dict[str, Any] = {}
        length = len(batches)
        for step, batch in enumerate(batches):
            trained.update(int(i) for i in batch)
            if point == "mid" and step + 1 == k:
                checkpoint = save(0)
                break
            if point == "end_in_loop" and step + 1 == length:
                checkpoint = save(0)
        if point == "end":
            checkpoint = save(1)
        if point == "next":
            sampler.set_epoch(1)
            checkpoint = save(1)
        if rank == 0:
            saved = checkpoint
        del batches
    for rank in range(NEW_WORLD):
        sampler = make(kind, NEW_WORLD, rank)
        batches = loader(kind, sampler, path, workers)
        (sampler if path == "plain" else batches).load_state_dict(saved["state"])
        for epoch in range(saved["epoch"], 2):
            sampler.set_epoch(epoch)
            for batch in batches:
                trained.update(int(i) for i in batch)
        del batches
    expected = plan(kind, 0) + plan(kind, 1)
    return sum((expected - trained).values()), sum((trained - expected).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader workers (default: 0 2)")
    parser.add_argument("--quick", action="store_true", help="--workers 0 (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.workers = [0]
    warnings.filterwarnings("ignore")
    print(f"samples lost/repeated by one resume (N={N}, batch {BATCH}, {WORLD} -> {NEW_WORLD} ranks, prefetch 2)")
    print(f"{'sampler':8s} {'loader':9s} {'workers':7s} " + " ".join(f"{p:>12s}" for p in POINTS))
    for kind in ("sharded", "bucket"):
        for path in ("plain", "stateful"):
            for workers in args.workers:
                counts = [run(kind, path, workers, point) for point in POINTS]
                cells = " ".join(f"{f'{lost}/{repeated}':>12s}" for lost, repeated in counts)
                print(f"{kind:8s} {path:9s} {workers:<7d} {cells}", flush=True)


if __name__ == "__main__":
    main()
