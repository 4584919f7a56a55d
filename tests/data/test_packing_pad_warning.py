"""transformers' "We strongly recommend passing in an `attention_mask`" on packed rows: real, harmless, and explained.

GPT-2 logs it once when a row starts or ends with the pad id and no mask is given, as a packed row's
padding tail does (TRL's packed recipe in docs/transformers.md prints it). The documents stay apart
through ``position_ids`` (tests/data/test_packing_hf.py checks the logits); the page says why.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import shardwise
from shardwise.data.attention import packing_leak

transformers = pytest.importorskip("transformers")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "transformers.md"
WARNING = "We strongly recommend passing in an `attention_mask` since your input_ids may be padded"


def test_the_attention_mask_advice_on_packed_rows_is_explained() -> None:
    """A packed batch (padding tail, pad id 0) makes GPT-2 log the advice; the batch keeps documents apart without a
    mask (tail after every document, labels -100, positions restarting), and docs/transformers.md says why."""
    config = transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=2, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    collate = shardwise.PackCollate(max_len=64, rows=2, model=model)
    batch = collate([list(range(2, 30)), list(range(5, 20)), list(range(40, 50))])
    assert packing_leak(model, batch) is None  # nothing attends across documents
    ids, labels, positions = batch["input_ids"], batch["labels"], batch["position_ids"]
    tail = ids[:, -1] == 0
    assert bool(tail.any()) and bool((labels[ids == 0] == -100).all())
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logger = transformers.utils.logging.get_logger("transformers.modeling_utils")
    logging.Logger.warning_once.cache_clear()  # type: ignore[attr-defined]  # logged once a process
    logger.addHandler(handler)
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        logger.removeHandler(handler)
    assert any(message.startswith(WARNING) for message in logged), logged
    assert int(positions[0, 0]) == 0
    page = " ".join(DOCS.read_text().split())
    assert f'"{WARNING}"' in page
    assert "It does not apply here: the `position_ids` restart at 0 at every document and at the tail" in page
