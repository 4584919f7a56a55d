"""Real training with packed rows against padded batches: a small causal transformer on WikiText-2, 2 gloo ranks.

Run (alone on the machine; a few minutes on 2 CPU cores)::

    python -m bench.bench_packing_train
    python -m bench.bench_packing_train --quick   # 20,000 tokens an arm, plot in bench/out (a smoke test)

Data: the paragraphs of WikiText-2's validation split (training) and test split (held out), from
``bench/data/wikitext-2`` or ``--data DIR``, words mapped to ids (the 4,095 most frequent words of
the training text, the rest one unknown id). Model: a 2-layer causal transformer (width 96, 4 heads, learned absolute
positions up to 512), about 4 MFLOPs a token for a training step. Three arms, each on 2 gloo
ranks with DistributedDataParallel, each for the same budget of real (non-padding) tokens, the
same optimiser and seed:

- random padded: ``ShardedSampler`` batches of 19 paragraphs (about 2,048 real tokens), each
  padded to its longest paragraph;
- BucketBatchSampler(max_tokens=2048): paragraphs of similar length, padded to the longest;
- packed: ``PackedBatchSampler(max_len=512, rows_per_batch=4, balance="attention")``, rows of
  several paragraphs, per-document attention from ``pack_collate``'s ``cu_seqlens`` (CPU has no
  varlen kernel: :class:`Segments` groups documents of similar length into small causal SDPA
  calls, so attention costs about the sum of squared lengths, as flash-attn varlen would),
  positions restarting at every paragraph.

Every arm goes through ``pack_collate`` (a padded batch is one paragraph a row), so the loss is
the same function: next-token cross entropy over real tokens, never across paragraphs. Reported
per arm: wall time of the training loop (slowest rank), real tokens per second, steps, padding,
final held-out loss; the loss curves (training loss against real tokens seen) are saved as a PNG.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader

from bench._lib.common import OUT, add_data_argument, wikitext_paragraphs
from shardwise import BucketBatchSampler, PackCollate, PackedBatchSampler, PackedDataset, ShardedSampler
from shardwise.tools.launch import run_distributed

VOCAB = 4096
MAX_LEN = 512
ROWS = 4
BUDGET = 2048  # tokens per rank-batch
PLOT = Path(__file__).resolve().parent.parent / "docs" / "packing_train_loss.png"


# -- the model ---------------------------------------------------------------------------------------
class Segments:
    """Per-document attention without a dense (L, L) mask: documents of similar length attend in small groups.

    CPU PyTorch has no varlen attention kernel (flash-attn's ``flash_attn_varlen_func`` is what
    a GPU would use with ``cu_seqlens``). This stands in for it: the segments of ``cu_seqlens``
    (documents and padding tails) are sorted by length and cut into groups of ``group``; each
    group is gathered into a ``(group, longest)`` block for one causal SDPA call, so attention
    costs about the sum of squared document lengths, as with a varlen kernel.
    """

    def __init__(self, cu_seqlens: torch.Tensor, group: int = 8) -> None:
        starts = cu_seqlens[:-1].long()
        lengths = cu_seqlens[1:].long() - starts
        order = torch.argsort(lengths, descending=True)
        self.blocks = []
        for first in range(0, order.numel(), group):
            members = order[first : first + group]
            width = int(lengths[members].max())
            offsets = torch.arange(width)
            valid = offsets[None, :] < lengths[members][:, None]  # (g, width)
            gather = (starts[members][:, None] + offsets[None, :]).clamp(max=int(cu_seqlens[-1]) - 1)
            mask = valid[:, None, None, :] & torch.ones(width, width, dtype=torch.bool).tril()  # (g, 1, w, w)
            self.blocks.append((gather, valid, mask))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q, k, v``: ``(tokens, heads, head_dim)`` over the flattened rows; returns the same shape."""
        out = torch.empty_like(q)
        for gather, valid, mask in self.blocks:
            # (g, width, heads, head_dim) -> (g, heads, width, head_dim)
            qg, kg, vg = (t[gather].transpose(1, 2) for t in (q, k, v))
            attended = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask).transpose(1, 2)
            out[gather[valid]] = attended[valid]
        return out


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Segments) -> torch.Tensor:
        rows, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(rows, length, 3, self.heads, dim // self.heads).unbind(2)
        if isinstance(mask, Segments):  # per-document attention on the flattened tokens
            flat = (t.reshape(rows * length, self.heads, -1) for t in (q, k, v))
            attended = mask.attend(*flat).reshape(rows, length, dim)
        else:  # q, k, v: (rows, heads, length, head_dim); mask: (rows, 1, length, length), True = may attend
            attended = (
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
                .transpose(1, 2)
                .reshape(rows, length, dim)
            )
        x = x + self.out(attended)
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    """A small causal LM that takes ``position_ids`` and a boolean attention mask (packed or padded rows).

    Example:
        >>> model = TinyCausalLM(vocab=50, dim=16, layers=1, heads=2, max_len=8)
        >>> ids = torch.tensor([[3, 4, 5]])
        >>> mask = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]
        >>> model(ids, torch.arange(3)[None], mask).shape
        torch.Size([1, 3, 50])
    """

    def __init__(self, vocab: int = VOCAB, dim: int = 96, layers: int = 2, heads: int = 4,
                 max_len: int = MAX_LEN) -> None:  # fmt: skip
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | Segments
    ) -> torch.Tensor:
        x = self.embed(input_ids) + self.position(position_ids)
        for block in self.blocks:
            x = block(x, mask)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def loss_of(model: nn.Module, batch: Any, varlen: bool = False) -> tuple[torch.Tensor, int]:
    """Next-token cross entropy over real tokens (labels are -100 at paragraph starts and on padding)."""
    mask = Segments(batch.cu_seqlens) if varlen else batch.attention_mask
    logits = model(batch.input_ids, batch.position_ids, mask)
    targets = batch.labels[:, 1:]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    return loss, int((targets != -100).sum())


# -- data --------------------------------------------------------------------------------------------
def encode(data: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    train, held_out = wikitext_paragraphs("valid", data), wikitext_paragraphs("test", data)
    common = [word for word, _ in Counter(w for p in train for w in p).most_common(VOCAB - 1)]
    ids = {word: i + 1 for i, word in enumerate(common)}  # 0: any other word
    as_ids = [[np.array([ids.get(w, 0) for w in p], dtype=np.int64) for p in part] for part in (train, held_out)]
    cut = [[d[:MAX_LEN] for d in part] for part in as_ids]  # a few paragraphs exceed 512 words: keep the start
    return cut[0], cut[1][:300]


class OnePerRow:
    """For padded arms: each paragraph its own row (the collate pads rows to the longest)."""

    def __init__(self, docs: list[np.ndarray]) -> None:
        self.docs = docs

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> Any:
        from shardwise import PackedSample

        return PackedSample(self.docs[i], int(i), None)


class Rowed:
    def __call__(self, batch: list[Any]) -> Any:
        from shardwise import PackedSample, pack_collate

        rows = [PackedSample(s.tokens, s.sample, r) for r, s in enumerate(batch)]
        return pack_collate(rows, attention_mask=True)


def loader_for(arm: str, docs: list[np.ndarray], seed: int) -> tuple[DataLoader, Any]:
    lengths = np.array([d.size for d in docs])
    if arm == "packed":
        sampler = PackedBatchSampler(lengths, max_len=MAX_LEN, rows_per_batch=ROWS, balance="attention", seed=seed)
        loader = DataLoader(PackedDataset(docs), batch_sampler=sampler, collate_fn=PackCollate(max_len=MAX_LEN))
        return loader, sampler
    if arm == "bucket":
        sampler = BucketBatchSampler(lengths, max_tokens=BUDGET, seed=seed)
        return DataLoader(OnePerRow(docs), batch_sampler=sampler, collate_fn=Rowed()), sampler
    per_batch = round(BUDGET / lengths.mean())
    sharded = ShardedSampler(len(docs), seed=seed)
    return DataLoader(OnePerRow(docs), batch_sampler=BatchSampler(sharded, per_batch, drop_last=True),
                      collate_fn=Rowed()), sharded  # fmt: skip


def evaluate(model: nn.Module, docs: list[np.ndarray]) -> float:
    """Held-out loss per real token, packed (exact: per-document attention)."""
    from shardwise import PackedSample, pack_collate

    sampler = PackedBatchSampler([d.size for d in docs], max_len=MAX_LEN, rows_per_batch=ROWS, shuffle=False,
                                 num_replicas=1, rank=0)  # fmt: skip
    total, count = 0.0, 0
    with torch.no_grad():
        for keys in sampler:
            batch = pack_collate([PackedSample(docs[int(k)], int(k), k.row) for k in keys], max_len=MAX_LEN)
            loss, n = loss_of(model, batch, varlen=True)
            total, count = total + float(loss) * n, count + n
    return total / count


# -- one arm on one rank -----------------------------------------------------------------------------
def train_rank(rank: int, world_size: int, arm: str, tokens: int, seed: int, data: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    docs, held_out = encode(data)
    model = nn.parallel.DistributedDataParallel(TinyCausalLM())
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    loader, _ = loader_for(arm, docs, seed)
    seen, steps, padded, curve = 0, 0, 0, []
    dist.barrier()
    start = time.perf_counter()
    while seen < tokens:
        for batch in loader:
            loss, real = loss_of(model, batch, varlen=arm == "packed")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            stats = torch.tensor([float(real), float(batch.input_ids.numel()), float(loss.detach()) * real])
            dist.all_reduce(stats)  # every rank sees the same totals, so all stop at the same step
            seen += int(stats[0])
            padded += int(stats[1])
            steps += 1
            curve.append((seen, float(stats[2] / stats[0])))
            if seen >= tokens:
                break
    elapsed = time.perf_counter() - start
    result = {"arm": arm, "seconds": elapsed, "tokens": seen, "slots": padded, "steps": steps, "curve": curve}
    if rank == 0:
        result["held_out"] = evaluate(model.module, held_out)
    return result


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_tokens, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for result in results:
        seen, losses = zip(*result["curve"], strict=True)
        width = min(5, len(losses))
        smooth = np.convolve(losses, np.ones(width) / width, mode="valid")
        label = f"{LABELS[result['arm']]} ({result['seconds']:.0f} s)"
        by_tokens.plot(seen[width - 1 :], smooth, label=label)
        clock = np.linspace(0, result["seconds"], len(losses))
        by_time.plot(clock[width - 1 :], smooth, label=label)
    by_tokens.set_xlabel("real tokens seen (both ranks)")
    by_time.set_xlabel("wall time (s)")
    for axis in (by_tokens, by_time):
        axis.set_ylabel("training loss (5-step mean)")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("WikiText-2, 2-layer causal transformer, 2 gloo ranks on CPU, equal real-token budget")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


LABELS = {"random": "random padded", "bucket": "BucketBatchSampler", "packed": "PackedBatchSampler"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000, help="real-token budget per arm (both ranks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=None, help=f"the loss curves' PNG (default {PLOT.name} in docs/)")
    parser.add_argument("--quick", action="store_true",
                        help="--tokens 20000, the plot in bench/out/ unless --plot (a smoke test)")  # fmt: skip
    add_data_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.tokens = 20_000
    if args.plot is None:
        args.plot = Path(OUT) / PLOT.name if args.quick else PLOT
        args.plot.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for arm in ("random", "bucket", "packed"):
        reports = run_distributed(train_rank, 2, arm, args.tokens, args.seed, args.data,
                                  timeout=900, collective_timeout=300)  # fmt: skip
        slowest = max(r["seconds"] for r in reports)
        results.append({**reports[0], "seconds": slowest})
    packed = next(r for r in results if r["arm"] == "packed")
    for r in results:
        print(f"{r['arm']}: {r['seconds']:.1f} s, {r['steps']} steps")
    print(f"budget {args.tokens} real tokens per arm, 2 gloo ranks, seed {args.seed}")
    print("| arm | wall s (slowest rank) | real tokens/s | x random padded | steps | padding | held-out loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = results[0]["tokens"] / results[0]["seconds"]
    for r in results:
        rate = r["tokens"] / r["seconds"]
        print(f"| {LABELS[r['arm']]} | {r['seconds']:.1f} | {rate:.0f} | {rate / base:.2f} | {r['steps']} | "
              f"{1 - r['tokens'] / r['slots']:.1%} | {r['held_out']:.3f} |")  # fmt: skip
    print(
        f"packed vs BucketBatchSampler: {results[1]['seconds'] / packed['seconds']:.2f}x faster; "
        f"loss curves: {args.plot}; held-out perplexity {math.exp(packed['held_out']):.0f}"
    )
    plot(results, args.plot)


if __name__ == "__main__":
    main()
