"""Training throughput through HF ``Trainer``: packing against padding, length grouping and TRL's packing.

Run (CPU: a small Llama, a few minutes on 2 cores; GPU: a 268M Llama in bf16)::

    python -m bench.bench_trainer_packing --rounds 3 --tokens 60000    # CPU, a small Llama
    python -m bench.bench_trainer_packing --size 268m --tokens 300000 --docs 20000   # one GPU
    python -m bench.bench_trainer_packing --check               # per-document exactness on this device
    python -m bench.bench_trainer_packing --quick               # 4,000 tokens, 600 documents, 1 warm-up step

Every arm trains the same Llama (built from a config, nothing downloaded; SDPA attention, the
model's default config) through a real ``Trainer`` on the same long-tailed synthetic documents
(log-normal lengths, median ~``max_len / 14``, clipped to ``[2, max_len]``; random token ids), until it
has trained the same budget of target tokens (``labels != -100`` after the shift: every real token
but each document's first), after a few warm-up steps. Each arm is a fresh process, so peak memory
is its own. Arms, at about the same real tokens a step:

- ``random``: ``ShardwiseTrainer`` (its default ``ShardedSampler``), batches padded to their longest;
- ``length_grouped``: plain ``Trainer`` with ``train_sampling_strategy="group_by_length"`` (HF's
  ``LengthGroupedSampler``), padded;
- ``trl_packing``: TRL ``SFTTrainer(packing=True)`` (its BFD strategy, padding-free: one flattened
  row a batch, per-document attention from ``position_ids``);
- ``bucket``: ``ShardwiseTrainer`` with ``BucketBatchSampler(max_tokens=...)``, padded;
- ``packed``: ``ShardwiseTrainer`` with ``PackedBatchSampler(max_len, rows_per_batch)`` and
  ``PackCollate`` (which the trainer fits to the model: rows, ``use_cache=False``).

Printed (with ``--rounds N``, the median of N interleaved runs of every arm): real tokens/s, the
ratio to ``random`` and to ``length_grouped``, padding, steps, peak
GPU memory (``torch.cuda.max_memory_allocated``; on CPU the peak resident set instead).
``--check`` runs every document of packed batches through Llama/GPT-2/Qwen2 with each attention
implementation the device runs and prints the largest difference from the document run alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from typing import Any

import numpy as np
import torch

from bench._lib.common import ROOT, module_command

ARMS = ("random", "length_grouped", "trl_packing", "bucket", "packed")
SIZES = {  # hidden, intermediate, layers, heads, vocab, max_len, rows
    "tiny": (64, 172, 2, 4, 1024, 512, 2),  # attention (L^2) outweighs the linear layers: not how LLMs spend
    "small": (256, 688, 2, 4, 1024, 512, 2),  # the linear layers dominate, as in the GPU model: CPU's default
    "268m": (1024, 2816, 16, 16, 32000, 4096, 2),
}


def documents(count: int, max_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Long-tailed synthetic documents: log-normal lengths (median max_len / 14), random token ids."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(max_len / 14), 1.0, count), 2, max_len).astype(np.int64)
    return [rng.integers(1, vocab, size=int(n)).tolist() for n in lengths]


def llama(size: str, device: str) -> Any:
    import transformers

    hidden, intermediate, layers, heads, vocab, max_len, _ = SIZES[size]
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device)


def pad_collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad to the batch's longest: padding out of attention and loss."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for row, f in enumerate(features):
        ids[row, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[row, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class Meter:
    """Counts target tokens and model-input slots at every forward; times from the end of the warm-up steps."""

    def __init__(self, model: Any, budget: int, warmup: int, device: str) -> None:
        self.budget, self.warmup, self.device = budget, warmup, device
        self.targets = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.zeros((), dtype=torch.long, device=device)
        self.start: tuple[float, int, int, int] | None = None
        self.result: dict[str, Any] = {}
        model.register_forward_pre_hook(self.count, with_kwargs=True)

    def count(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        labels = kwargs.get("labels")
        if labels is None or not module.training:
            return
        self.targets += (labels[..., 1:] != -100).sum()
        self.slots += labels.numel()

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_step_end(self, step: int) -> bool:
        """True when the budget is trained."""
        if step < self.warmup:
            return False
        self.sync()
        now, targets, slots = time.perf_counter(), int(self.targets), int(self.slots)
        if self.start is None:
            self.start = (now, targets, slots, step)
            return False
        trained = targets - self.start[1]
        if trained < self.budget:
            return False
        seconds = now - self.start[0]
        padding = 1 - trained / max(slots - self.start[2], 1)
        self.result = {"seconds": seconds, "tokens": trained, "tokens_per_s": trained / seconds,
                       "steps": step - self.start[3], "padding": padding}  # fmt: skip
        return True


def trainer_for(arm: str, size: str, device: str, docs: list[list[int]], meter_args: tuple[int, int], out: str) -> Any:
    import transformers

    import shardwise
    from shardwise.integrations.transformers import ShardwiseTrainer

    _, _, _, _, vocab, max_len, rows = SIZES[size]
    model = llama(size, device)
    meter = Meter(model, *meter_args, device)
    lengths = np.array([len(d) for d in docs])
    per_batch = max(1, round(rows * max_len / lengths.mean()))  # padded arms: about rows * max_len real tokens
    try:
        import datasets

        data: Any = datasets.Dataset.from_dict({"input_ids": docs})
    except ImportError:  # every arm but TRL's runs on a list of rows
        data = [{"input_ids": d} for d in docs]
    common: dict[str, Any] = {
        "output_dir": out, "max_steps": 10**6, "learning_rate": 3e-4, "report_to": [], "save_strategy": "no",
        "logging_strategy": "no", "seed": 0, "bf16": device == "cuda", "use_cpu": device == "cpu",
        "dataloader_num_workers": 2 if device == "cuda" else 0, "per_device_train_batch_size": per_batch,
    }  # fmt: skip

    class Stop(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            control.should_training_stop = meter.on_step_end(state.global_step)

    if arm == "trl_packing":
        import trl
        from tokenizers import Tokenizer, models

        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.WordLevel({str(i): i for i in range(vocab)}, unk_token="0")),
            pad_token="0", eos_token="1",
        )  # fmt: skip
        config = trl.SFTConfig(**{**common, "per_device_train_batch_size": rows}, packing=True, max_length=max_len,
                               packing_strategy="bfd", dataset_num_proc=1,  # TRL checkpoints by default; no other arm
                               gradient_checkpointing=False)  # fmt: skip
        trainer = trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                                 callbacks=[Stop()])  # fmt: skip
    elif arm == "length_grouped":
        args = transformers.TrainingArguments(**common, train_sampling_strategy="group_by_length")
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data, data_collator=pad_collate,
                                       callbacks=[Stop()])  # fmt: skip
    else:
        args = transformers.TrainingArguments(**common)
        sampler: Any = None
        collate: Any = pad_collate
        dataset: Any = data
        if arm == "bucket":
            sampler = shardwise.BucketBatchSampler(lengths, max_tokens=rows * max_len, seed=0)
        elif arm == "packed":
            sampler = shardwise.PackedBatchSampler(lengths, max_len=max_len, rows_per_batch=rows, seed=0)
            dataset = shardwise.PackedDataset(data, field="input_ids")
            collate = shardwise.PackCollate(max_len=max_len, rows=rows)  # ShardwiseTrainer fits it to the model
        trainer = ShardwiseTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate,
                                   train_sampler=sampler, callbacks=[Stop()])  # fmt: skip
    return trainer, meter


def run_arm(arm: str, size: str, device: str, docs_count: int, budget: int, warmup: int) -> dict[str, Any]:
    _, _, _, _, vocab, max_len, _ = SIZES[size]
    docs = documents(docs_count, max_len, vocab)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as out:
        trainer, meter = trainer_for(arm, size, device, docs, (budget, warmup), out)
        trainer.train()
    result = dict(meter.result, arm=arm)
    if not result.get("seconds"):
        raise RuntimeError(f"{arm}: the epoch ended before the budget of {budget} tokens was trained; use more --docs")
    if device == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    else:
        result["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return result


def check(device: str) -> None:
    """Every document of packed batches against the document alone, per family and attention implementation."""
    import transformers

    import shardwise

    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 61, size=n) for n in (5, 17, 1, 30, 9, 12, 3, 22, 40, 8, 2, 27)]
    families = {
        "llama": lambda impl: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=61, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=96, attn_implementation=impl)),
        "gpt2": lambda impl: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=61, n_embd=64, n_layer=2, n_head=4, n_positions=96, attn_implementation=impl)),
        "qwen2": lambda impl: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=61, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=96, attn_implementation=impl)),
    }  # fmt: skip
    implementations = ["sdpa", "eager", "flex_attention", "flash_attention_2"]
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, transformers {transformers.__version__}; float32")  # fmt: skip
    print("| family | attn_implementation | max abs diff, PackCollate(model=) vs alone | position_ids only, before |")
    print("|---|---|---:|---:|")
    sampler = shardwise.PackedBatchSampler([d.size for d in docs], max_len=48, rows_per_batch=2, num_replicas=1,
                                           rank=0, seed=3)  # fmt: skip
    data = shardwise.PackedDataset(docs)
    for family, make in families.items():
        for implementation in implementations:
            try:
                torch.manual_seed(0)
                model = make(implementation).to(device).eval()
                collate = shardwise.PackCollate(max_len=48, rows=2, model=model)
            except Exception as error:  # an implementation this device or family lacks
                print(f"| {family} | {implementation} | not run: {type(error).__name__}: {str(error)[:90]} | |")
                continue
            worst = before = 0.0
            with torch.no_grad():
                for keys in sampler:
                    samples = [data[k] for k in keys]
                    batch = collate(samples).to(device)
                    logits = model(**batch).logits
                    plain = shardwise.pack_collate(samples, max_len=48, rows=2 if not collate.layout.flatten else None)
                    old = model(input_ids=plain.input_ids.to(device), position_ids=plain.position_ids.to(device)).logits
                    flat = collate.layout.flatten
                    for key in keys:
                        alone = model(input_ids=torch.from_numpy(docs[int(key)])[None].to(device)).logits[0]
                        where = batch.sample_ids[0 if flat else key.row] == int(key)
                        worst = max(worst, (logits[0 if flat else key.row][where] - alone).abs().max().item())
                        where_old = plain.sample_ids[key.row].to(device) == int(key)
                        before = max(before, (old[key.row][where_old] - alone).abs().max().item())
            print(f"| {family} | {implementation} | {worst:.2e} | {before:.2e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--tokens", type=int, default=60_000, help="target tokens timed per arm")
    parser.add_argument("--docs", type=int, default=6_000, help="documents in the data set")
    parser.add_argument("--warmup", type=int, default=3, help="optimizer steps before timing")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--rounds", type=int, default=1, help="run every arm this many times, interleaved; medians")
    parser.add_argument("--check", action="store_true", help="per-document exactness instead of throughput")
    parser.add_argument("--quick", action="store_true",
                        help="--tokens 4000 --docs 600 --warmup 1 --rounds 1 (a smoke test)")  # fmt: skip
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # one arm, in a fresh process (internal)
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.docs, args.warmup, args.rounds = 4_000, 600, 1, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.check:
        check(device)
        return
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.size, device, args.docs, args.tokens, args.warmup)))
        return
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for arm in args.arms.split(","):
            command = module_command("bench.bench_trainer_packing", "--arm", arm, "--size", args.size,
                                     "--tokens", str(args.tokens), "--docs", str(args.docs), "--warmup",
                                     str(args.warmup))  # fmt: skip
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, env=os.environ)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                print(f"{arm}: failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-3:]}", flush=True)
                continue
            runs.setdefault(arm, []).append(json.loads(lines[-1]))
            print(f"{arm}: {runs[arm][-1]}", flush=True)
    results = {arm: sorted(r, key=lambda x: x["tokens_per_s"])[len(r) // 2] for arm, r in runs.items()}  # medians
    memory = "peak GPU GiB" if device == "cuda" else "peak RSS GiB"
    print(f"\nsize {args.size}, {args.tokens} target tokens timed per arm, median of {args.rounds} round(s), device "
          f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")  # fmt: skip
    print(f"| arm | real tokens/s | x random | x length_grouped | padding | steps | {memory} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm, r in results.items():
        base = results.get("random", {}).get("tokens_per_s")
        grouped = results.get("length_grouped", {}).get("tokens_per_s")
        ratio = f"{r['tokens_per_s'] / base:.2f}" if base else "-"
        vs_grouped = f"{r['tokens_per_s'] / grouped:.2f}" if grouped else "-"
        print(f"| {arm} | {r['tokens_per_s']:,.0f} | {ratio} | {vs_grouped} | {r['padding']:.1%} | {r['steps']} "
              f"| {r['peak_gib']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
