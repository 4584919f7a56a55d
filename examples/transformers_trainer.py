"""HF transformers Trainer with a shardwise sampler, on CPU with 2 processes; resume from a checkpoint exactly.

A tiny GPT-2 (2 layers, 64-token vocabulary) built from a config with random weights, on a synthetic
token dataset of variable-length samples: nothing is downloaded.

Run (2 CPU processes: the script sets ``use_cpu=True, ddp_backend="gloo"``; on GPUs remove those two
arguments and launch with ``torchrun`` or ``accelerate launch`` as usual)::

    python -m torch.distributed.run --nproc-per-node 2 --standalone examples/transformers_trainer.py \
        --out /tmp/hf --strategy group_by_length

then resume from the checkpoint saved mid-epoch 0 (at any world size, e.g. ``--nproc-per-node 1``)::

    python -m torch.distributed.run --nproc-per-node 2 --standalone examples/transformers_trainer.py \
        --out /tmp/hf --strategy group_by_length --resume /tmp/hf/checkpoints/checkpoint-3

Each rank writes the samples it trained on, batch by batch, with each batch's epoch, to ``<out>/<phase>-rank<r>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from typing import Any

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from shardwise.integrations.transformers import ShardwiseTrainer

VOCAB, N = 64, 96


class TokenDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Synthetic token sequences with a long-tailed length distribution, like text paragraphs."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.lognormal(mean=2.6, sigma=0.7, size=n), 2, 60).astype(int)
        self.samples = [rng.integers(1, VOCAB, size=length).tolist() for length in lengths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.samples[index], "idx": index}


def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad to the longest sample of the batch; padding is masked out of attention and loss."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for row, feature in enumerate(features):
        ids[row, : len(feature["input_ids"])] = torch.tensor(feature["input_ids"])
        mask[row, : len(feature["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100),
            "idx": torch.tensor([f["idx"] for f in features])}  # fmt: skip


class RecordingTrainer(ShardwiseTrainer):  # type: ignore[misc]
    """Records the samples of every trained batch (only to show what each rank trained on)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[list[int]] = []
        self.epochs: list[int] = []  # the epoch of each batch of seen

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.seen.append([self.state.global_step, *inputs.pop("idx").tolist()])
        self.epochs.append(int(self.state.epoch or 0))  # epoch + fraction done; below epoch + 1 until it ends
        return super().training_step(model, inputs, *args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="group_by_length", choices=["random", "sequential", "group_by_length"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--save-steps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--mp-context", choices=["fork", "forkserver", "spawn"],
                        help="how DataLoader workers start (forkserver on CPython < 3.11.8 with workers: gh-112275)")
    parser.add_argument("--resume", default=None, help="a checkpoint folder to resume from")
    parser.add_argument("--phase", default=None, help="name of the output files (default: run or resume)")
    options = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=os.path.join(options.out, "checkpoints"),
        train_sampling_strategy=options.strategy,  # group_by_length: shardwise.BucketBatchSampler
        per_device_train_batch_size=options.batch_size,
        gradient_accumulation_steps=options.grad_accum,
        num_train_epochs=options.epochs,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=options.save_steps,
        dataloader_num_workers=options.workers,
        dataloader_multiprocessing_context=options.mp_context,
        remove_unused_columns=False,  # the collator's "idx" is recorded, then removed, by RecordingTrainer
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        seed=7,
        report_to="none",
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = RecordingTrainer(model=model, args=args, train_dataset=TokenDataset(N), data_collator=collate)
    trainer.train(resume_from_checkpoint=options.resume)

    phase = options.phase or ("resume" if options.resume else "run")
    rank = args.process_index
    with open(os.path.join(options.out, f"{phase}-rank{rank}.json"), "w") as file:
        json.dump({"seen": trainer.seen, "epochs": trainer.epochs, "world": args.world_size,
                   "global_step": trainer.state.global_step, "sampler": repr(trainer.train_sampler)}, file)  # fmt: skip
    if rank == 0:
        print(f"{phase}: {trainer.train_sampler!r}: {len(trainer.seen)} batches on rank 0, "
              f"global step {trainer.state.global_step}")  # fmt: skip
    if torch.distributed.is_initialized():
        # A clean exit with gloo: wait until no collective is in flight, free the DDP model while
        # the process group is still registered, then destroy the group. (Freeing DDP's reducer at
        # interpreter exit while gloo's thread still releases a finished all-gather deadlocks torch.)
        trainer.accelerator.wait_for_everyone()
        del trainer, model
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
