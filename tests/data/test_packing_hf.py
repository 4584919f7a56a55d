"""Packed batches reach real HF models exactly: every document's logits and loss are its own.

Models are built from configs (nothing downloaded), in float32, with their default configs (which
have ``use_cache=True``: the case that silently leaked before). Batches go through the path the
``Trainer`` uses: ``PackCollate(model=...)`` in the loader, then ``Trainer._prepare_inputs`` (which
rebuilds the mapping), then ``model(**inputs)``.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardwise
from shardwise.data.attention import pack_layout, packing_leak

transformers = pytest.importorskip("transformers")

VOCAB = 61


def _model(family: str, implementation: str) -> Any:
    torch.manual_seed(0)
    common = {"vocab_size": VOCAB, "attn_implementation": implementation}
    if family == "llama":  # RoPE
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                                          **common)  # fmt: skip
        return transformers.LlamaForCausalLM(config).eval()
    if family == "gpt2":  # absolute position embeddings
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=96, bos_token_id=0,
                                         eos_token_id=0, **common)  # fmt: skip
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,  # RoPE, GQA, qkv bias
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                                      **common)  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).eval()


def _docs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(1, VOCAB, size=n) for n in (5, 17, 1, 30, 9, 12, 3, 22, 40, 8, 2, 27)]


def _trainer_path(model: Any, tmp_path: Any) -> Any:
    args = transformers.TrainingArguments(str(tmp_path), use_cpu=True, report_to=[])
    return transformers.Trainer(model=model, args=args)._prepare_inputs


def _expected_loss(model: Any, docs: list[np.ndarray], keys: list[Any]) -> torch.Tensor:
    """Each piece of the batch run alone: summed next-token losses over the number of targets."""
    total, count = torch.zeros(()), 0
    for key in keys:
        piece = torch.from_numpy(docs[int(key)][key.start : key.stop])[None]
        if piece.shape[1] < 2:
            continue
        logits = model(input_ids=piece).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits, piece[0, 1:], reduction="sum")
        count += piece.shape[1] - 1
    return total / count


_AVX2 = torch.backends.cpu.get_cpu_capability() == "AVX2"
"""The CPU vector ISA torch uses (and inductor generates kernels for) is AVX2: no AVX512 on the CPU, or
ATEN_CPU_CAPABILITY=avx2."""

# flex_attention compiles on CPU (~20 s a model): one family; GPT-2 has no flex_attention in transformers
# (torch's compile of the block mask raises its own deprecation warnings, which are not ours)
CASES = [(f, i) for f in ("llama", "gpt2", "qwen2") for i in ("sdpa", "eager")] + [
    pytest.param("llama", "flex_attention", marks=[
        pytest.mark.filterwarnings("ignore::DeprecationWarning"),
        # torch 2.13's inductor CPU flex_attention kernel, generated for AVX2 (an AVX512 CPU run with
        # ATEN_CPU_CAPABILITY=avx2 reproduces it), gets batch 2 row 1 (documents 8 and 9, split at 40) wrong:
        # 0.178 and NaN against the documents alone, while AVX512 agrees to 1e-7. Not shardwise: the mask is
        # transformers' own, from position_ids. Not strict: an AVX2 run under another torch, or another
        # AVX2 CPU, that passes shows as XPASS in the summary (-ra), and the mark can go; it never fails CI.
        pytest.mark.xfail(_AVX2, reason="torch inductor's AVX2 CPU flex_attention kernel misapplies transformers' "
                          "packed-sequence mask (batch 2, row 1)", strict=False),
    ]),
]


@pytest.mark.parametrize(("family", "implementation"), CASES)
def test_every_document_of_a_packed_batch_is_its_own(family: str, implementation: str, tmp_path: Any) -> None:
    """Logits of every document inside packed rows equal that document alone; the loss equals theirs by hand."""
    model = _model(family, implementation)
    assert model.config.use_cache is True  # the default config: the case that leaked
    docs = _docs()
    sampler = shardwise.PackedBatchSampler([d.size for d in docs], max_len=48, rows_per_batch=2, num_replicas=1,
                                           rank=0, seed=3)  # fmt: skip
    collate = shardwise.PackCollate(max_len=48, rows=2, model=model)
    loader = DataLoader(shardwise.PackedDataset(docs), batch_sampler=sampler, collate_fn=collate)
    prepare = _trainer_path(model, tmp_path)
    seen = 0
    with torch.no_grad():  # flex_attention runs forward only on CPU
        for keys, batch in zip(sampler, loader, strict=True):
            inputs = prepare(batch)
            assert packing_leak(model, inputs) is None
            out = model(**inputs)
            for key in keys:
                where = batch.sample_ids[key.row] == int(key)
                alone = model(input_ids=torch.from_numpy(docs[int(key)])[None]).logits[0]
                torch.testing.assert_close(out.logits[key.row][where], alone, rtol=1e-4, atol=2e-5)
                seen += 1
            torch.testing.assert_close(out.loss, _expected_loss(model, docs, keys), rtol=1e-5, atol=1e-5)
    assert seen == len(docs)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_default_config_leaks_without_use_cache_false(family: str) -> None:
    """The failure this guards against is real: position_ids alone, default config, logits of a later document change."""
    model = _model(family, "sdpa")
    first, second = np.arange(1, 9), np.arange(20, 27)
    batch = shardwise.pack_collate([first, second], max_len=16)  # no model: rows, no use_cache
    inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids}
    assert "use_cache=True" in (packing_leak(model, inputs) or "")
    with torch.no_grad():
        leaked = model(**inputs).logits[0, 8:15]
        alone = model(input_ids=torch.from_numpy(second)[None]).logits[0]
    assert (leaked - alone).abs().max() > 1e-3


def test_a_four_d_bool_mask_is_refused_for_hf_models_and_named_for_eager() -> None:
    """PackCollate's SDPA mask is for your own model; an HF eager/flex model would misread it."""
    eager = _model("llama", "eager")
    with pytest.raises(ValueError, match=r"attention_mask=True .* only sdpa reads right.*leave attention_mask=False"):
        shardwise.PackCollate(max_len=16, attention_mask=True, model=eager)
    batch = shardwise.pack_collate([np.arange(1, 9), np.arange(20, 27)], max_len=16, attention_mask=True)
    inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "attention_mask": batch.attention_mask}
    assert "'eager' does not read it" in (packing_leak(eager, inputs) or "")
    assert packing_leak(_model("llama", "sdpa"), inputs) is None  # sdpa reads the bool mask right


def test_flash_attention_gets_one_flattened_row_with_varlen_arguments() -> None:
    """flash-attention finds documents only in one row (or from cu_seq_lens): the batch is flattened and carries them."""
    collate = shardwise.PackCollate(max_len=8, rows=2, attn_implementation="flash_attention_2")
    batch = collate([shardwise.PackedSample([1, 2, 3], 0, 0), shardwise.PackedSample([4, 5], 1, 1)])
    assert sorted(batch) == ["cu_seq_lens_k", "cu_seq_lens_q", "input_ids", "labels", "max_length_k", "max_length_q",
                             "position_ids", "use_cache"]  # fmt: skip
    assert batch.input_ids.shape == batch.document_ids.shape == (1, 16)
    assert batch.cu_seq_lens_q.tolist() == [0, 3, 8, 10, 16] and batch.cu_seq_lens_q.dtype == torch.int32
    assert batch.max_length_q == 6 and batch.use_cache is False
    assert batch.labels.tolist()[0] == [-100, 2, 3, -100, -100, -100, -100, -100, -100, 5, -100, -100, -100, -100,
                                        -100, -100]  # fmt: skip


def test_the_batch_is_the_model_keywords_and_keeps_its_bookkeeping_through_moves() -> None:
    """model(**batch) gets exactly the inputs; .to, pin-free copies, pickling (workers) keep the bookkeeping."""
    batch = shardwise.PackCollate(max_len=8, attn_implementation="sdpa")([[1, 2, 3], [4, 5]])
    assert sorted(batch) == ["input_ids", "labels", "position_ids", "use_cache"]
    for moved in (batch.to("cpu"), pickle.loads(pickle.dumps(batch)), batch.to(torch.float16)):
        assert isinstance(moved, shardwise.PackedBatch) and sorted(moved) == sorted(batch)
        assert moved.sample_ids.tolist() == [[0, 0, 0, 1, 1, -1, -1, -1]] and moved.num_tokens == 5
        assert moved.input_ids.dtype == torch.int64
    rebuilt = type(batch)({k: v for k, v in batch.items()})  # Trainer._prepare_input's rebuild
    assert torch.equal(rebuilt.input_ids, batch.input_ids) and rebuilt.attention_mask is None
    with pytest.raises(AttributeError, match="rebuilt from its model inputs alone"):
        _ = rebuilt.sample_ids


def test_layouts_for_models_that_cannot_keep_documents_apart_are_refused() -> None:
    """An unknown or paged attention implementation, or a forward without position_ids: an error, never a leak."""
    with pytest.raises(ValueError, match="cannot tell whether it keeps packed documents apart"):
        pack_layout(attn_implementation="my_kernel")
    with pytest.raises(ValueError, match="paged cache"):
        pack_layout(attn_implementation="paged|sdpa")

    class NoPositions(torch.nn.Module):
        config = type("Config", (), {"_attn_implementation": "sdpa"})()

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
            return input_ids

    with pytest.raises(ValueError, match=r"NoPositions\.forward takes no position_ids"):
        shardwise.PackCollate(max_len=8, model=NoPositions())
    wrapped = torch.nn.Module()
    wrapped.module = _model("gpt2", "eager")  # DDP-style wrapper
    assert pack_layout(wrapped).name == "eager" and pack_layout(torch.nn.Linear(2, 2)).name == "own"


def test_the_device_moves_of_accelerate_lightning_and_the_trainer_keep_the_batch_whole() -> None:
    """Accelerate's send_to_device and Lightning's move_data_to_device call batch.to (bookkeeping kept); a torch
    DataLoader with workers pickles it; the Trainer's rebuild keeps the model inputs."""
    accelerate_ops = pytest.importorskip("accelerate.utils")
    lightning_apply = pytest.importorskip("lightning.fabric.utilities.apply_func")
    docs = _docs()
    sampler = shardwise.PackedBatchSampler([d.size for d in docs], max_len=48, rows_per_batch=2, num_replicas=1, rank=0)
    collate = shardwise.PackCollate(max_len=48, rows=2, attn_implementation="sdpa")
    loader = DataLoader(shardwise.PackedDataset(docs), batch_sampler=sampler, collate_fn=collate, num_workers=1)
    batch = next(iter(loader))  # made in a worker process, pickled back
    for moved in (accelerate_ops.send_to_device(batch, "cpu"), lightning_apply.move_data_to_device(batch, "cpu")):
        assert isinstance(moved, shardwise.PackedBatch) and sorted(moved) == sorted(batch)
        assert torch.equal(moved.sample_ids, batch.sample_ids) and moved.num_tokens == batch.num_tokens
        assert moved.use_cache is False
