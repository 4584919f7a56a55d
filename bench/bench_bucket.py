"""BucketBatchSampler against three common length-batching schemes, on real WikiText-2 paragraph lengths.

Run (alone on the machine: the figures are timings)::

    python -m bench.bench_bucket

Data: the paragraphs of WikiText-2's validation and test splits (``bench/data/wikitext-2``, or
``--data DIR``; one per line; blank
lines and `` = heading = `` lines skipped), length = whitespace token count.

Schemes, each giving one epoch's global sequence of batches (the plan; on W ranks step ``s`` is
batches ``sW .. sW+W-1``, as shardwise and accelerate's batch sharding deal them):

- random: a random permutation cut into batches;
- length-grouped (the HF transformers ``group_by_length`` idea, reimplemented from its
  description): megabatches of ``50 * 16`` random samples, each sorted by length (longest
  first), cut into batches; the batch holding the longest sample goes first;
- sorted batch_by_size (fairseq-style): all samples sorted by length (random tie-break, redrawn
  every epoch here), cut into batches, the batches shuffled;
- BucketBatchSampler, with its defaults (whole-epoch sort) and with ``sort_window=800`` (as local
  as the megabatches).

Batches are cut at a fixed size of 16, or greedily under a padded-token budget of 4096
(``len(batch) * max(length) <= 4096``; the baselines close a batch when the next sample would
not fit). Metrics:

- waste: ``1 - real tokens / padded tokens`` over the epoch;
- imbalance: for each global step of W=4 batches, max / mean padded tokens; averaged over steps;
- repeats: the fraction of epoch 1's batches (as sets of samples) that epoch 0 also had;
- steps: global steps of W=4 per epoch (fewer is better at equal budget).

Then the time to build one epoch's plan for 1e7 random lengths (uniform in 1..512), beside the
time numpy takes to argsort those lengths once (the floor of any sorting scheme).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np

from bench._lib.common import add_data_argument, wikitext_lengths
from shardwise import BucketBatchSampler

WORLD = 4
BATCH = 16
MAX_TOKENS = 4096
MEGABATCH = 50 * BATCH
SEED = 0

Batches = list[list[int]]


def rng_for(epoch: int, seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


def cut(order: np.ndarray, lengths: np.ndarray, max_tokens: int | None) -> Batches:
    """Cut an ordered stream into batches of BATCH, or greedily under max_tokens."""
    if max_tokens is None:
        return [order[i : i + BATCH].tolist() for i in range(0, order.size, BATCH)]
    batches: Batches = []
    batch: list[int] = []
    longest = 0
    for index in order.tolist():
        length = max(int(lengths[index]), 1)
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    return batches


def random_batches(lengths: np.ndarray, max_tokens: int | None, epoch: int) -> Batches:
    return cut(rng_for(epoch).permutation(lengths.size), lengths, max_tokens)


def length_grouped(lengths: np.ndarray, max_tokens: int | None, epoch: int, seed: int = SEED) -> Batches:
    order = rng_for(epoch, seed).permutation(lengths.size)
    batches: Batches = []
    for first in range(0, order.size, MEGABATCH):
        mega = order[first : first + MEGABATCH]
        mega = mega[np.argsort(-lengths[mega], kind="stable")]
        batches += cut(mega, lengths, max_tokens)
    longest = int(np.argmax([lengths[b].max() for b in batches]))
    batches[0], batches[longest] = batches[longest], batches[0]
    return batches


def batch_by_size(lengths: np.ndarray, max_tokens: int | None, epoch: int) -> Batches:
    rng = rng_for(epoch)
    shuffled = rng.permutation(lengths.size)
    order = shuffled[np.argsort(lengths[shuffled], kind="stable")]
    batches = cut(order, lengths, max_tokens)
    return [batches[i] for i in rng.permutation(len(batches))]


def bucket(
    sort_window: int | None, seed: int = SEED, multiple: int = 1, **options: object
) -> Callable[[np.ndarray, int | None, int], Batches]:
    def plan(lengths: np.ndarray, max_tokens: int | None, epoch: int) -> Batches:
        size: dict[str, int] = {"batch_size": BATCH}
        if max_tokens is not None:
            size = {"max_tokens": max_tokens, "batch_size_multiple": multiple}
        sampler = BucketBatchSampler(lengths, sort_window=sort_window, seed=seed, num_replicas=1, rank=0, **size,
                                     **options)  # type: ignore[arg-type]  # fmt: skip
        sampler.set_epoch(epoch)
        return list(sampler)

    return plan


SCHEMES: dict[str, Callable[[np.ndarray, int | None, int], Batches]] = {
    "random": random_batches,
    "length-grouped (HF idea)": length_grouped,
    "sorted batch_by_size (fairseq-style)": batch_by_size,
    "BucketBatchSampler": bucket(None),
    "BucketBatchSampler sort_window=800": bucket(800),
}


def metrics(lengths: np.ndarray, epochs: list[Batches]) -> dict[str, float]:
    first, second = epochs
    padded = np.array([len(b) * max(int(lengths[b].max()), 1) for b in first])
    real = sum(int(lengths[b].sum()) for b in first)
    steps = padded[: padded.size // WORLD * WORLD].reshape(-1, WORLD)  # steps: (global steps, W)
    seen = {frozenset(b) for b in first}
    covered = sorted(i for b in first for i in b)
    if covered != list(range(lengths.size)):
        raise RuntimeError("a scheme did not plan every sample exactly once")
    return {
        "waste": 1 - real / int(padded.sum()),
        "imbalance": float((steps.max(1) / steps.mean(1)).mean()),
        "repeats": sum(frozenset(b) in seen for b in second) / len(second),
        "steps": -(-len(first) // WORLD),
    }


def quality_table(lengths: np.ndarray) -> None:
    span = f"lengths {int(lengths.min())}..{int(lengths.max())}, median {int(np.median(lengths))}"
    print(f"WikiText-2 valid+test paragraphs: {lengths.size} samples, {int(lengths.sum())} tokens, {span}; W={WORLD}")
    for label, max_tokens in ((f"batch_size={BATCH}", None), (f"max_tokens={MAX_TOKENS}", MAX_TOKENS)):
        print(f"\n{label}")
        print(f"| scheme | waste | imbalance (max/mean) | repeats between epochs | steps (W={WORLD}) |")
        print("|---|---:|---:|---:|---:|")
        for name, scheme in SCHEMES.items():
            m = metrics(lengths, [scheme(lengths, max_tokens, epoch) for epoch in (0, 1)])
            print(f"| {name} | {m['waste']:.2%} | {m['imbalance']:.3f} | {m['repeats']:.1%} | {m['steps']:.0f} |")


def seed_spread(lengths: np.ndarray, seeds: int) -> None:
    """The BucketBatchSampler rows again for several seeds: the figures above are not one lucky draw."""
    print(f"\nBucketBatchSampler (defaults) over seeds 0..{seeds - 1}, epochs 0 and 1: min .. max")
    print("| mode | waste | imbalance (max/mean) | repeats between epochs | mean repeats |")
    print("|---|---:|---:|---:|---:|")
    modes = [(f"batch_size={BATCH}", None, 1), (f"max_tokens={MAX_TOKENS}", MAX_TOKENS, 1),
             (f"max_tokens={MAX_TOKENS}, batch_size_multiple=8", MAX_TOKENS, 8)]  # fmt: skip
    for label, max_tokens, multiple in modes:
        scheme = [bucket(None, seed, multiple) for seed in range(seeds)]
        rows = [metrics(lengths, [plan(lengths, max_tokens, e) for e in (0, 1)]) for plan in scheme]
        waste, imbalance, repeats = ([row[key] for row in rows] for key in ("waste", "imbalance", "repeats"))
        print(f"| {label} | {min(waste):.2%} .. {max(waste):.2%} | {min(imbalance):.3f} .. {max(imbalance):.3f} "
              f"| {min(repeats):.1%} .. {max(repeats):.1%} | {np.mean(repeats):.1%} |")  # fmt: skip


RUN = 64  # batches: the run inside which the order should not follow the length
SEEDS_FOR_RHO = 10


def _spearman(values: np.ndarray) -> float:
    ranks = np.argsort(np.argsort(values, kind="stable"), kind="stable")
    if np.all(values == values[0]):
        return 0.0
    return float(np.corrcoef(np.arange(values.size), ranks)[0, 1])


def shuffle_metrics(lengths: np.ndarray, plan: Callable[[int, int], Batches]) -> dict[str, float]:
    """Contents and order across epochs and seeds, plus padding and balance, of ``plan(seed, epoch)``."""
    a, b, c = plan(0, 0), plan(0, 1), plan(1, 0)
    sets = {frozenset(batch) for batch in a}
    longest = np.array([int(lengths[batch].max()) for batch in a])
    rhos = []
    for seed in range(SEEDS_FOR_RHO):  # one epoch holds few runs of 64: their mean over seeds
        most = np.array([int(lengths[batch].max()) for batch in (a if seed == 0 else plan(seed, 0))])
        runs = [most[i : i + RUN] for i in range(0, most.size, RUN)]  # aligned runs; the last may be shorter
        rhos += [_spearman(run) for run in runs if run.size >= 8]
    padded = np.array([len(batch) * max(int(lengths[batch].max()), 1) for batch in a])
    real = sum(int(lengths[batch].sum()) for batch in a)
    imbalance = {}
    for world in (4, 8):
        steps = padded[: padded.size // world * world].reshape(-1, world)  # (global steps, W)
        imbalance[world] = float((steps.max(1) / steps.mean(1)).mean()) if steps.size else 1.0
    return {
        "epochs": sum(frozenset(batch) in sets for batch in b) / len(b),
        "seeds": sum(frozenset(batch) in sets for batch in c) / len(c),
        "rho": float(np.mean(rhos)),
        "abs_rho": float(np.mean(np.abs(rhos))),
        "waste": 1 - real / int(padded.sum()),
        "w4": imbalance[4],
        "w8": imbalance[8],
        "first_longest": float(longest[0] == longest.max()),
    }


def shuffle_table(sets: dict[str, np.ndarray]) -> None:
    """Issue 46's table: do batches change with epoch and seed, and does the order still follow the length?"""
    print(f"\nShuffle at batch_size={BATCH}: identical batches between epochs 0 and 1 (seed 0) and between seeds 0 "
          f"and 1 (epoch 0); Spearman rho of each batch's longest length against its position in aligned runs of "
          f"{RUN} batches (mean, mean |rho|); waste; imbalance (max/mean padded tokens a step) at W=4 and W=8; "
          "whether plan batch 0 holds the longest sample")  # fmt: skip
    print("| data | scheme | same, epochs | same, seeds | rho | abs rho | waste | imbalance W=4 | W=8 "
          "| longest first |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for data, lengths in sets.items():
        schemes = _shuffle_schemes(lengths)
        for name, plan in schemes.items():
            m = shuffle_metrics(lengths, plan)
            print(
                f"| {data} | {name} | {m['epochs']:.1%} | {m['seeds']:.1%} | {m['rho']:+.2f} | {m['abs_rho']:.2f} "
                f"| {m['waste']:.2%} | {m['w4']:.3f} | {m['w8']:.3f} | {'yes' if m['first_longest'] else 'no'} |"
            )


def _shuffle_schemes(lengths: np.ndarray) -> dict[str, Callable[[int, int], Batches]]:
    return {
        "length-grouped (HF idea)": lambda seed, epoch: length_grouped(lengths, None, epoch, seed),
        "Bucket, batch_order='ascending' (before)": lambda seed, epoch: bucket(None, seed, batch_order="ascending")(
            lengths, None, epoch
        ),
        "Bucket (default: mixed)": lambda seed, epoch: bucket(None, seed)(lengths, None, epoch),
        "Bucket, longest_first=True (Trainer)": lambda seed, epoch: bucket(None, seed, longest_first=True)(
            lengths, None, epoch
        ),
        "Bucket, balance_group=8": lambda seed, epoch: bucket(None, seed, balance_group=8)(lengths, None, epoch),
    }


def build_times(n: int, repeat: int) -> None:
    lengths = np.random.default_rng(1).integers(1, 513, n).astype(np.int64)
    print(f"\nplan build for n={n:.0e} random lengths (1..512), best of {repeat}")
    print("| what | seconds | x argsort |")
    print("|---|---:|---:|")

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    floor = best(lambda: np.argsort(lengths, kind="stable"))
    print(f"| numpy argsort(lengths, kind='stable') (baseline) | {floor:.2f} | 1.0 |")
    cache = tempfile.mkdtemp(prefix="bench-bucket-")  # the shared length index, removed at the end
    start = time.perf_counter()
    BucketBatchSampler(lengths, max_tokens=4096, seed=SEED, num_replicas=1, rank=0, cache_dir=cache)
    cold = time.perf_counter() - start
    warm = best(lambda: BucketBatchSampler(lengths, max_tokens=4096, seed=SEED, num_replicas=1, rank=0,
                                           cache_dir=cache))  # fmt: skip
    print(f"| construct BucketBatchSampler, cold (hash, build the length index) | {cold:.2f} | {cold / floor:.1f} |")
    print(f"| construct BucketBatchSampler, warm (hash, open the index) | {warm:.2f} | {warm / floor:.1f} |")
    rows = [
        ("epoch plan, batch_size=16", {"batch_size": 16}),
        ("epoch plan, max_tokens=4096", {"max_tokens": 4096}),
        ("epoch plan, max_tokens=4096, batch_size_multiple=8", {"max_tokens": 4096, "batch_size_multiple": 8}),
        ("epoch plan, max_tokens=4096, sort_window=100000", {"max_tokens": 4096, "sort_window": 100_000}),
    ]
    for name, options in rows:
        sampler = BucketBatchSampler(lengths, seed=SEED, num_replicas=1, rank=0, cache_dir=cache, **options)
        epochs = iter(range(10**6))

        def build(sampler: BucketBatchSampler = sampler, epochs: Iterator[int] = epochs) -> None:
            sampler.set_epoch(next(epochs))  # a new epoch: the plan is built by len()
            len(sampler)

        seconds = best(build)
        print(f"| {name} | {seconds:.2f} | {seconds / floor:.1f} |")
    shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1e6 lengths for the build time (smoke test)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=20, help="seeds for the BucketBatchSampler spread table")
    parser.add_argument("--shuffle-only", action="store_true", help="the quality and shuffle tables only")
    add_data_argument(parser)
    args = parser.parse_args()
    lengths = wikitext_lengths(args.data)
    quality_table(lengths)
    distinct = np.random.default_rng(7).permutation(np.arange(1, lengths.size + 1))
    shuffle_table({"WikiText-2": lengths, "distinct lengths (same n)": distinct,
                   "distinct, 25 batches": np.arange(1, 25 * BATCH + 1)})  # fmt: skip
    if args.shuffle_only:
        return
    seed_spread(lengths, args.seeds)
    build_times(10**6 if args.quick else 10**7, args.repeat)


if __name__ == "__main__":
    main()
