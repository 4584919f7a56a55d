"""Provenance queries at scale: ``shardwise.which`` / ``shardwise.when`` per-query time, against the issue's targets.

For each sampler, random queries spread over a whole epoch of ``n`` samples (each query a fresh
step or sample, so nothing is cached between queries but the sampler itself): the median and p99
time per query, and the ratio of the median to the target (issue 23: <= 1 ms per query for
``ShardedSampler`` and ``MixtureSampler`` at n = 1e9, <= 10 ms warm for the index-based samplers).
Nothing is stored per sample: the table shows the private memory the queries added
(``/proc/self/smaps_rollup`` ``Private_Dirty``), against the 4 bytes a sample (4 GB at 1e9) of
the per-epoch index file that OLMo-core writes to answer the same question.

    python -m bench.bench_which --size 1e9 --queries 300
    python -m bench.bench_which --quick   # n = 1e7, index-based 1e5, 30 queries (a smoke test)
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shardwise
from bench._lib.common import smaps_rollup
from shardwise import (
    BucketBatchSampler,
    ClassBalancedBatchSampler,
    LocalitySampler,
    MixtureSampler,
    PackedBatchSampler,
    ShardedSampler,
    TwoStreamBatchSampler,
    WeightedSampler,
    when,
    which,
)

BATCH = 32
WORLD = 8


def timed(queries: list[Any], query: Callable[[Any], object]) -> tuple[float, float, float]:
    """Median and p99 wall seconds per query, and the median CPU seconds of this thread per query.

    The CPU time is what a query costs on an idle core: on a shared machine the wall time also
    counts the time other processes held the core.
    """
    times, cpu = [], []
    for argument in queries:
        start, start_cpu = time.perf_counter(), time.thread_time()
        query(argument)
        cpu.append(time.thread_time() - start_cpu)
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))], statistics.median(cpu)


def cases(n: int, index_n: int) -> list[tuple[str, Any, int | None, int, float]]:
    """``(name, sampler, batch_size, samples in the epoch, target seconds)``."""
    third = n // 3
    mixture = MixtureSampler([third, third, n - 2 * third - 7, 7], [0.4, 0.3, 0.2, 0.1], num_samples=n, seed=1,
                             num_replicas=WORLD, rank=0)  # fmt: skip
    lengths = (np.arange(index_n, dtype=np.int64) * 7919) % 2000 + 1
    bucket = BucketBatchSampler(lengths, batch_size=BATCH, seed=1, num_replicas=WORLD, rank=0)
    tokens = BucketBatchSampler(lengths, max_tokens=BATCH * 2000, seed=1, num_replicas=WORLD, rank=0)
    rank0 = {"seed": 1, "num_replicas": WORLD, "rank": 0}
    return [
        ("ShardedSampler", ShardedSampler(n, **rank0), BATCH, n, 1e-3),
        ("MixtureSampler", mixture, BATCH, n, 1e-3),
        ("BucketBatchSampler batch_size (shared index, warm)", bucket, None, index_n, 1e-2),
        ("BucketBatchSampler max_tokens (shared index, warm)", tokens, None, index_n, 1e-2),
        ("LocalitySampler", LocalitySampler([1000] * (index_n // 1000), window=8, **rank0), BATCH, index_n, 1e-2),
        ("PackedBatchSampler", PackedBatchSampler(lengths % 512 + 1, max_len=2048, rows_per_batch=4, **rank0), None,
         index_n, 1e-2),
        ("ClassBalancedBatchSampler", ClassBalancedBatchSampler(np.arange(index_n) % 1000, classes_per_batch=8,
                                                                samples_per_class=4, **rank0), None, index_n, 1e-2),
        ("TwoStreamBatchSampler", TwoStreamBatchSampler(range(index_n // 2, index_n), range(index_n // 2),
                                                        primary_batch_size=24, secondary_batch_size=8, **rank0),
         None, index_n, 1e-2),
        ("WeightedSampler (replacement)", WeightedSampler(np.arange(index_n) % 7 + 1.0, num_samples=index_n, **rank0),
         BATCH, index_n, 1e-2),
        ("WeightedSampler (distinct)", WeightedSampler(np.arange(index_n) % 7 + 1.0, num_samples=index_n,
                                                       replacement=False, **rank0), BATCH, index_n, 1e-2),
    ]  # fmt: skip


SCANNED = ("Packed", "ClassBalanced", "TwoStream", "Weighted")
"""Samplers whose ``when`` reads the whole epoch's plan (no inverse): O(n) a query, timed over ``--scan-queries``."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1e9, help="samples per epoch (Sharded, Mixture)")
    parser.add_argument("--index-size", type=float, default=1e7, help="samples of the index-based sampler")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--scan-queries", type=int, default=3, help="when queries of the samplers that scan their plan")
    parser.add_argument("--only", default="", help="run only the samplers whose name contains this")
    parser.add_argument("--quick", action="store_true",
                        help="--size 1e7 --index-size 1e5 --queries 30 --scan-queries 1 (a smoke test)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.size, args.index_size, args.queries, args.scan_queries = 1e7, 1e5, 30, 1
    n, index_n = int(args.size), int(args.index_size)
    rng = np.random.default_rng(0)
    print(f"shardwise {shardwise.__version__}: {args.queries} queries each, world size {WORLD}, batch {BATCH}")
    print("| sampler | n | query | median wall | p99 wall | median CPU | target | CPU / target | private growth |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, sampler, batch_size, size, target in cases(n, index_n):
        if args.only not in name:
            continue
        which(sampler, epoch=3, step=0, rank=0, batch_size=batch_size)  # warm: the index is built or mapped once
        before = smaps_rollup().get("Private_Dirty", 0)
        steps_per_rank = len(sampler) // (batch_size or 1)
        steps = rng.integers(0, steps_per_rank, size=args.queries).tolist()
        ask_step = functools.partial(which, sampler, epoch=3, rank=5, batch_size=batch_size)
        rows = [("which (one rank's step)", *timed(steps, lambda s, ask=ask_step: ask(step=s)))]
        scanned = name.startswith(SCANNED)
        samples = rng.integers(0, size, size=args.scan_queries if scanned else args.queries).tolist()
        ask_sample = functools.partial(when, sampler, epochs=3, batch_size=batch_size)
        label = "when (scan of the epoch)" if scanned else "when (a sample's steps)"
        rows.append((label, *timed(samples, ask_sample)))
        growth = (smaps_rollup().get("Private_Dirty", 0) - before) / 1e6
        for query, median, p99, cpu in rows:
            print(f"| {name} | {size:.0e} | {query} | {median * 1e3:.3f} ms | {p99 * 1e3:.3f} ms | "
                  f"{cpu * 1e3:.3f} ms | {target * 1e3:.0f} ms | {cpu / target:.2f}x | {growth:.1f} MB |")  # fmt: skip


if __name__ == "__main__":
    main()
