"""Adaptive mixtures over sharded sources (local Parquet shards) and over packed rows, through DataLoader workers.

The data path of issue 31's "with sharded sources" and "with packing where sources feed packed
rows": records, an update, and a resume from ``state_dict`` mid-run that continues the identical
draws and ledger. Packed rows come from ``PackCollate`` over the samples a ``MixtureSampler``
batch yields (``PackedDataset`` over the ``Mixture``): each document's loss is read off
``document_ids``/``sample_ids``, its source off the plan (``sampler.sources_of``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from shardwise import (
    AdaptiveWeights,
    ExponentiatedGradient,
    Mixture,
    MixtureSampler,
    PackCollate,
    PackedBatch,
    PackedDataset,
    ShardedSource,
    which,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SHARDS = {"prose": [40, 25, 35], "code": [30, 20]}  # uneven Parquet shards per source
BASE = {"prose": 0, "code": 1000, "noise": 2000}  # a sample's "id" is BASE + its index in its source
BATCH, INTERVAL, NUM_SAMPLES, MAX_LEN = 16, 64, 384, 32


def _tokens(sample_id: int) -> list[int]:
    """2 to 13 token ids in [0, 16): the same for a sample wherever it is read."""
    return [(sample_id * 7 + k * 3) % 16 for k in range(sample_id % 12 + 2)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adaptive-shards")
    for name, sizes in SHARDS.items():
        first = BASE[name]
        for s, size in enumerate(sizes):
            ids = list(range(first, first + size))
            table = pa.table({"id": ids, "tokens": [_tokens(i) for i in ids]})
            pq.write_table(table, root / f"{name}-{s}.parquet", row_group_size=8)
            first += size
    return root


def _data(root: Path, **kwargs: Any) -> Mixture:
    """Two sharded sources and an in-memory one (noise), in one Mixture."""
    sources: dict[str, Any] = {
        name: ShardedSource([str(root / f"{name}-{s}.parquet") for s in range(len(sizes))], index_dir=root / "index")
        for name, sizes in SHARDS.items()
    }
    sources["noise"] = [{"id": BASE["noise"] + i, "tokens": _tokens(BASE["noise"] + i)} for i in range(30)]
    return Mixture(sources, **kwargs)


def _sampler(data: Mixture) -> MixtureSampler:
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=2.0), interval=INTERVAL)
    return MixtureSampler(data, adaptive, num_samples=NUM_SAMPLES, block=32, seed=3, num_replicas=1, rank=0)


def _plan(sampler: MixtureSampler) -> list[int]:
    """The epoch's draws, step by step, as ``which`` answers them from the ledger."""
    steps = range(NUM_SAMPLES // BATCH)
    found = [which(sampler, epoch=0, step=s, rank=0, batch_size=BATCH, world_size=1)[0] for s in steps]
    return [int(i) for step in found for i in step.indices]


def _rows(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return samples  # rows of varying token lists: kept as a list (picklable, for the workers)


def _run(sampler: MixtureSampler, loader: DataLoader[Any], step: Callable[[Any], list[int]], stop: int | None = None
         ) -> list[list[int]]:  # fmt: skip
    """The recipe's loop: ``step`` records a batch's losses and returns its samples; update when due."""
    seen: list[list[int]] = []
    for batch in loader:
        seen.append(step(batch))
        if sampler.adaptive.update_due():
            sampler.adaptive.update()
        if len(seen) == stop:
            break
    return seen


def test_sharded_sources_feed_an_adaptive_mixture_through_two_workers(shards: Path) -> None:
    """Mixture({name: ShardedSource}) with AdaptiveWeights, 2 workers: records, updates, an exact resume mid-run."""

    def trained(stop: int | None = None, state: dict[str, Any] | None = None) -> tuple[list[list[int]], MixtureSampler]:
        data = _data(shards, source_key="source")
        sampler = _sampler(data)
        if state is not None:
            sampler.load_state_dict(state)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=2, collate_fn=_rows)

        def step(batch: list[dict[str, Any]]) -> list[int]:
            ids = [row["id"] for row in batch]
            sampler.adaptive.record([i % 3 + 2 * (i >= BASE["noise"]) for i in ids], [row["source"] for row in batch])
            return ids

        return _run(sampler, loader, step, stop), sampler

    whole, sampler = trained()
    assert len(whole) == NUM_SAMPLES // BATCH and sampler.adaptive.ledger.updates == NUM_SAMPLES // INTERVAL
    assert int(np.argmax(sampler.adaptive.ledger.weights[-1])) == 2  # the noise reports the highest loss
    data = _data(shards)
    for index, row_id in zip(_plan(sampler), [i for batch in whole for i in batch], strict=True):
        source, within = data.locate(index)
        assert row_id == BASE[data.names[source]] + within  # the shard rows are the plan's samples
    head, first = trained(stop=8)  # checkpoint right after update 2 (position 128)
    state = first.state_dict()
    assert state["consumed"] == 8 * BATCH and state["adaptive"]["updates"] == 2 and first.adaptive.pending == 0
    assert len(state["fingerprint"]["dataset"]) == 3  # both sharded sources' fingerprints (and None for the list)
    tail, resumed = trained(state=state)
    assert head + tail == whole
    assert (resumed.adaptive.ledger.shares == sampler.adaptive.ledger.shares).all()
    assert (resumed.adaptive.ledger.state == sampler.adaptive.ledger.state).all()


class Bigram(torch.nn.Module):
    """A stand-in for a causal LM: the next token's logits from the current token alone."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.embed(input_ids))
        return logits


def document_losses(batch: PackedBatch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each packed document's mean next-token loss and its dataset index (documents without a target left out)."""
    labels = batch.labels[:, 1:]  # -100 on every document's first token and on padding
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels, reduction="none")
    target = labels != -100
    documents = batch.document_ids[:, 1:][target]  # a target's document is the predicted token's
    count = int(batch.document_ids.max()) + 1
    sums = torch.zeros(count).index_add_(0, documents, losses[target])
    counts = torch.bincount(documents, minlength=count)
    real = batch.document_ids >= 0
    samples = torch.full((count,), -1).scatter_(0, batch.document_ids[real], batch.sample_ids[real])
    kept = counts > 0
    return sums[kept] / counts[kept], samples[kept]


def test_mixture_sources_feed_packed_rows_with_per_document_losses(shards: Path) -> None:
    """PackCollate over a MixtureSampler's batches: per-document losses by source, an update, an exact resume."""
    model = Bigram()

    def trained(stop: int | None = None, state: dict[str, Any] | None = None) -> tuple[list[list[int]], MixtureSampler]:
        data = _data(shards)
        sampler = _sampler(data)
        if state is not None:
            sampler.load_state_dict(state)
        loader = DataLoader(PackedDataset(data, field="tokens"), batch_size=BATCH, sampler=sampler, num_workers=2,
                            collate_fn=PackCollate(max_len=MAX_LEN))  # fmt: skip

        def step(batch: PackedBatch) -> list[int]:
            with torch.no_grad():
                losses, samples = document_losses(batch, model(batch.input_ids))
            sampler.adaptive.record(losses, sampler.sources_of(samples))
            return samples.tolist()

        return _run(sampler, loader, step, stop), sampler

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # every update sees recorded losses
        whole, sampler = trained()
    assert sampler.adaptive.ledger.updates == NUM_SAMPLES // INTERVAL
    assert not np.allclose(sampler.adaptive.ledger.weights[-1], sampler.adaptive.ledger.weights[0])
    plan = _plan(sampler)
    assert [i for batch in whole for i in batch] == plan  # every sample has >= 2 tokens: one loss each, in order

    data = _data(shards)  # the packed batch's losses are each document's loss run alone
    batch = PackCollate(max_len=MAX_LEN)([PackedDataset(data, field="tokens")[i] for i in plan[:BATCH]])
    assert batch.input_ids.shape[0] > 1  # several rows of several documents
    with torch.no_grad():
        losses, samples = document_losses(batch, model(batch.input_ids))
        for loss, index in zip(losses.tolist(), samples.tolist(), strict=True):
            tokens = torch.tensor(data[index]["tokens"])
            alone = F.cross_entropy(model(tokens[None])[0, :-1], tokens[1:])
            assert loss == pytest.approx(float(alone), abs=1e-6)

    head, first = trained(stop=12)  # checkpoint right after update 3 (position 192)
    state = first.state_dict()
    assert state["adaptive"]["updates"] == 3 and first.adaptive.pending == 0
    tail, resumed = trained(state=state)
    assert head + tail == whole
    assert (resumed.adaptive.ledger.shares == sampler.adaptive.ledger.shares).all()
