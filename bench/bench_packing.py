"""Packing quality and plan time: PackedBatchSampler against Multipack, greedy packing and padded batches.

Run (alone on the machine; numba makes the Multipack reimplementation as fast as
the original, which is numba-jitted; without it the Multipack plan times are not comparable)::

    python -m bench.bench_packing
    python -m bench.bench_packing --quick   # WikiText-2 only, 1e5 documents at scale (a smoke test)

Data (real length distributions, all available offline):

- WikiText-2: the paragraphs of its validation and test splits (``bench/data/wikitext-2``, or
  ``--data DIR``; one per line;
  blank and `` = heading = `` lines skipped), length = whitespace tokens (4,024 documents, 1..481);
- Python stdlib code: every ``.py`` file of the interpreter's standard library (``sysconfig``
  ``stdlib`` path, ``site-packages`` and test directories excluded), cut before each top-level
  ``def``/``class``, length = tokens of the rule ``\\w+|[^\\w\\s]`` (a heavy tail: documents above
  ``max_len`` are cut into ``max_len`` pieces, for every scheme alike, as ``too_long="split"`` does);
- Python stdlib functions: every function (``def``, methods and nested ones included) of the
  interpreter's standard library parsed with ``ast``, length = its ``tokenize`` tokens
  (``common.function_lengths``, cached in ``bench/out/``): a long tail (median 42, max ~93x that).

Schemes (each gives, per epoch, the batches of W=8 ranks; step ``s`` is ranks' batches ``sW..sW+W-1``):

- random padded: a random permutation in batches of a fixed size (the mean number of documents
  that fill a batch's token budget), each padded to its longest;
- BucketBatchSampler(max_tokens=budget): padded batches of similar lengths;
- greedy sequential packing (torchtune's ``PackedDataset`` idea, reimplemented from its
  description): documents in shuffled order appended to a row until the next does not fit, rows
  padded to ``max_len``, ``rows_per_batch`` rows a batch;
- Multipack (reimplemented from the imoneoi/multipack_sampler README and algorithm description,
  no code copied): each step takes the longest run of the shuffled stream that W bins of
  ``budget`` tokens hold, found by binary search over the run length; ``linear`` checks and fills
  with first-fit decreasing (V1 / V2 LinearAttention), ``quadratic`` with longest-processing-time
  (each document to the least-loaded bin: long documents spread over ranks, V2's quadratic
  variant); the tail that does not fill a step is dropped, seeded ``seed + epoch``;
- PackedBatchSampler, ``rows_per_batch`` (every batch ``(R, max_len)``), balance tokens or
  attention, and with ``drop_last=True`` (full batches only, like Multipack's dropped tail).

Metrics (Multipack's notebook definitions, over 3 epochs):

- fill: real tokens / batch capacity (``R * max_len`` or the budget; for padded schemes the
  padded size): Multipack's "efficiency";
- utilization: real tokens / (sum over steps of the largest rank load x W); a rank's load is its
  real tokens (packed) or its padded tokens (padded schemes);
- L^2 lag: ``sqrt(mean over steps of (max - min over ranks of sum of squared lengths))`` (and the
  max over steps in place of the mean);
- batches per epoch, documents dropped per epoch, repeats (fraction of epoch 1's batches, as
  sets of documents, that epoch 0 had), plan time (one rank's plan of one epoch, best of 3).

Two tables at scale: plan time, first batch and private memory at 1e6-1e7 WikiText-like documents
(``--scale``), and fill and utilization at 1e6 documents drawn from the stdlib function lengths
(``--quality-scale``), both on the node-shared index (many strata).
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench._lib.common import DATA, STDLIB, add_data_argument, function_lengths, status_bytes, wikitext_lengths
from shardwise import BucketBatchSampler, PackedBatchSampler

WORLD = 8
EPOCHS = 3
SEED = 0

try:  # the original Multipack is numba-jitted; so is this reimplementation when numba is there
    from numba import njit
except ImportError:  # pragma: no cover - numba missing: plain Python, plan times not comparable

    def njit(fn: Callable) -> Callable:  # type: ignore[no-redef]
        return fn


# -- data ------------------------------------------------------------------------------------------
TOKEN = re.compile(r"\w+|[^\w\s]")
TOP_LEVEL = re.compile(r"(?m)^(?=(?:async def|def|class) )")


def stdlib_code_lengths() -> np.ndarray:
    root = STDLIB
    lengths = []
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if "site-packages" in parts or parts & {"test", "tests", "idle_test"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        lengths += [n for n in (len(TOKEN.findall(chunk)) for chunk in TOP_LEVEL.split(text)) if n]
    if not lengths:
        raise FileNotFoundError(f"no Python source under the standard library folder {str(root)!r}")
    return np.array(lengths, dtype=np.int64)


def pieces(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """Every document cut into pieces of at most max_len (what too_long='split' packs)."""
    out = []
    for length in lengths.tolist():
        full, rest = divmod(length, max_len)
        out += [max_len] * full + ([rest] if rest or not full else [])
    return np.array(out, dtype=np.int64)


# -- what a scheme gives ---------------------------------------------------------------------------
@dataclass
class Epoch:
    batches: list[np.ndarray]  # item ids per batch (global order: step s is batches sW..sW+W-1)
    capacity: list[int]  # per batch: the tokens it occupies (budget, or padded size)
    padded: bool  # a rank's load is its padded size, not its real tokens


Scheme = Callable[[np.ndarray, int], Epoch]


def rng_for(epoch: int) -> np.random.Generator:
    return np.random.default_rng([SEED, epoch])


def random_padded(items: np.ndarray, epoch: int, budget: int) -> Epoch:
    size = max(1, round(budget / items.mean()))
    order = rng_for(epoch).permutation(items.size)
    batches = [order[i : i + size] for i in range(0, order.size, size)]
    return Epoch(batches, [len(b) * int(items[b].max()) for b in batches], padded=True)


def bucket(items: np.ndarray, epoch: int, budget: int) -> Epoch:
    sampler = BucketBatchSampler(items, max_tokens=budget, seed=SEED, num_replicas=1, rank=0)
    sampler.set_epoch(epoch)
    batches = [np.array(b) for b in sampler]
    return Epoch(batches, [len(b) * int(items[b].max()) for b in batches], padded=True)


def greedy(items: np.ndarray, epoch: int, max_len: int, rows: int) -> Epoch:
    order = rng_for(epoch).permutation(items.size)
    packs: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, length in zip(order.tolist(), items[order].tolist(), strict=True):
        if current and used + length > max_len:
            packs.append(current)
            current, used = [], 0
        current.append(i)
        used += length
    if current:
        packs.append(current)
    batches = [np.array([i for pack in packs[j : j + rows] for i in pack], dtype=np.int64)
               for j in range(0, len(packs), rows)]  # fmt: skip
    return Epoch(batches, [rows * max_len] * len(batches), padded=False)


@njit
def _fits(sorted_desc: np.ndarray, capacity: int, bins: int, quadratic: bool) -> bool:
    loads = np.zeros(bins, dtype=np.int64)
    for size in sorted_desc:
        if quadratic:  # longest processing time: the least-loaded bin
            b = np.argmin(loads)
            if loads[b] + size > capacity:
                return False
            loads[b] += size
        else:  # first fit
            placed = False
            for b in range(bins):
                if loads[b] + size <= capacity:
                    loads[b] += size
                    placed = True
                    break
            if not placed:
                return False
    return True


@njit
def _assign(sorted_desc: np.ndarray, capacity: int, bins: int, quadratic: bool) -> np.ndarray:
    loads = np.zeros(bins, dtype=np.int64)
    out = np.empty(sorted_desc.size, dtype=np.int64)
    for k in range(sorted_desc.size):
        size = sorted_desc[k]
        if quadratic:
            b = np.argmin(loads)
        else:
            b = 0
            while loads[b] + size > capacity:
                b += 1
        loads[b] += size
        out[k] = b
    return out


@njit
def _multipack(lengths: np.ndarray, capacity: int, bins: int, quadratic: bool) -> tuple[np.ndarray, np.ndarray]:
    """(step start offsets into the stream, bin of every stream position; -1: dropped tail)."""
    total = lengths.size
    cumsum = np.cumsum(lengths)
    bin_of = np.full(total, -1, dtype=np.int64)
    starts = [0]
    start, before = 0, 0
    while start < total:
        # the longest run [start, start + run) that the bins hold: binary search over run, [low, high)
        low = 1
        high = 1 + np.searchsorted(cumsum[start:], before + capacity * bins, "right")
        high = min(high, total - start + 1)
        while high - low > 1:
            mid = (low + high) // 2
            if _fits(np.sort(lengths[start : start + mid])[::-1], capacity, bins, quadratic):
                low = mid
            else:
                high = mid
        run = lengths[start : start + low]
        order = np.argsort(run)[::-1]
        assigned = _assign(run[order], capacity, bins, quadratic)
        if start + low >= total and (quadratic or assigned.max() < bins - 1):
            break  # the tail does not fill a step: dropped, as Multipack does
        for k in range(order.size):
            bin_of[start + order[k]] = assigned[k]
        start += low
        before = cumsum[start - 1]
        starts.append(start)
    return np.array(starts, dtype=np.int64), bin_of


def multipack(items: np.ndarray, epoch: int, budget: int, quadratic: bool) -> Epoch:
    order = np.random.default_rng(SEED + epoch).permutation(items.size)  # as published: seed + epoch
    starts, bin_of = _multipack(items[order], budget, WORLD, quadratic)
    batches = []
    for first, end in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        stream = np.arange(first, end)
        for b in range(WORLD):
            batches.append(order[stream[bin_of[first:end] == b]])
    return Epoch(batches, [budget] * len(batches), padded=False)


def packed(items_or_lengths: np.ndarray, epoch: int, max_len: int, rows: int, **options: object) -> Epoch:
    sampler = PackedBatchSampler(items_or_lengths, max_len=max_len, rows_per_batch=rows, seed=SEED,
                                 num_replicas=1, rank=0, **options)  # type: ignore[arg-type]  # fmt: skip
    sampler.set_epoch(epoch)
    # piece id of (sample, start): pieces are numbered sample by sample, as pieces() lists them
    per_sample = np.maximum(-(-items_or_lengths // max_len), 1)
    first_piece = np.cumsum(per_sample) - per_sample
    batches = [np.array([first_piece[int(i)] + i.start // max_len for i in b], dtype=np.int64) for b in sampler]
    return Epoch(batches, [rows * max_len] * len(batches), padded=False)


# -- metrics -------------------------------------------------------------------------------------
def measure(items: np.ndarray, epochs: list[Epoch]) -> dict[str, float]:
    fills, utils, lag_avg, lag_max, drops = [], [], [], [], []
    for epoch in epochs:
        n = len(epoch.batches)
        dealt = [epoch.batches[k % n] for k in range(-(-n // WORLD) * WORLD)]  # the last step padded, as dealt
        capacity = [epoch.capacity[k % n] for k in range(len(dealt))]
        real = np.array([int(items[b].sum()) for b in dealt])
        squares = np.array([int((items[b] ** 2).sum()) for b in dealt]).reshape(-1, WORLD)
        load = (np.array(capacity) if epoch.padded else real).reshape(-1, WORLD)
        fills.append(real.sum() / sum(capacity))
        utils.append(real.sum() / (load.max(1).sum() * WORLD))
        lag = squares.max(1) - squares.min(1)
        lag_avg.append(np.sqrt(lag.mean()))
        lag_max.append(np.sqrt(lag.max()))
        covered = np.unique(np.concatenate(epoch.batches))
        drops.append(items.size - covered.size)
    seen = {frozenset(b.tolist()) for b in epochs[0].batches}
    repeats = sum(frozenset(b.tolist()) in seen for b in epochs[1].batches) / len(epochs[1].batches)
    return {
        "fill": float(np.mean(fills)), "util": float(np.mean(utils)), "lag": float(np.mean(lag_avg)),
        "lag_max": float(np.mean(lag_max)), "batches": float(np.mean([len(e.batches) for e in epochs])),
        "dropped": float(np.mean(drops)), "repeats": repeats,
    }  # fmt: skip


def best_time(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def rank_epoch(lengths: np.ndarray, max_len: int, rows: int, **options: object) -> Callable[[], object]:
    """One rank's plan of one (new) epoch, from a sampler built once (the one-off part is timed apart)."""
    sampler = PackedBatchSampler(lengths, max_len=max_len, rows_per_batch=rows, seed=SEED,
                                 num_replicas=WORLD, rank=3, **options)  # type: ignore[arg-type]  # fmt: skip
    epochs = iter(range(1, 10**6))

    def run() -> None:
        sampler.set_epoch(next(epochs))
        for _ in sampler:
            pass

    return run


def table(name: str, lengths: np.ndarray, max_len: int, rows: int) -> None:
    items = pieces(lengths, max_len)
    budget = rows * max_len
    p50, p99 = np.percentile(lengths, [50, 99])
    print(f"\n{name}: {lengths.size} documents ({items.size} pieces of <= {max_len}), {int(lengths.sum())} tokens, "
          f"p50 {p50:.0f}, p99 {p99:.0f}, max {int(lengths.max())}; max_len={max_len}, rows_per_batch={rows} "
          f"(budget {budget} tokens a rank-batch), W={WORLD}, {EPOCHS} epochs; fill bound keeping every document: "
          f"{items.sum() / (-(-int(items.sum()) // budget) * budget):.2%}")  # fmt: skip
    schemes: dict[str, tuple[Callable[[int], Epoch], Callable[[], object]]] = {
        "random padded": (lambda e: random_padded(items, e, budget), lambda: random_padded(items, 1, budget)),
        "BucketBatchSampler(max_tokens=budget)": (lambda e: bucket(items, e, budget), lambda: bucket(items, 1, budget)),
        "greedy sequential packing (torchtune idea)": (
            lambda e: greedy(items, e, max_len, rows), lambda: greedy(items, 1, max_len, rows)),
        "Multipack linear (FFD + binary search)": (
            lambda e: multipack(items, e, budget, False), lambda: multipack(items, 1, budget, False)),
        "Multipack quadratic (LPT + binary search)": (
            lambda e: multipack(items, e, budget, True), lambda: multipack(items, 1, budget, True)),
        "PackedBatchSampler balance=tokens": (
            lambda e: packed(lengths, e, max_len, rows), rank_epoch(lengths, max_len, rows)),
        "PackedBatchSampler balance=tokens, drop_last": (
            lambda e: packed(lengths, e, max_len, rows, drop_last=True),
            rank_epoch(lengths, max_len, rows, drop_last=True)),
        "PackedBatchSampler balance=attention": (
            lambda e: packed(lengths, e, max_len, rows, balance="attention"),
            rank_epoch(lengths, max_len, rows, balance="attention")),
        "PackedBatchSampler balance=attention, drop_last": (
            lambda e: packed(lengths, e, max_len, rows, balance="attention", drop_last=True),
            rank_epoch(lengths, max_len, rows, balance="attention", drop_last=True)),
    }  # fmt: skip
    multipack(items[:100], 0, budget, True)  # jit warm-up, not timed
    multipack(items[:100], 0, budget, False)
    print("| scheme | fill | utilization | L^2 lag avg | L^2 lag max | batches/epoch | dropped/epoch | repeats | "
          "plan ms (1 rank, 1 epoch) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, (epoch_of, one_rank) in schemes.items():
        m = measure(items, [epoch_of(e) for e in range(EPOCHS)])
        ms = best_time(one_rank) * 1e3
        print(f"| {label} | {m['fill']:.2%} | {m['util']:.2%} | {m['lag']:.0f} | {m['lag_max']:.0f} | "
              f"{m['batches']:.0f} | {m['dropped']:.0f} | {m['repeats']:.1%} | {ms:.1f} |")  # fmt: skip
    build = best_time(lambda: PackedBatchSampler(lengths, max_len=max_len, rows_per_batch=rows, seed=SEED,
                                                 num_replicas=WORLD, rank=0))  # fmt: skip
    print(f"PackedBatchSampler construction (item index + batch counts, once per run): {build * 1e3:.1f} ms")


def scale(n: int, max_len: int, rows: int, data: Path = DATA) -> None:
    """Plan time, first-batch latency and private memory at n documents drawn from the WikiText-2 lengths."""

    lengths = np.random.default_rng(5).choice(wikitext_lengths(data), size=n).astype(np.uint16)
    cache = tempfile.mkdtemp(prefix="shardwise-bench-")  # a fresh node cache: the build is timed, not a hit

    def construct() -> PackedBatchSampler:
        return PackedBatchSampler(lengths, max_len=max_len, rows_per_batch=rows, seed=SEED, num_replicas=WORLD,
                                  rank=0, cache_dir=cache)  # fmt: skip

    before = status_bytes("RssAnon")
    start = time.perf_counter()
    construct()
    built = time.perf_counter() - start
    start = time.perf_counter()
    sampler = construct()  # another rank of the node: opens what the first built
    opened = time.perf_counter() - start
    start = time.perf_counter()
    iterator = iter(sampler)
    next(iterator)
    first = time.perf_counter() - start
    start = time.perf_counter()
    count = 1 + sum(1 for _ in iterator)
    rest = time.perf_counter() - start
    print(f"| {n:.0e} | {sampler.num_strata} | {built:.2f} | {opened * 1e3:.0f} | {first * 1e3:.0f} | "
          f"{first + rest:.2f} | {count} | {(status_bytes('RssAnon') - before) / 2**20:.0f} |")  # fmt: skip
    shutil.rmtree(cache)


def quality_at_scale(n: int, max_len: int, rows: int) -> None:
    """Fill and utilization of the global plan of n documents drawn from the stdlib function lengths (shared index)."""
    lengths = np.random.default_rng(5).choice(function_lengths(), size=n).astype(np.uint16)
    needed = -(-int(lengths.astype(np.int64).sum()) // (rows * max_len))
    for balance in ("tokens", "attention"):
        cache = tempfile.mkdtemp(prefix="shardwise-bench-")
        sampler = PackedBatchSampler(lengths, max_len=max_len, rows_per_batch=rows, balance=balance, seed=SEED,
                                     num_replicas=1, rank=0, cache_dir=cache)  # fmt: skip
        loads = np.array([sum(i.stop - i.start for i in batch) for batch in sampler])
        dealt = loads[np.arange(-(-loads.size // WORLD) * WORLD) % loads.size].reshape(-1, WORLD)
        print(f"| {n:.0e} | {balance} | {sampler.num_strata} | {loads.size} | {needed} | "
              f"{dealt.sum() / (dealt.size * rows * max_len):.2%} | {dealt.sum() / (dealt.max(1).sum() * WORLD):.2%} |")
        shutil.rmtree(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, nargs="*", default=[1e6, 1e7], help="document counts, scale table")
    parser.add_argument("--quality-scale", type=float, nargs="*", default=[1e6],
                        help="document counts, fill/utilization at scale table")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="the WikiText-2 table and --scale 1e5 only: no stdlib tables (a smoke test)")  # fmt: skip
    add_data_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.scale, args.quality_scale = [1e5], []
    table("WikiText-2 paragraphs", wikitext_lengths(args.data), max_len=1024, rows=4)
    if not args.quick:
        table("Python stdlib code (top-level defs/classes)", stdlib_code_lengths(), max_len=2048, rows=8)
        table("Python stdlib functions (ast, tokenize tokens)", function_lengths(), max_len=4096, rows=4)
    print(f"\nscale: documents drawn from the WikiText-2 lengths, max_len=1024, rows_per_batch=4, W={WORLD}, rank 0; "
          "construction builds the node-shared index (cache) and the per-stratum batch counts once")  # fmt: skip
    print("| documents | strata | construction s (build, once a node) | construction ms (cache hit, other ranks) | "
          "first batch ms | one rank's epoch s | batches/rank | RssAnon MB |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.scale:
        scale(int(n), 1024, 4, args.data)
    if not args.quality_scale:
        return
    print(f"\nfill and utilization at scale: documents drawn from the stdlib function lengths, max_len=4096, "
          f"rows_per_batch=4, W={WORLD} (the global plan, last step padded as dealt)")  # fmt: skip
    print("| documents | balance | strata | batches | ceil(tokens / budget) | fill | utilization |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in args.quality_scale:
        quality_at_scale(int(n), 4096, 4)


if __name__ == "__main__":
    main()
