"""Packed attention does not leak across documents: a packed row's logits equal each document run alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

# The model of bench/bench_packing_train.py (the bench package, importable from the repository root).
from bench.bench_packing_train import Segments, TinyCausalLM

from shardwise import PackedBatchSampler, PackedDataset, pack_collate


def _alone(model: TinyCausalLM, doc: np.ndarray) -> torch.Tensor:
    ids = torch.from_numpy(doc)[None]
    causal = torch.ones(doc.size, doc.size, dtype=torch.bool).tril()[None, None]
    return model(ids, torch.arange(doc.size)[None], causal)[0]


@pytest.mark.parametrize("varlen", [False, True], ids=["block-diagonal mask", "cu_seqlens segments"])
def test_packed_logits_equal_each_document_alone(varlen: bool) -> None:
    """With pack_collate's mask (or its cu_seqlens) and position_ids, every document's logits are its own."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 50, size=n) for n in (5, 17, 1, 30, 9, 12, 3, 22, 40, 8)]
    model = TinyCausalLM(vocab=50, dim=32, layers=2, heads=4, max_len=64).eval()
    sampler = PackedBatchSampler([d.size for d in docs], max_len=64, rows_per_batch=2, num_replicas=1, rank=0)
    data = PackedDataset(docs)
    checked = 0
    with torch.no_grad():
        for keys in sampler:
            batch = pack_collate([data[k] for k in keys], max_len=64, attention_mask=not varlen)
            mask = Segments(batch.cu_seqlens, group=3) if varlen else batch.attention_mask
            logits = model(batch.input_ids, batch.position_ids, mask)
            for key in keys:
                where = batch.sample_ids[key.row] == int(key)
                torch.testing.assert_close(logits[key.row][where], _alone(model, docs[int(key)]), rtol=1e-4, atol=1e-5)
                checked += 1
    assert checked == len(docs)


def test_a_plain_causal_mask_would_leak_across_documents() -> None:
    """The check above has teeth: with one causal mask over the whole row, a later document's logits change."""
    torch.manual_seed(0)
    model = TinyCausalLM(vocab=50, dim=32, layers=1, heads=4, max_len=64).eval()
    first, second = np.arange(1, 8), np.arange(10, 16)
    batch = pack_collate([first, second], max_len=16)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        leaked = model(batch.input_ids, batch.position_ids, causal)[0, 7:13]
        assert not torch.allclose(leaked, _alone(model, second), atol=1e-3)
