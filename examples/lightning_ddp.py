"""PyTorch Lightning with a shardwise batch sampler, default Trainer settings, 2 CPU processes.

Run (Lightning spawns the 2 processes itself; ``strategy="ddp"`` under torchrun works the same)::

    python examples/lightning_ddp.py --out /tmp/lightning

Nothing shardwise-specific is configured on the Trainer: Lightning keeps the batch sampler as it
is (it is already distributed) and its ``set_epoch`` reaches it every epoch. The loader is a
torchdata ``StatefulDataLoader`` so a mid-epoch checkpoint resumes without replaying batches.
Each rank writes the batches it trained on to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

import shardwise


class Indices(Dataset[int]):
    def __len__(self) -> int:
        return 120

    def __getitem__(self, index: int) -> int:
        return index


class Model(LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out = out
        self.seen: list[list[int]] = []

    def train_dataloader(self) -> Any:
        sampler = shardwise.TwoStreamBatchSampler(
            range(24),  # labelled: each seen once per epoch, split across ranks
            range(24, 120),  # unlabelled: an endless reshuffled stream
            primary_batch_size=4,
            secondary_batch_size=4,
            seed=1234,
        )
        return StatefulDataLoader(Indices(), batch_sampler=sampler)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append([self.current_epoch, *map(int, batch)])
        return self.layer(batch.float().unsqueeze(1)).mean()

    def on_train_end(self) -> None:
        with open(os.path.join(self.out, f"rank{self.global_rank}.json"), "w") as file:
            json.dump(self.seen, file)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.001)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="ddp_spawn")
    args = parser.parse_args()
    seed_everything(1234, verbose=False)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=args.strategy, max_epochs=3, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Model(args.out))


if __name__ == "__main__":
    main()
