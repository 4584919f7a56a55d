"""Plain PyTorch DDP under torchrun with shardwise: sampler, batch sampler, worker seeds, epochs.

Run (2 CPU processes, gloo)::

    python -m torch.distributed.run --nproc-per-node 2 --standalone examples/torchrun_ddp.py --out /tmp/torchrun

Each rank writes the batches it trained on to ``<out>/rank<r>.json``. Nothing here passes a rank
or a world size: shardwise resolves them from the process group (or torchrun's ``RANK`` and
``WORLD_SIZE``) when the loader is first iterated.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import shardwise

SEED, EPOCHS = 1234, 2


class Noisy(Dataset[tuple[int, float]]):
    """Sample ``i`` is ``(i, noise)``: the noise comes from the worker's seeded torch generator."""

    def __len__(self) -> int:
        return 120

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, float(torch.rand(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="folder for rank<r>.json (created if missing)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)  # every rank may create it: exist_ok makes that race harmless
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # shows the worker-seed log lines

    dist.init_process_group("gloo")
    sampler = shardwise.TwoStreamBatchSampler(
        range(24), range(24, 120), primary_batch_size=4, secondary_batch_size=4, seed=SEED
    )
    loader = DataLoader(
        Noisy(),
        batch_sampler=sampler,
        num_workers=2,
        # The loader draws a new base seed every epoch from this generator (alike on every rank);
        # seed_worker hashes it with the global rank and the worker id: a distinct stream for
        # every (rank, worker) pair, new every epoch, the same on a rerun.
        generator=torch.Generator().manual_seed(SEED),
        worker_init_fn=shardwise.seed_worker,
    )
    if dist.get_rank() == 0:
        print(sampler.describe())  # record the seed and the plan of the run
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    seen = []
    for epoch in range(EPOCHS):
        shardwise.set_epoch(loader, epoch)  # sampler, batch sampler, nested samplers, dataset
        for indices, noise in loader:
            loss = model(noise.float().unsqueeze(1)).pow(2).mean()  # DDP all-reduces gradients every step
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append({"epoch": epoch, "indices": indices.tolist(), "noise": noise.tolist()})
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as file:
        json.dump(seen, file)
    # A clean exit with gloo: no collective in flight, the DDP model (which holds the process group)
    # freed while the interpreter is alive, then the group destroyed.
    dist.barrier()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
