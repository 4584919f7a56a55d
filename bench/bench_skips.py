"""The skip ledger at scale: 10^4 skipped ranges at W=8, resumed at W=6, over n = 1e9 (issue 23).

Prints the state's size (JSON and ``torch.save``) against the 1 MB target, and, side by side in one
process, the cost of a resume with the ledger against the same resume without it (the baseline):
``load_state_dict`` and the first batch of 32 on each of the 6 ranks, then a steady 64Ki units.
Correctness (0 lost, 0 repeated, 0 skipped trained at W=8 -> 6) is ``tests/samplers/test_skips.py`` at 1e6.

    python -m bench.bench_skips --size 1e9 --ranges 10000
    python -m bench.bench_skips --quick   # n = 1e7, 1,000 ranges, 1,000 id ranges, 100 mixture ids (a smoke test)

A second table skips sample ids (``skip_ids``): 10^4 id ranges on a ``ShardedSampler`` and a run of
ids on a ``MixtureSampler``; each epoch translates them to plan positions once (cached after).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from typing import Any

import numpy as np
import torch

from shardwise import MixtureSampler, ShardedSampler


def resume(n: int, state: dict[str, Any], rank: int) -> tuple[float, float, float]:
    """Seconds to load the state, to the first 32 units, and for the next 65,536 units, at W=6."""
    start = time.perf_counter()
    sampler = ShardedSampler(n, num_replicas=6, rank=rank, seed=5)
    sampler.load_state_dict(state)
    loaded = time.perf_counter()
    iterator = iter(sampler)
    for _ in range(32):
        next(iterator)
    first = time.perf_counter()
    for _ in range(1 << 16):
        next(iterator)
    return loaded - start, first - loaded, time.perf_counter() - first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1e9)
    parser.add_argument("--ranges", type=int, default=10_000)
    parser.add_argument("--id-ranges", type=int, default=10_000, help="skip_ids ranges (1-49 ids each)")
    parser.add_argument("--mixture-ids", type=int, default=1000, help="ids skipped in the MixtureSampler")
    parser.add_argument("--quick", action="store_true",
                        help="--size 1e7 --ranges 1000 --id-ranges 1000 --mixture-ids 100 (a smoke test)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.size, args.ranges, args.id_ranges, args.mixture_ids = 1e7, 1000, 1000, 100
    n = int(args.size)
    rng = np.random.default_rng(0)
    starts = np.sort(rng.choice(n // 1000, args.ranges, replace=False)) * 1000
    ranges = np.stack([starts, starts + rng.integers(1, 500, size=starts.size)], axis=1)
    editor = ShardedSampler(n, num_replicas=8, rank=0, seed=5)
    added = time.perf_counter()
    editor.skip_ranges(0, ranges)
    added = time.perf_counter() - added
    iterator = iter(editor)
    for _ in range(1000):  # W=8 trains a little, then checkpoints
        next(iterator)
    with_ledger = editor.state_dict()
    without = {key: value for key, value in with_ledger.items() if key != "skip"}
    saved = io.BytesIO()
    torch.save(with_ledger, saved)
    size_json, size_torch = len(json.dumps(with_ledger)), saved.getbuffer().nbytes
    print(f"n={n:.0e}, {args.ranges} ranges ({int((ranges[:, 1] - ranges[:, 0]).sum())} positions) added in "
          f"{added * 1e3:.1f} ms; ledger holds {len(with_ledger['skip'])} ranges")  # fmt: skip
    print(f"state: {size_json / 1e6:.3f} MB as JSON, {size_torch / 1e6:.3f} MB torch.save "
          f"(target < 1 MB: {max(size_json, size_torch) / 1e6:.2f}x of it)")  # fmt: skip
    print("| resume at W=6 | load_state_dict | first 32 units | next 65,536 units |")
    print("|---|---:|---:|---:|")
    rows = {}
    for label, state in (("without ledger (baseline)", without), ("with 10^4-range ledger", with_ledger)):
        runs = [resume(n, state, rank) for rank in range(6) for _ in range(2)]
        rows[label] = [statistics.median(r[i] for r in runs) for i in range(3)]
        load, first, steady = rows[label]
        print(f"| {label} | {load * 1e3:.2f} ms | {first * 1e3:.2f} ms | {steady * 1e3:.1f} ms |")
    base, ledger = rows["without ledger (baseline)"], rows["with 10^4-range ledger"]
    print("| ratio | " + " | ".join(f"{b and a / b:.2f}x" for a, b in zip(ledger, base, strict=True)) + " |")
    skip_ids_table(n, args.id_ranges, args.mixture_ids)


def translated(sampler: Any, epoch: int) -> float:
    """Seconds for ``epoch``'s id-to-position translation: the first ``len()`` of the epoch (cached after)."""
    sampler.set_epoch(epoch)
    start = time.perf_counter()
    len(sampler)
    return time.perf_counter() - start


def skip_ids_table(n: int, id_ranges: int, mixture_ids: int) -> None:
    """Skipped sample ids: state size, and the per-epoch translation (ids -> plan positions), once per epoch."""
    rng = np.random.default_rng(1)
    starts = np.sort(rng.choice(n // 1000, id_ranges, replace=False)) * 1000
    stops = starts + rng.integers(1, 50, size=starts.size)
    sharded = ShardedSampler(n, num_replicas=8, rank=0, seed=5)
    sharded.skip_id_ranges(np.stack([starts, stops], axis=1))
    third = n // 3
    mixture = MixtureSampler([third, third, n - 2 * third], [0.5, 0.3, 0.2], num_samples=n, seed=5,
                             num_replicas=8, rank=0)  # fmt: skip
    mixture.skip_ids(12_345, 12_345 + mixture_ids)
    print()
    print(f"| skip_ids at n={n:.0e} | ids | state (JSON) | epoch 0 translation | epoch 1 | again (cached) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, sampler, ids in (
        (f"ShardedSampler, {id_ranges} id ranges", sharded, int((stops - starts).sum())),
        ("MixtureSampler, 1 id range", mixture, mixture_ids),
    ):
        first, second = translated(sampler, 0), translated(sampler, 1)
        start = time.perf_counter()
        len(sampler)
        again = time.perf_counter() - start
        state_size = len(json.dumps(sampler.state_dict()))
        print(f"| {label} | {ids} | {state_size / 1e6:.3f} MB | {first * 1e3:.1f} ms | {second * 1e3:.1f} ms | "
              f"{again * 1e3:.3f} ms |")  # fmt: skip


if __name__ == "__main__":
    main()
