"""HF Accelerate with shardwise samplers, on CPU with 2 processes; save mid-epoch, resume in a new run.

Run (2 CPU processes; on GPUs ``accelerate launch --num_processes 2 examples/accelerate_ddp.py ...``)::

    python -m torch.distributed.run --nproc-per-node 2 --standalone examples/accelerate_ddp.py --out /tmp/acc

then resume from the state saved mid-epoch 0:
    python -m torch.distributed.run --nproc-per-node 2 --standalone examples/accelerate_ddp.py --out /tmp/acc --resume

Each rank writes the batches it trained on to ``<out>/<phase>-rank<r>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader

import shardwise
from shardwise.integrations.accelerate import prepare_data_loader

N, EPOCHS, SAVE_AT = 64, 2, 3  # save the state after 3 steps of epoch 0


def build_loader() -> DataLoader[int]:
    lengths = (torch.arange(N) % 13 + 1).numpy()
    sampler = shardwise.BucketBatchSampler(lengths, batch_size=4, seed=7)  # rank and world: from the process group
    return DataLoader(list(range(N)), batch_sampler=sampler)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    # use_stateful_dataloader: save_state stores the loader's state, which holds the sampler's
    # O(1) global position; load_state restores it without replaying a batch.
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    seen, forgot = train(accelerator, os.path.join(args.out, "state"), resume=args.resume)
    phase = "resume" if args.resume else "run"
    with open(os.path.join(args.out, f"{phase}-rank{accelerator.process_index}.json"), "w") as file:
        json.dump({"seen": seen, "forgot": forgot, "world": accelerator.num_processes}, file)
    # A clean exit with gloo: no collective in flight, every object that holds the process group
    # (the DDP model, gathered tensors) freed while the interpreter is alive, then the group destroyed.
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    gc.collect()
    accelerator.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def train(accelerator: Accelerator, state_dir: str, *, resume: bool) -> tuple[list[list[int]], str]:
    """Two epochs; the first run saves its state after SAVE_AT steps, the resumed run loads it."""
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_data_loader(accelerator, build_loader())  # NOT accelerator.prepare(loader): see docs

    forgot = ""
    if not resume:
        # What plain accelerator.prepare does to a shardwise loader: refused before any step.
        try:
            next(iter(accelerator.prepare(build_loader())))
        except RuntimeError as error:
            forgot = str(error)
    else:
        accelerator.load_state(state_dir)

    seen: list[list[int]] = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)  # Accelerate's own epoch counter restarts at 0 in a new process
        for step, batch in enumerate(loader):
            everyone = accelerator.gather(batch)  # a collective every step: ranks stay in lockstep
            seen.append([epoch, *map(int, batch)])
            loss = model(batch.float().unsqueeze(1)).sum() * 0.0 + everyone.float().sum() * 0.0
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if not resume and epoch == 0 and step + 1 == SAVE_AT:
                accelerator.save_state(state_dir)
    return seen, forgot


if __name__ == "__main__":
    main()
