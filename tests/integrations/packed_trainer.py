"""A torchrun script for tests/integrations/test_transformers_packing.py: packed batches through a real Trainer.

A tiny Llama (default config: ``use_cache=True``, SDPA) trains on synthetic documents with
``PackedBatchSampler`` + ``PackedDataset`` + ``PackCollate`` (not fitted to the model: the trainer
fits it), gradient accumulation 2, plain SGD without clipping, so one optimizer step is exactly
``-lr`` times the gradient of the loss over all the target tokens of its ``W x 2`` micro-batches.
``--trainer sft`` runs TRL's ``SFTTrainer`` with the shardwise mixin instead of ``ShardwiseTrainer``.

Writes, per rank, ``<out>/<phase>-rank<r>.json``: every trained micro-batch's global step and the
sample ids of its documents; rank 0 also saves the model's weights after every optimizer step
(``<out>/<phase>-step<s>.pt``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from typing import Any

import numpy as np
import torch
import transformers

import shardwise
from shardwise.integrations.transformers import ShardwiseTrainer, ShardwiseTrainerMixin

VOCAB, DOCS, MAX_LEN, ROWS = 61, 40, 64, 2


def documents() -> list[list[int]]:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(2.8, 0.6, DOCS), 2, MAX_LEN).astype(int)
    return [rng.integers(1, VOCAB, size=n).tolist() for n in lengths]


def model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_LEN,
                                      attn_implementation="sdpa")  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def sampler() -> shardwise.PackedBatchSampler:
    return shardwise.PackedBatchSampler([len(d) for d in documents()], max_len=MAX_LEN, rows_per_batch=ROWS, seed=1)


class Recording:
    """Mixed into the trainer: records each micro-batch's samples (the bookkeeping travels with the batch)."""

    seen: list[list[int]]

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        ids = inputs.sample_ids
        self.seen.append([self.state.global_step, *sorted(set(ids[ids >= 0].tolist()))])  # type: ignore[attr-defined]
        return super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]


class Shardwise(Recording, ShardwiseTrainer):  # type: ignore[misc]
    pass


class SFT(Recording, ShardwiseTrainerMixin, __import__("trl").SFTTrainer):  # type: ignore[misc]
    pass


class SaveWeights(transformers.TrainerCallback):
    def __init__(self, out: str, phase: str) -> None:
        self.out, self.phase = out, phase

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                       os.path.join(self.out, f"{self.phase}-step{state.global_step}.pt"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", required=True)
    parser.add_argument("--trainer", choices=["shardwise", "sft"], default="shardwise")
    parser.add_argument("--resume")
    args = parser.parse_args()
    common: dict[str, Any] = {
        "output_dir": os.path.join(args.out, "checkpoints"), "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 2, "num_train_epochs": 1, "optim": "sgd", "learning_rate": 0.5,
        "lr_scheduler_type": "constant", "max_grad_norm": 0.0, "save_steps": 1, "report_to": [], "use_cpu": True,
        "ddp_backend": "gloo", "logging_strategy": "no", "seed": 0,  # no workers: forked ones can hang on 3.11.7 (gh-112275)
    }  # fmt: skip
    rows = [{"input_ids": d} for d in documents()]
    collate = shardwise.PackCollate(max_len=MAX_LEN, rows=ROWS)  # the trainer fits it to the model
    callbacks = [SaveWeights(args.out, args.phase)]
    trainer: Any
    if args.trainer == "sft":
        import datasets
        import trl
        from tokenizers import Tokenizer, models

        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.WordLevel({str(i): i for i in range(VOCAB)}, unk_token="0")),
            pad_token="0", eos_token="1",
        )  # fmt: skip
        config = trl.SFTConfig(**common, gradient_checkpointing=False, dataset_kwargs={"skip_prepare_dataset": True})
        data = datasets.Dataset.from_list(rows)  # TRL takes HF Datasets only; the trainer reads it as packed pieces
        trainer = SFT(model=model(), args=config, train_dataset=data, data_collator=collate,
                      processing_class=tokenizer, train_sampler=sampler(), callbacks=callbacks)  # fmt: skip
    else:
        data = shardwise.PackedDataset(rows, field="input_ids")
        trainer = Shardwise(model=model(), args=transformers.TrainingArguments(**common), train_dataset=data,
                            data_collator=collate, train_sampler=sampler(), callbacks=callbacks)  # fmt: skip
    trainer.seen = []
    trainer.train(resume_from_checkpoint=args.resume)
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(args.out, f"{args.phase}-rank{rank}.json"), "w", encoding="utf-8") as file:
        json.dump({"seen": trainer.seen, "collator": repr(trainer.data_collator)}, file)
    if torch.distributed.is_initialized():
        # A clean exit with gloo, as examples/transformers_trainer.py does: no collective in flight, the DDP model
        # freed while the group is registered, then the group destroyed (else the exit can abort in gloo's thread).
        trainer.accelerator.wait_for_everyone()
        del trainer
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
