"""PackedMixtureSampler (weights in tokens, full rows) beside padding, the recipe, TRL packing and a Megatron blend.

Run::

    python -m bench.bench_packed_mixture                      # ~20 s on 2 shared cores (TRL packing most of it)
    python -m bench.bench_packed_mixture --quick              # smoke-sized, well under a minute
    python -m bench.bench_packed_mixture --data bench/data/wikitext-2   # WikiText-2 lengths as the sources
    python -m bench.bench_packed_mixture --scale 1e8 --dir DIR   # cold start at 1e8 documents (400 MB under DIR)

Data (default, synthetic, like the data issue 47 measured on): 3 sources of lognormal document lengths
(sigma 0.8) with means ~300 / ~1,500 / ~5,000 tokens, seed 0, weights 0.5 / 0.3 / 0.2, rows of
``max_len`` 8192. With ``--data DIR`` the sources are WikiText-2 paragraphs (``valid`` + ``test``,
split in three consecutive thirds): single paragraphs, groups of 10 and groups of 40 consecutive
paragraphs (means ~110 / ~1,200 / ~4,100 words).

Arms, each run over ``--steps`` global steps at W = ``--world-size`` ranks (a step is W consecutive
batches, rank r's batch of step s is batch ``s * W + r``):

1. **PackedMixtureSampler** (weights in tokens): ``rows_per_batch`` rows of ``max_len``, one sampler
   per rank (``num_replicas=W, rank=r``), ``num_batches = steps * W``.
2. **MixtureSampler + padding** (weights in samples): batches of ``--docs-per-batch`` documents a
   rank (one sampler per rank, DataLoader-style batches of its indices), each document truncated to
   ``max_len`` and padded to ``max_len`` (or to the batch's longest: second fill figure).
3. **Today's recipe** (docs/mixture.md): the same MixtureSampler batches through
   ``PackCollate(max_len=max_len)`` (documents truncated to ``max_len``, which the collate needs):
   a batch's rows vary.
4. **TRL packing over interleave_datasets**: ``datasets.interleave_datasets(probabilities=weights,
   seed=0)`` (weights in samples) of the three sources, each repeated as often as the run's draws
   need (token ids = source + 1, so a packed row says where its pieces came from), the first
   ``steps * W * docs_per_batch`` documents, packed by ``trl.pack_dataset(seq_length=max_len)``
   with its default strategy (``"bfd"``, SFTTrainer's default: best-fit decreasing, a document
   longer than a row is truncated); the packed rows in a seeded random order (Trainer's
   ``RandomSampler``), ``rows_per_batch`` a batch; the rows short of a whole last step left out.
5. **Megatron-style blend**: each source's documents in a random order per pass, concatenated and
   cut into rows of ``max_len`` (single-source rows, as GPTDataset builds offline), blended by
   Megatron's ``build_blending_indices`` rule (at sample k pick the source with the largest
   ``weights[i] * max(k, 1) - count_i``; ``max(k, 1)`` as in Megatron's C++), ``rows_per_batch`` rows
   a batch.

Measures: token share of each source over the whole run; aligned windows of 64 rows (64 sequences
for the padding arm): the largest ``|share - weight|`` in percentage points over windows and
sources, and the windows missing a source whose ``weight * window tokens`` is at least its mean
document length; fill (real tokens over the rows' capacity, ``rows * max_len``); tokens cut off by
truncation; rows a rank's batch; the slowest rank of a step over the mean, in real tokens and in
attention cost (sum of squared piece lengths: each piece its own document), median / p99 / worst
over the steps; PackedMixtureSampler's construction, first batch and time a batch (one rank).

``--scale N``: N documents in 3 sources (shares 1/300 : 1/1500 : 1/5000, so about equal tokens)
as int32 ``.npy`` lengths written under ``--dir`` (default: a new temporary folder, deleted after),
memory-mapped; each figure in a fresh process: the floor (one ``np.sum`` of the lengths), the
sampler's construction and rank 3 of 8's first batch, cold (page cache of the files evicted with
``posix_fadvise(DONTNEED)`` first) and warm (another process, pages cached, as another rank of the
node finds them), and private memory (``RssAnon``) after the first batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench._lib.common import wikitext_paragraphs

WEIGHTS = [0.5, 0.3, 0.2]
MEANS = [300, 1500, 5000]
SIGMA = 0.8
SCALE_SHARES = np.array([1 / 300, 1 / 1500, 1 / 5000]) / sum([1 / 300, 1 / 1500, 1 / 5000])


# -- data ------------------------------------------------------------------------------------------
def synthetic(sizes: list[int], seed: int = 0) -> list[np.ndarray]:
    """Lognormal lengths (sigma 0.8) whose means are MEANS, at least 1 token, one array per source."""
    rng = np.random.default_rng(seed)
    return [
        np.maximum(1, np.rint(rng.lognormal(np.log(m) - SIGMA**2 / 2, SIGMA, n))).astype(np.int64)
        for m, n in zip(MEANS, sizes, strict=True)
    ]


def wikitext_sources(data: Path) -> list[np.ndarray]:
    """WikiText-2 paragraphs in three consecutive thirds: single paragraphs, groups of 10, groups of 40."""
    lengths = np.array([len(p) for split in ("valid", "test") for p in wikitext_paragraphs(split, data)], np.int64)
    thirds = np.array_split(lengths, 3)
    out = []
    for part, group in zip(thirds, (1, 10, 40), strict=True):
        whole = part.size // group * group
        out.append(part[:whole].reshape(-1, group).sum(axis=1))
    return out


# -- a run: pieces in rows, rows in batches --------------------------------------------------------
@dataclass
class Run:
    """One arm's output in global order: pieces (source, tokens, row), rows (capacity, batch)."""

    source: np.ndarray
    tokens: np.ndarray
    row: np.ndarray
    capacity: np.ndarray
    batch: np.ndarray
    dropped: int = 0  # tokens cut off by truncation
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
        capacity: list[np.ndarray],
        batch: list[np.ndarray],
        dropped: int = 0,
    ) -> Run:
        """Concatenate per-batch parts whose ``row`` numbers are local to each part."""
        rows_before = np.cumsum([0] + [c.size for c in capacity])[:-1]
        return cls(
            np.concatenate([p[0] for p in pieces]).astype(np.int64),
            np.concatenate([p[1] for p in pieces]).astype(np.int64),
            np.concatenate([p[2] + base for p, base in zip(pieces, rows_before, strict=True)]).astype(np.int64),
            np.concatenate(capacity).astype(np.int64),
            np.concatenate(batch).astype(np.int64),
            dropped,
        )


def measures(run: Run, weights: list[float], means: list[float], world: int, window: int = 64) -> dict[str, Any]:
    """Token shares, worst aligned window, fill, rows a batch, slowest rank of a step (tokens, attention)."""
    s = len(weights)
    w = np.asarray(weights, dtype=np.float64) / sum(weights)
    total = run.tokens.sum()
    shares = np.bincount(run.source, weights=run.tokens, minlength=s) / total
    per_row = np.bincount(run.row * s + run.source, weights=run.tokens, minlength=run.capacity.size * s)
    per_row = per_row.reshape(-1, s)
    whole = per_row.shape[0] // window * window
    windows = per_row[:whole].reshape(-1, window, s).sum(axis=1)  # (windows, sources)
    window_tokens = windows.sum(axis=1, keepdims=True)
    deviation = np.abs(windows / window_tokens - w) * 100
    eligible = w * window_tokens >= np.asarray(means, dtype=np.float64)
    missing = (eligible & (windows == 0)).any(axis=1)
    batches = run.capacity.size and int(run.batch.max()) + 1
    rows_a_batch = np.bincount(run.batch, minlength=batches)
    piece_batch = run.batch[run.row]
    steps = batches // world
    balance = {}
    for name, cost in (("tokens", run.tokens.astype(np.float64)), ("attention", run.tokens.astype(np.float64) ** 2)):
        per_batch = np.bincount(piece_batch, weights=cost, minlength=batches)[: steps * world].reshape(steps, world)
        ratio = per_batch.max(axis=1) / per_batch.mean(axis=1)
        balance[name] = np.percentile(ratio, [50, 99, 100])
    return {
        "shares": shares,
        "windows": windows.shape[0],
        "worst_pp": float(deviation.max()),
        "worst_window": int(deviation.max(axis=1).argmax()),
        "missing": int(missing.sum()),
        "fill": float(total / run.capacity.sum()),
        "dropped": run.dropped / (total + run.dropped),
        "rows": (int(rows_a_batch.min()), int(rows_a_batch.max())),
        "balance": balance,
        "tokens": int(total),
        "row_count": int(run.capacity.size),
        "steps": steps,
    }


# -- arm 1: PackedMixtureSampler -------------------------------------------------------------------
def packed_mixture(lengths: list[np.ndarray], args: argparse.Namespace) -> tuple[Run, dict[str, float]]:
    import shardwise

    offsets = np.cumsum([0] + [x.size for x in lengths])
    world, steps = args.world_size, args.steps
    per_rank: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    timing: dict[str, list[float]] = {"construct": [], "first": [], "batch": []}
    for rank in range(world):
        start = time.perf_counter()
        sampler = shardwise.PackedMixtureSampler(
            lengths,
            WEIGHTS,
            max_len=args.max_len,
            rows_per_batch=args.rows,
            num_batches=steps * world,
            seed=0,
            num_replicas=world,
            rank=rank,
        )
        timing["construct"].append(time.perf_counter() - start)
        batches = []
        stamp = time.perf_counter()
        for k, batch in enumerate(sampler):
            now = time.perf_counter()
            timing["first" if k == 0 else "batch"].append(now - stamp)
            ids = np.fromiter((int(i) for i in batch), np.int64, len(batch))
            rows = np.fromiter((i.row for i in batch), np.int64, len(batch))
            sizes = np.fromiter((i.stop - i.start for i in batch), np.int64, len(batch))
            if k < 2:  # rank r's batch k is the W=1 plan's batch k * W + r
                planned = sampler.plan.core.batch(0, sampler.seed, k * world + rank)
                assert np.array_equal(planned[0], ids) and np.array_equal(planned[1], rows), (rank, k)
            per_row = np.bincount(rows, weights=sizes, minlength=args.rows)
            assert (per_row == args.max_len).all(), f"rank {rank} batch {k}: row tokens {per_row.tolist()}"
            batches.append((np.searchsorted(offsets, ids, side="right") - 1, sizes, rows))
            stamp = time.perf_counter()
        assert len(batches) == steps, (rank, len(batches), steps)
        per_rank.append(batches)
    pieces, capacity, batch_of = [], [], []
    for step in range(steps):
        for rank in range(world):
            pieces.append(per_rank[rank][step])
            capacity.append(np.full(args.rows, args.max_len))
            batch_of.append(np.full(args.rows, step * world + rank))
    figures = {
        "construct": float(np.median(timing["construct"])),
        "first": float(np.median(timing["first"])),
        "batch": float(np.mean(timing["batch"])),
        "batch_p99": float(np.percentile(timing["batch"], 99)),
    }
    return Run.of(pieces, capacity, batch_of), figures


# -- arms 2 and 3: MixtureSampler batches, padded or through PackCollate ---------------------------
def mixture_batches(lengths: list[np.ndarray], args: argparse.Namespace) -> list[list[np.ndarray]]:
    """Each rank's batches of global ids (``docs_per_batch`` a batch), from MixtureSampler at W ranks."""
    import shardwise

    world, docs = args.world_size, args.docs_per_batch
    out = []
    for rank in range(world):
        sampler = shardwise.MixtureSampler(
            [x.size for x in lengths],
            WEIGHTS,
            num_samples=args.steps * world * docs,
            seed=0,
            num_replicas=world,
            rank=rank,
        )
        ids = np.fromiter(iter(sampler), np.int64)
        out.append(list(ids[: args.steps * docs].reshape(args.steps, docs)))
    return out


def truncated(
    lengths: list[np.ndarray], batches: list[list[np.ndarray]], args: argparse.Namespace
) -> Iterator[tuple[int, np.ndarray, np.ndarray, int]]:
    """Each rank's batch of documents, step by step: (global batch, sources, lengths cut to max_len, tokens cut)."""
    every, source_of = np.concatenate(lengths), np.repeat(np.arange(len(lengths)), [x.size for x in lengths])
    for step in range(args.steps):
        for rank in range(args.world_size):
            ids = batches[rank][step]
            full = every[ids]
            kept = np.minimum(full, args.max_len)
            yield step * args.world_size + rank, source_of[ids], kept, int((full - kept).sum())


def padded(lengths: list[np.ndarray], batches: list[list[np.ndarray]], args: argparse.Namespace) -> tuple[Run, float]:
    pieces, capacity, batch_of, dropped, longest = [], [], [], 0, 0
    for batch, sources, kept, cut in truncated(lengths, batches, args):
        dropped += cut
        longest += int(kept.max()) * kept.size
        pieces.append((sources, kept, np.arange(kept.size)))
        capacity.append(np.full(kept.size, args.max_len))
        batch_of.append(np.full(kept.size, batch))
    run = Run.of(pieces, capacity, batch_of, dropped)
    return run, float(run.tokens.sum() / longest)


def recipe(lengths: list[np.ndarray], batches: list[list[np.ndarray]], args: argparse.Namespace) -> Run:
    import shardwise

    collate = shardwise.PackCollate(max_len=args.max_len)
    zeros = np.zeros(args.max_len, dtype=np.int64)
    pieces, capacity, batch_of, dropped = [], [], [], 0
    for batch, sources, kept, cut in truncated(lengths, batches, args):
        dropped += cut
        packed = collate([zeros[:n] for n in kept])
        documents = packed.document_ids.numpy().ravel()
        real = np.flatnonzero(documents >= 0)
        numbers, first, counts = np.unique(documents[real], return_index=True, return_counts=True)
        assert np.array_equal(counts, kept[numbers]), "PackCollate kept every document whole"
        rows = packed.input_ids.shape[0]
        pieces.append((sources[numbers], counts, real[first] // args.max_len))
        capacity.append(np.full(rows, args.max_len))
        batch_of.append(np.full(rows, batch))
    return Run.of(pieces, capacity, batch_of, dropped)


# -- arm 4: TRL packing over datasets.interleave_datasets ------------------------------------------
def trl_packing(lengths: list[np.ndarray], args: argparse.Namespace) -> Run:
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc
    from trl import pack_dataset

    datasets.disable_progress_bars()
    wanted = args.steps * args.world_size * args.docs_per_batch
    sources = []
    for i, given in enumerate(lengths):
        x = np.tile(given, -(-int(1.5 * wanted * WEIGHTS[i] + 1000) // given.size))  # epochs enough for the draws
        offsets = pa.array(np.concatenate([[0], np.cumsum(x)]).astype(np.int32))
        values = pa.array(np.full(int(x.sum()), i + 1, dtype=np.int32))
        sources.append(datasets.Dataset(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, values)})))
    mixed = datasets.interleave_datasets(sources, probabilities=WEIGHTS, seed=0)
    assert len(mixed) >= wanted, f"a source ran out: {len(mixed)} < {wanted} documents; give the sources more"
    mixed = mixed.select(range(wanted)).flatten_indices()
    given = int(np.sum(pc.list_value_length(mixed.data.column("input_ids")).to_numpy()))
    packed = pack_dataset(mixed, seq_length=args.max_len)
    table = packed.data
    ids = table.column("input_ids").combine_chunks()
    seq = table.column("seq_lengths").combine_chunks()
    row_of_piece = pc.list_parent_indices(seq).to_numpy()
    sizes = seq.flatten().to_numpy().astype(np.int64)
    flat = ids.flatten().to_numpy()
    row_start = ids.offsets.to_numpy()[:-1].astype(np.int64)
    within = (
        np.cumsum(sizes)
        - sizes
        - np.concatenate([[0], np.cumsum(np.bincount(row_of_piece, weights=sizes))])[row_of_piece].astype(np.int64)
    )
    source = flat[row_start[row_of_piece] + within] - 1
    order = np.random.default_rng(0).permutation(len(packed))  # Trainer's RandomSampler over the packed rows
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    per_step = args.world_size * args.rows
    used = order.size // per_step * per_step
    keep = position[row_of_piece] < used
    capacity = np.full(used, args.max_len)
    run = Run(
        source[keep],
        sizes[keep],
        position[row_of_piece][keep],
        capacity,
        np.arange(used) // args.rows,
        dropped=given - int(sizes.sum()),
    )
    run.notes["rows_left_out"] = int(order.size - used)
    return run


# -- arm 5: a Megatron-style blend of single-source packed rows ------------------------------------
def megatron(lengths: list[np.ndarray], args: argparse.Namespace) -> Run:
    world, rows = args.world_size, args.rows
    total = args.steps * world * rows
    w = np.asarray(WEIGHTS, dtype=np.float64)
    counts = np.zeros(len(w), dtype=np.int64)
    chosen = np.empty(total, dtype=np.int64)
    for k in range(total):  # Megatron's build_blending_indices
        pick = int(np.argmax(w * max(k, 1) - counts))
        chosen[k] = pick
        counts[pick] += 1
    rng = np.random.default_rng(0)
    per_source = []
    for i, x in enumerate(lengths):
        need = int(counts[i]) * args.max_len
        stream, have = [], 0
        while have < need:  # passes over the source, each in a new random order (GPTDataset's document index)
            stream.append(x[rng.permutation(x.size)])
            have += int(stream[-1].sum())
        ends = np.cumsum(np.concatenate(stream))
        ends = ends[ends < need]
        cuts = np.union1d(ends, np.arange(1, counts[i] + 1) * args.max_len)
        starts = np.concatenate([[0], cuts[:-1]])
        per_source.append((cuts - starts, starts // args.max_len))
    slot = np.zeros(total, dtype=np.int64)  # the row's number within its source
    for i in range(len(w)):
        slot[chosen == i] = np.arange(counts[i])
    global_row = [np.empty(int(c), dtype=np.int64) for c in counts]
    for i in range(len(w)):
        global_row[i][slot[chosen == i]] = np.flatnonzero(chosen == i)
    source = np.concatenate([np.full(p[0].size, i) for i, p in enumerate(per_source)])
    sizes = np.concatenate([p[0] for p in per_source])
    row = np.concatenate([global_row[i][p[1]] for i, p in enumerate(per_source)])
    return Run(source, sizes, row, np.full(total, args.max_len), np.arange(total) // rows)


# -- printing --------------------------------------------------------------------------------------
def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    names = " / ".join(str(w) for w in WEIGHTS)
    print(f"\nToken shares (weights {names}) and fill")
    print(
        "| arm | token shares | worst window: max abs(share - weight) | windows missing an eligible source "
        "| fill | tokens truncated | rows a batch | rows (windows) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, m in results.items():
        shares = " / ".join(f"{v:.3f}" for v in m["shares"])
        fill = f"{m['fill']:.1%}" + (
            f" ({m['fill_longest']:.1%} padded to the batch's longest)" if "fill_longest" in m else ""
        )
        unit = "sequences" if name.startswith("MixtureSampler + padding") else "rows"
        print(
            f"| {name} | {shares} | {m['worst_pp']:.4f} pp (window {m['worst_window']}) | "
            f"{m['missing']} of {m['windows']} | {fill} | {m['dropped']:.2%} | {m['rows'][0]}-{m['rows'][1]} | "
            f"{m['row_count']:,} {unit} ({m['windows']}) |"
        )
    print(f"\nSlowest rank of a step over the mean, W={args.world_size} (median / p99 / worst over the steps)")
    print("| arm | steps | real tokens | attention (sum of squared piece lengths) |")
    print("|---|---|---|---|")
    for name, m in results.items():
        cells = [" / ".join(f"{v:.3f}" for v in m["balance"][k]) for k in ("tokens", "attention")]
        print(f"| {name} | {m['steps']} | {cells[0]} | {cells[1]} |")


# -- scale -----------------------------------------------------------------------------------------
CHILD = r"""
import json, os, sys, time
import numpy as np
mode, paths, world, rank, max_len, rows = sys.argv[1], sys.argv[2].split(","), *map(int, sys.argv[3:7])
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))
if mode == "evict":
    for p in paths:
        fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    sys.exit(0)
if mode == "floor":
    start = time.perf_counter()
    total = sum(int(np.sum(np.load(p, mmap_mode="r"), dtype=np.int64)) for p in paths)
    print(json.dumps({"floor_s": time.perf_counter() - start, "tokens": total}))
    sys.exit(0)
import shardwise
Sampler = shardwise.PackedMixtureSampler  # a lazy import: torch is imported here, not in the timing
base = rss()
start = time.perf_counter()
lengths = [np.load(p, mmap_mode="r") for p in paths]
sampler = Sampler(lengths, [0.5, 0.3, 0.2], max_len=max_len, rows_per_batch=rows, seed=0,
                  num_replicas=world, rank=rank)
built = time.perf_counter()
batch = next(iter(sampler))
done = time.perf_counter()
assert sum(i.stop - i.start for i in batch) == rows * max_len
print(json.dumps({"construct_s": built - start, "first_batch_s": done - built, "rss_base": base, "rss": rss(),
                  "batches": len(sampler)}))
"""


def write_lengths(n: int, directory: Path) -> list[str]:
    """int32 lengths of n documents in 3 sources (shares SCALE_SHARES), lognormal as the default data."""
    from numpy.lib.format import open_memmap

    sizes = np.floor(SCALE_SHARES * n).astype(np.int64)
    sizes[0] += n - sizes.sum()
    rng = np.random.default_rng(0)
    paths = []
    for i, (size, mean) in enumerate(zip(sizes, MEANS, strict=True)):
        path = directory / f"lengths-{n:.0e}-{i}.npy"
        out = open_memmap(path, mode="w+", dtype=np.int32, shape=(int(size),))
        for first in range(0, int(size), 1 << 24):
            stop = min(int(size), first + (1 << 24))
            block = rng.lognormal(np.log(mean) - SIGMA**2 / 2, SIGMA, stop - first)
            out[first:stop] = np.maximum(1, np.rint(block))
        out.flush()
        del out
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
        paths.append(str(path))
    return paths


def child(mode: str, paths: list[str], args: argparse.Namespace, cache: Path, rank: int = 3) -> dict[str, Any]:
    """One measurement in a fresh process, with the shardwise index cache in ``cache``."""
    command = [sys.executable, "-c", CHILD, mode, ",".join(paths)]
    command += [str(v) for v in (args.world_size, rank, args.max_len, args.rows)]
    env = {**os.environ, "SHARDWISE_CACHE_DIR": str(cache), "SHARDWISE_PROGRESS": "off"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{mode} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}


def scale(n: int, args: argparse.Namespace) -> None:
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="shardwise-packed-mixture-"))
    directory.mkdir(parents=True, exist_ok=True)
    cache = directory / f"index-cache-{n:.0e}"
    shutil.rmtree(cache, ignore_errors=True)  # cold: no index of these lengths yet
    try:
        start = time.perf_counter()
        paths = write_lengths(n, directory)
        written = time.perf_counter() - start
        size = sum(os.path.getsize(p) for p in paths)
        print(f"\nScale: {n:.0e} documents, {size / 1e9:.2f} GB of int32 lengths written in {written:.1f} s")
        child("evict", paths, args, cache)
        floor_cold = child("floor", paths, args, cache)
        child("evict", paths, args, cache)
        cold = child("sampler", paths, args, cache)
        cached = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) if cache.exists() else 0
        floor_warm = child("floor", paths, args, cache)
        warm = [child("sampler", paths, args, cache, rank=r) for r in (5, 6, 7)]
        middle = sorted(warm, key=lambda r: r["construct_s"] + r["first_batch_s"])[1]  # the median of 3
        print(
            "| n | case | floor (np.sum of the lengths) | construction | first batch | construction + first / floor "
            "| RssAnon after the first batch (growth over import) |"
        )
        print("|---|---|---|---|---|---|---|")
        for case, run, floor in (
            ("cold: no index cache, page cache evicted", cold, floor_cold["floor_s"]),
            ("another process (cache and pages there), median of 3", middle, floor_warm["floor_s"]),
        ):
            total = run["construct_s"] + run["first_batch_s"]
            print(
                f"| {n:.0e} | {case} | {floor:.3f} s | {run['construct_s']:.3f} s | "
                f"{run['first_batch_s'] * 1e3:.1f} ms | {total / floor:.1f}x | {run['rss'] / 2**20:.1f} MiB "
                f"(+{(run['rss'] - run['rss_base']) / 2**20:.1f} MiB) |"
            )
        constructions = ", ".join(f"{r['construct_s'] * 1e3:.1f} + {r['first_batch_s'] * 1e3:.1f}" for r in warm)
        print(
            f"(batches in the epoch: {cold['batches']:,} a rank; index cache written by the cold run: "
            f"{cached / 1e6:.2f} MB; the 3 other processes, construction + first batch: {constructions} ms)"
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for path in directory.glob(f"lengths-{n:.0e}-*.npy"):
                path.unlink()


def run_arms(arms: set[int], lengths: list[np.ndarray], means: list[float], args: argparse.Namespace) -> None:
    """Run the chosen arms on the same sources and print their tables."""
    results: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {}
    speed: dict[str, float] = {}
    if 1 in arms:
        start = time.perf_counter()
        run, speed = packed_mixture(lengths, args)
        results["PackedMixtureSampler (weights in tokens)"] = measures(run, WEIGHTS, means, args.world_size)
        timings["1"] = time.perf_counter() - start
    if arms & {2, 3}:
        batches = mixture_batches(lengths, args)
        if 2 in arms:
            start = time.perf_counter()
            run, longest = padded(lengths, batches, args)
            m = measures(run, WEIGHTS, means, args.world_size)
            m["fill_longest"] = longest
            results[f"MixtureSampler + padding ({args.docs_per_batch} documents, weights in samples)"] = m
            timings["2"] = time.perf_counter() - start
        if 3 in arms:
            start = time.perf_counter()
            results[f"today's recipe: MixtureSampler {args.docs_per_batch} + PackCollate"] = measures(
                recipe(lengths, batches, args), WEIGHTS, means, args.world_size
            )
            timings["3"] = time.perf_counter() - start
    if 4 in arms:
        start = time.perf_counter()
        run = trl_packing(lengths, args)
        results["TRL pack_dataset (bfd) over interleave_datasets"] = measures(run, WEIGHTS, means, args.world_size)
        timings["4"] = time.perf_counter() - start
    if 5 in arms:
        start = time.perf_counter()
        results["Megatron-style blend of single-source rows"] = measures(
            megatron(lengths, args), WEIGHTS, means, args.world_size
        )
        timings["5"] = time.perf_counter() - start
    if results:
        table(results, args)
    if speed:
        print(
            f"\nPackedMixtureSampler, {args.rows} rows of {args.max_len} a batch, W={args.world_size}: "
            f"construction {speed['construct'] * 1e3:.1f} ms, a rank's first batch {speed['first'] * 1e3:.2f} ms "
            f"(median over the ranks), then {speed['batch'] * 1e3:.2f} ms a batch "
            f"(p99 {speed['batch_p99'] * 1e3:.2f} ms)"
        )
    if timings:
        print("(seconds an arm took here: " + ", ".join(f"{k}: {v:.1f}" for k, v in timings.items()) + ")")


# -- main ------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="DIR",
        help="take the sources from WikiText-2 paragraph lengths in DIR (valid.txt and test.txt, "
        "plain or .gz; the repository's copy: bench/data/wikitext-2); default: synthetic",
    )
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=4, help="rows a rank's batch (packed arms)")
    parser.add_argument("--docs-per-batch", type=int, default=32, help="documents a rank's batch (sample arms)")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=160, help="global steps each arm runs")
    parser.add_argument("--arms", default="1,2,3,4,5", help="which arms to run (numbers as in the docstring)")
    parser.add_argument(
        "--scale",
        type=float,
        nargs="*",
        default=[],
        metavar="N",
        help="also the cold start at N documents (e.g. 1e8 1e9; 1e9 writes ~4 GB under --dir)",
    )
    parser.add_argument("--dir", default=None, help="scratch folder for --scale (default: a temporary folder)")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke test: --steps 8, smaller sources, --scale at most 1e6"
    )
    args = parser.parse_args()
    if args.quick:
        args.steps = min(args.steps, 8)
        args.scale = [min(n, 1e6) for n in args.scale]
    factor = 10 if args.quick else 1
    if args.data is not None:
        lengths, data = wikitext_sources(args.data), "WikiText-2 paragraphs (1 / 10 / 40 a document)"
    else:
        lengths, data = synthetic([120_000 // factor, 24_000 // factor, 9_000 // factor]), "synthetic lognormal"
    import datasets
    import torch
    import trl

    import shardwise

    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, torch {torch.__version__}, "
        f"shardwise {getattr(shardwise, '__version__', '?')}, datasets {datasets.__version__}, trl {trl.__version__}, "
        f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}"
    )
    means = [float(x.mean()) for x in lengths]
    print(
        f"data: {data}: {len(lengths)} sources of {', '.join(f'{x.size:,}' for x in lengths)} documents, "
        f"mean {' / '.join(f'{m:.0f}' for m in means)} tokens, {' / '.join(f'{int(x.sum()):,}' for x in lengths)} "
        f"tokens; over max_len: {' / '.join(f'{np.mean(x > args.max_len):.1%}' for x in lengths)} of documents"
    )
    print(
        f"weights {WEIGHTS}, max_len {args.max_len}, W={args.world_size}, {args.steps} global steps; packed arms "
        f"{args.rows} rows a batch, sample arms {args.docs_per_batch} documents a batch"
    )
    run_arms({int(a) for a in args.arms.split(",") if a}, lengths, means, args)
    for n in args.scale:
        scale(int(n), args)


if __name__ == "__main__":
    main()
