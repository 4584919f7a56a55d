"""How alike the W ranks' shares of one step are with packed batches, per micro-batch and per optimizer step.

Run::

    python -m bench.bench_packing_balance [--world-size 8] [--accumulation 4]   # seconds
    python -m bench.bench_packing_balance --quick   # W=2, accumulation 2 (a smoke test)

``PackedBatchSampler(max_len=512, rows_per_batch=4)`` over the WikiText-2 paragraph lengths
(``bench/data/wikitext-2``, or ``--data DIR``), every
rank's epoch at world size W. For each global step (one micro-batch a rank) and each optimizer step
(``accumulation`` consecutive micro-batches a rank, what DDP waits for before it all-reduces), the
slowest rank's cost over the mean, for real tokens and for attention (sum of squared document
lengths), with each ``balance``. Printed: median, 99th percentile and worst over the epoch.
"""

from __future__ import annotations

import argparse

import numpy as np

import shardwise
from bench._lib.common import add_data_argument, wikitext_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="--world-size 2 --accumulation 2 (a smoke test)")
    add_data_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.world_size, args.accumulation = 2, 2
    lengths, w, k = wikitext_lengths(args.data), args.world_size, args.accumulation
    print(f"WikiText-2 ({lengths.size} paragraphs), max_len=512, rows_per_batch=4, W={w}, accumulation {k}")
    print("| balance | cost | micro-batch step: median / p99 / worst | optimizer step: median / p99 / worst |")
    print("|---|---|---|---|")
    for balance in ("tokens", "attention"):
        ranks = [list(shardwise.PackedBatchSampler(lengths, max_len=512, rows_per_batch=4, balance=balance,
                                                   num_replicas=w, rank=r, seed=0)) for r in range(w)]  # fmt: skip
        for name, power in (("tokens", 1), ("attention", 2)):
            cost = np.array([[sum((key.stop - key.start) ** power for key in batch) for batch in rank]
                             for rank in ranks], dtype=np.float64)  # (W, steps)  # fmt: skip
            steps = cost.shape[1] // k * k
            optimizer = cost[:, :steps].reshape(w, -1, k).sum(-1)  # (W, optimizer steps)
            cells = [np.percentile(c.max(0) / c.mean(0), [50, 99, 100]) for c in (cost, optimizer)]
            print(f"| {balance} | {name} | " + " | ".join(" / ".join(f"{v:.3f}" for v in c) for c in cells) + " |")


if __name__ == "__main__":
    main()
