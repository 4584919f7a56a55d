"""WeightedSampler draws/s against torch.multinomial and numpy's Generator.choice(p=...), side by side.

Run (alone on the machine: the figures are timings)::

    python -m bench.bench_weighted

Setting: ``n`` weights (float32, exponential), a global plan of ``num_samples = n`` draws per
epoch, rank 3 of a world of 8: each method produces one rank's share, ``n / 8`` draws, in this
one process. Every arm starts from the same float32 weights.

- shardwise: ``WeightedSampler(weights, num_samples=n, num_replicas=8, rank=3)``; "build" is the
  constructor with an empty index cache (validation, quantisation, cumulative sum, guide table,
  written to the cache; later processes only map it), "draw" is iterating the sampler to the
  end (Python ints, as a DataLoader consumes them).
- torch: ``torch.multinomial(weights, n / 8, replacement=True)``; "build" is ``torch.from_numpy``.
  It refuses more than ``2**24`` categories: at ``n = 1e8`` the arm reports its error.
- numpy: ``Generator.choice(n, size=n / 8, p=p)``; "build" is ``p = weights / weights.sum()`` in
  float64 (``choice`` wants probabilities summing to 1); ``choice`` then rebuilds its cdf per call.

The baselines draw one process's samples; they give no global plan (ranks would have to draw the
whole plan with a shared seed and keep their positions, 8x the draws shown, or draw independently
with no way to resume or to reshard). ``--quick`` runs only ``n = 2**20``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import torch

from shardwise import WeightedSampler

WORLD_SIZE = 8
RANK = 3


def arm_shardwise(weights: np.ndarray, n: int) -> dict[str, Any]:
    cache = tempfile.mkdtemp(prefix="shardwise-bench-weighted-")  # an empty cache: "build" is the cold build
    start = time.perf_counter()
    sampler = WeightedSampler(weights, num_samples=n, num_replicas=WORLD_SIZE, rank=RANK, seed=0, cache_dir=cache)
    built = time.perf_counter()
    count = 0
    for _ in sampler:
        count += 1
    done = time.perf_counter()
    del sampler
    shutil.rmtree(cache, ignore_errors=True)
    return {"build_s": built - start, "draw_s": done - built, "draws": count}


def arm_torch(weights: np.ndarray, n: int) -> dict[str, Any]:
    draws = n // WORLD_SIZE
    start = time.perf_counter()
    tensor = torch.from_numpy(weights)
    built = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    try:
        out = torch.multinomial(tensor, draws, replacement=True, generator=generator)
    except RuntimeError as error:
        return {"error": str(error).split("\n")[0]}
    done = time.perf_counter()
    return {"build_s": built - start, "draw_s": done - built, "draws": len(out)}


def arm_numpy(weights: np.ndarray, n: int) -> dict[str, Any]:
    draws = n // WORLD_SIZE
    start = time.perf_counter()
    p = weights.astype(np.float64)
    p /= p.sum()
    built = time.perf_counter()
    out = np.random.default_rng(0).choice(n, size=draws, p=p)
    done = time.perf_counter()
    return {"build_s": built - start, "draw_s": done - built, "draws": len(out)}


ARMS = {"shardwise WeightedSampler": arm_shardwise, "torch.multinomial": arm_torch, "numpy Generator.choice": arm_numpy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="only n = 2**20 (a smoke test)")
    args = parser.parse_args()
    sizes = [2**20] if args.quick else [2**24, 10**8]
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"# WeightedSampler benchmark: rank {RANK} of {WORLD_SIZE}, num_samples = n, torch {torch.__version__}")
    print(f"# {os.cpu_count()} CPUs, load average at start: {load}")
    print()
    print("| n weights | method | build (s) | draw (s) | draws | draws/s | shardwise draws/s ÷ this |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        weights = np.random.default_rng(1).exponential(size=n).astype(np.float32)
        results = {}
        for name, arm in ARMS.items():
            gc.collect()
            results[name] = arm(weights, n)
        ours = results["shardwise WeightedSampler"]
        ours_rate = ours["draws"] / ours["draw_s"]
        for name, result in results.items():
            if "error" in result:
                print(f"| {n:,} | {name} | - | - | - | cannot run: {result['error']} | - |")
                continue
            rate = result["draws"] / result["draw_s"]
            ratio = "1.00 (baseline: itself)" if name == "shardwise WeightedSampler" else f"{ours_rate / rate:.2f}"
            print(
                f"| {n:,} | {name} | {result['build_s']:.2f} | {result['draw_s']:.2f} | {result['draws']:,} "
                f"| {rate / 1e6:.2f} M | {ratio} |"
            )
        del weights, results
    print(f"# load average at end: {', '.join(f'{value:.1f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
