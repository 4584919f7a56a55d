"""AdaptiveMixtureTrainer: a real HF ``Trainer`` (tiny GPT-2, CPU) moves mixture weights from its per-sample loss.

Three sources of different difficulty (a repeated token, a counting pattern, random tokens); the
weights follow the loss the Trainer computes, the sources the mixin reads off the plan are the
batch's own, checkpoints carry the ledger, and a resume from one continues the same ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardwise import AdaptiveWeights, ExponentiatedGradient, Mixture, MixtureSampler
from shardwise.samplers.adaptive import AdaptiveMixture

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

VOCAB, LENGTH, BATCH, INTERVAL, NUM_SAMPLES = 32, 12, 4, 16, 64  # 4 steps an interval, 16 a epoch


class Source(torch.utils.data.Dataset[dict[str, Any]]):
    """Token sequences of one kind: ``repeat`` (one token), ``count`` (i, i+1, ...) or ``noise`` (random)."""

    def __init__(self, kind: str, n: int) -> None:
        rng = np.random.default_rng(len(kind))
        starts = rng.integers(1, VOCAB, n)
        self.rows = [
            [int(s)] * LENGTH if kind == "repeat" else
            [int((s + i) % (VOCAB - 1) + 1) for i in range(LENGTH)] if kind == "count" else
            rng.integers(1, VOCAB, LENGTH).tolist()
            for s in starts
        ]  # fmt: skip

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.rows[index]}


COLLATED: list[list[int]] = []


def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack the rows (all of one length); note each batch's sources, which the model must not receive."""
    COLLATED.append([int(f["source"]) for f in features])
    ids = torch.tensor([f["input_ids"] for f in features])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _train(folder: Path, monkeypatch: pytest.MonkeyPatch, resume: str | None = None
           ) -> tuple[MixtureSampler, list[list[int]]]:  # fmt: skip
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardwise.integrations.adaptive_mixture import AdaptiveMixtureTrainer

    data = Mixture({"repeat": Source("repeat", 30), "count": Source("count", 30), "noise": Source("noise", 30)},
                   source_key="source")  # fmt: skip
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=1.0, smoothing=0.5, floor=0.1), interval=INTERVAL)
    sampler = MixtureSampler(data, adaptive, num_samples=NUM_SAMPLES, block=10, seed=1, num_replicas=1, rank=0)
    recorded: list[list[int]] = []
    record = AdaptiveMixture.record

    def spy(adaptive: AdaptiveMixture, values: Any, sources: Any) -> None:
        recorded.append(list(map(int, sources)))
        record(adaptive, values, sources)

    monkeypatch.setattr(AdaptiveMixture, "record", spy)
    args = TrainingArguments(str(folder), per_device_train_batch_size=BATCH, num_train_epochs=2, save_strategy="steps",
                             save_steps=8, use_cpu=True, remove_unused_columns=False, report_to="none",
                             disable_tqdm=True, logging_strategy="no", seed=5, learning_rate=5e-3)  # fmt: skip
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=0)  # fmt: skip
    trainer = AdaptiveMixtureTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data,
                                     data_collator=collate, train_sampler=sampler)  # fmt: skip
    COLLATED.clear()
    trainer.train(resume_from_checkpoint=resume)
    assert recorded == COLLATED[: len(recorded)]  # the plan's sources are each trained batch's own
    return sampler, recorded


def test_the_trainer_moves_weights_from_its_loss_and_a_resume_continues_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two epochs of 16 steps: 8 updates, weight moves off the easy source; a resume at step 8 gives the same ledger."""
    import json

    sampler, recorded = _train(tmp_path, monkeypatch)
    ledger = sampler.adaptive.ledger
    assert ledger.updates == 2 * NUM_SAMPLES // INTERVAL and len(recorded) == 32
    assert ledger.weights[-1][0] < ledger.weights[0][0]  # the repeated token is learnt first
    saved = json.loads((tmp_path / "checkpoint-8" / "shardwise_sampler.json").read_text())
    assert saved["sampler"]["adaptive"]["updates"] == 2 and saved["sampler"]["consumed"] == 32
    resumed, _ = _train(tmp_path, monkeypatch, resume=str(tmp_path / "checkpoint-8"))
    assert (resumed.adaptive.ledger.shares == ledger.shares).all()


def test_packed_batches_are_refused_not_recorded_row_by_row(tmp_path: Path) -> None:
    """A MixtureSampler's packed rows hold several documents: one loss a row cannot be a sample's; it says so."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardwise import PackCollate, PackedDataset
    from shardwise.integrations.adaptive_mixture import AdaptiveMixtureTrainer

    data = Mixture({"repeat": Source("repeat", 30), "noise": Source("noise", 30)})
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=1.0, smoothing=0.5, floor=0.1), interval=INTERVAL)
    sampler = MixtureSampler(data, adaptive, num_samples=NUM_SAMPLES, block=10, seed=1, num_replicas=1, rank=0)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=BATCH, max_steps=2, use_cpu=True,
                             remove_unused_columns=False, report_to="none", disable_tqdm=True)  # fmt: skip
    config = GPT2Config(vocab_size=VOCAB, n_positions=4 * LENGTH, n_embd=16, n_layer=1, n_head=2)
    trainer = AdaptiveMixtureTrainer(model=GPT2LMHeadModel(config), args=args,
                                     train_dataset=PackedDataset(data, field="input_ids"),
                                     data_collator=PackCollate(max_len=2 * LENGTH), train_sampler=sampler)  # fmt: skip
    with pytest.raises(ValueError, match="got packed batches"):
        trainer.train()
    assert sampler.adaptive.ledger.updates == 0 and sampler.adaptive.pending == 0


def test_packed_mixture_batches_report_each_tokens_loss_to_its_source_and_resume_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PackedMixtureSampler through the Trainer: each predicted token's loss goes to its document's source."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardwise import PackCollate, PackedMixtureSampler
    from shardwise.integrations.adaptive_mixture import AdaptiveMixtureTrainer

    sources = {"repeat": Source("repeat", 30), "count": Source("count", 30), "noise": Source("noise", 30)}
    data = Mixture(sources)

    def train(resume: str | None) -> tuple[PackedMixtureSampler, list[np.ndarray]]:
        adaptive = AdaptiveWeights(ExponentiatedGradient(rate=1.0, smoothing=0.5, floor=0.1), interval=4)
        lengths = {name: [LENGTH] * len(source) for name, source in sources.items()}
        sampler = PackedMixtureSampler(lengths, adaptive, max_len=2 * LENGTH, rows_per_batch=2, num_batches=16,
                                       seed=1, num_replicas=1, rank=0)  # fmt: skip
        recorded: list[np.ndarray] = []
        record = AdaptiveMixture.record

        def spy(adaptive: AdaptiveMixture, values: Any, found: Any) -> None:
            recorded.append(np.bincount(np.asarray(found), minlength=3))
            record(adaptive, values, found)

        monkeypatch.setattr(AdaptiveMixture, "record", spy)
        args = TrainingArguments(str(tmp_path), num_train_epochs=2, save_strategy="steps", save_steps=8,
                                 use_cpu=True, report_to="none", disable_tqdm=True, logging_strategy="no", seed=5,
                                 learning_rate=5e-3)  # fmt: skip
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=VOCAB, n_positions=2 * LENGTH, n_embd=16, n_layer=1, n_head=2)
        collator = PackCollate(max_len=2 * LENGTH, rows=2)
        trainer = AdaptiveMixtureTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data,
                                         data_collator=collator, train_sampler=sampler)  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return sampler, recorded

    sampler, recorded = train(None)
    expected = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for position in range(16):
            ids, _, starts, stops = sampler.plan.core.batch(epoch, sampler.seed, position)
            # a piece's first token is no target (a document's first label is -100, and so is a row's first position)
            expected.append(np.bincount(sampler.sources_of(ids), weights=stops - starts - 1, minlength=3).astype(int))
    assert len(recorded) == 32 and all((r == e).all() for r, e in zip(recorded, expected, strict=True))
    ledger = sampler.adaptive.ledger
    assert ledger.updates == 8 and not np.allclose(ledger.weights[-1], ledger.weights[0])
    resumed, _ = train(str(tmp_path / "checkpoint-8"))
    assert (resumed.adaptive.ledger.shares == ledger.shares).all()
