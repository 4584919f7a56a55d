"""Progressive resizing with Lightning: the batch and image sizes follow a schedule, in lockstep on 2 ranks.

Small images in large batches first, larger images in smaller batches later. The schedule is part
of the sampler's plan, so the size changes mid-epoch and at epoch boundaries without
``reload_dataloaders_every_n_epochs``, every rank runs the same steps with the same sizes, and
the DataLoader workers resize each sample to the size of its step (the payload).

Run (2 CPU processes, gloo, ``ddp_spawn``)::

    python examples/progressive_resizing_lightning.py --out /tmp/progressive

Every rank writes ``rank<r>.json``: one record per training step (epoch, step, batch size, image
size, sample indices); rank 0's launcher prints the per-step sizes of every rank at the end.

Two settings matter:

- ``use_distributed_sampler=False``: shardwise shards by itself (rank and world size are resolved
  lazily, inside each spawned process), so Lightning must not wrap the batch sampler.
- :class:`shardwise.integrations.lightning.FollowEpochLength`: Lightning reads the number of
  training batches once, at the first epoch, and ends any later epoch at that count. When the
  schedule changes the number of steps per epoch, the callback re-reads ``len(train_dataloader)``
  (exact, the same on every rank) at each epoch start.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from shardwise import BatchSizeSchedule, ScheduledBatchSampler
from shardwise.integrations.lightning import FollowEpochLength

SAMPLES = 96
EPOCHS = 3
SCHEDULE = BatchSizeSchedule.by_samples(
    {
        0: (8, {"size": 16}),  # epoch 0 starts at sample 0 with 8 images of 16x16 per rank
        48: (6, {"size": 24}),  # mid-epoch 0
        96: (4, {"size": 32}),  # epoch 1 (starts at sample 96)
        192: (3, {"size": 40}),  # epoch 2 (starts at sample 192)
        240: (2, {"size": 48}),  # mid-epoch 2
    }
)
"""Per-rank batch size and image size, by samples consumed over the run (all ranks together)."""


class ResizingImages(Dataset[tuple[torch.Tensor, int, int]]):
    """Synthetic images, made at full size and resized to the step's payload inside the worker.

    Items are ``(index, payload)`` pairs, as ``ScheduledBatchSampler`` yields them.
    """

    def __init__(self, size: int, full_size: int = 48) -> None:
        self.size = size
        self.full_size = full_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, item: tuple[int, dict[str, int]]) -> tuple[torch.Tensor, int, int]:
        index, payload = item
        generator = torch.Generator().manual_seed(index)
        image = torch.rand(3, self.full_size, self.full_size, generator=generator)
        side = payload["size"]
        resized = F.interpolate(image[None], size=(side, side), mode="bilinear", align_corners=False)[0]
        return resized, index % 10, index


class TinyNet(LightningModule):
    """A convolution, global pooling and a linear head: works at any image size."""

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.features = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.head = nn.Linear(8, 10)
        self.records: list[dict[str, Any]] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(F.relu(self.features(images)), 1).flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels, indices = batch
        self.records.append(
            {
                "epoch": self.current_epoch,
                "step": self.global_step,
                "batch_idx": batch_idx,
                "batch_size": images.shape[0],
                "image_size": images.shape[-1],
                "indices": indices.tolist(),
            }
        )
        return F.cross_entropy(self(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        sampler = ScheduledBatchSampler(SAMPLES, batch_size=SCHEDULE, seed=0)  # rank/world resolved lazily
        return DataLoader(ResizingImages(SAMPLES), batch_sampler=sampler, num_workers=0)

    def on_train_end(self) -> None:
        path = Path(self.out_dir) / f"rank{self.global_rank}.json"
        path.write_text(json.dumps({"world_size": self.trainer.world_size, "records": self.records}))


def size_table(out_dir: Path) -> str:
    """Per-step (batch size, image size) of every rank, side by side."""
    ranks = sorted(out_dir.glob("rank*.json"))
    records = [json.loads(path.read_text())["records"] for path in ranks]
    lines = ["epoch step " + " ".join(f"{path.stem:>12}" for path in ranks)]
    for step in range(max(len(r) for r in records)):
        cells = []
        for rank_records in records:
            record = rank_records[step] if step < len(rank_records) else None
            cells.append(f"{record['batch_size']:>4} x {record['image_size']:>2}px" if record else f"{'-':>12}")
        epoch = records[0][step]["epoch"] if step < len(records[0]) else "-"
        lines.append(f"{epoch:>5} {step:>4} " + " ".join(f"{cell:>12}" for cell in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for the per-rank records (default: a temp dir)")
    args = parser.parse_args()
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="progressive-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=EPOCHS,
        use_distributed_sampler=False,  # shardwise deals the plan to ranks itself
        callbacks=[FollowEpochLength()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyNet(str(out_dir)))
    print(size_table(out_dir))
    print(f"records: {out_dir}")


if __name__ == "__main__":
    main()
