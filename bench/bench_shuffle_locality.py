"""The locality-aware shuffle against MosaicML Streaming's ``py1e`` at the same cache budget (issue 22, point 2).

A loader over shard files can only shuffle as well as the shards it keeps at once allow. This compares
global orders of one epoch over the same uneven shards:

- ``uniform``: a uniform permutation (every shard resident);
- ``windows``: ``LocalityPermutation`` (``LocalitySampler(mixing="windows")``, the default) with
  ``window = 2, 4, ...`` shards mixed, one window after the other;
- ``streams``: ``StreamPermutation`` (``LocalitySampler(mixing="streams")``) with ``window = 2, 4, ...``
  streams, each reading one shard at a time, interleaved (NOTE [ Staggered streams ]);
- ``py1e``: Streaming's default shuffle (``get_shuffle_py1e``, one canonical node), swept over
  ``shuffle_block_size``, computed by Streaming itself in its scratch venv (docs/benchmarks/sharded-sources.md shows how
  to make it; ``bench/_lib/scratch_venvs.py`` finds it; without it the py1e rows are left out with one printed line).

Shuffle figures (as ``bench_sharded_sources.py``): consecutive samples from one shard, mean |id step| /
n (uniform: 1/3), |Spearman(position, id)| (uniform: 0), each the mean over ``--epochs`` epochs.

The cache budget of an order is what a loader must hold to read it without fetching a shard twice:
a shard is resident from ``lookahead`` positions before its first read to its last read, and the
budget is the peak, over positions, of the resident shards' samples over ``n`` (bytes, for equal-size
samples) and their count. ``lookahead = 0`` is the least any cache can hold; the table uses one mean
shard of lookahead (a loader that prefetches; it costs a window's shards all at once at each window
boundary, and py1e's staggered spans about one shard). py1e's figures at each shardwise budget are
interpolated between the block sizes whose budgets bracket it.

The node cache, for real: one rank reads every sample of an epoch through ``ShardedSource`` and a
``ShardCache(budget_bytes=...)`` on moto's S3 server (``tests/s3_server.py``), with the plan's prefetch
on; the table gives the bytes fetched over the dataset's, per plan and budget (1.000: each shard once).

Scale: private memory (smaps_rollup Anonymous), time to the first index and indices/s of one rank
(64 ranks) of ``LocalitySampler(window=8)`` at 1e9 samples in 1e5 shards, each mixing in a fresh
process (``bench_partitions.py --scale-probe``).

Run: ``python -m bench.bench_shuffle_locality`` (pure numpy; ~1 min, most of it py1e at 1e6 samples);
``--quick``: one case of 6,000 samples in 37 shards, one epoch, no node-cache or scale section (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench._lib.common import ROOT, module_command, shuffle_quality, uneven_sizes
from bench._lib.scratch_venvs import SCRATCH, available

WINDOWS = (2, 4, 8, 16)
STREAMS = (2, 3, 4, 6, 8, 12, 16)
BLOCKS = (1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64)  # x the mean shard size

# Many orders in one process (``streaming_venv.py py1e`` writes one order a process, ~5 s each).
PY1E = """
import json, sys
import numpy as np
from streaming.base.shuffle.py1e import get_shuffle_py1e
sizes, out, blocks, epochs = np.load(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
np.savez(out, **{f"{b}-{e}": get_shuffle_py1e(sizes, 1, 0, e, b) for b in blocks for e in range(epochs)})
"""


def budget(ids: np.ndarray, sizes: np.ndarray, lookahead: int) -> tuple[float, int]:
    """Peak resident samples / n and peak resident shards of reading ``ids`` in order (see the module doc)."""
    n, shard_of = len(ids), np.repeat(np.arange(len(sizes)), sizes)
    shards = shard_of[ids]
    first, last = np.full(len(sizes), n), np.full(len(sizes), -1)
    np.minimum.at(first, shards, np.arange(n))
    np.maximum.at(last, shards, np.arange(n))
    read = sizes > 0
    begin = np.maximum(first[read] - lookahead, 0)
    samples, count = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)
    np.add.at(samples, begin, sizes[read])
    np.add.at(samples, last[read] + 1, -sizes[read])
    np.add.at(count, begin, 1)
    np.add.at(count, last[read] + 1, -1)
    return float(np.cumsum(samples).max()) / n, int(np.cumsum(count).max())


def row(orders: list[np.ndarray], sizes: np.ndarray, lookahead: int) -> dict[str, float]:
    """Mean shuffle figures and worst budgets over the epochs' ``orders``."""
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    found = [shuffle_quality(order, shard_of) for order in orders]
    out = {k: float(np.mean([abs(q[k]) for q in found])) for k in found[0]}
    live = [budget(order, sizes, 0) for order in orders]
    ahead = [budget(order, sizes, lookahead) for order in orders]
    out.update(live_bytes=max(b for b, _ in live), live_shards=max(s for _, s in live),
               bytes=max(b for b, _ in ahead), shards=max(s for _, s in ahead))
    return out


def py1e_orders(sizes: np.ndarray, blocks: list[int], epochs: int) -> dict[int, list[np.ndarray]] | None:
    """Streaming's py1e orders per block size, or None without the scratch venv."""
    if not available(["streaming"]):  # prints the one line that says why
        return None
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "sizes.npy", sizes)
        subprocess.run([SCRATCH["streaming"][0], "-c", PY1E, str(Path(tmp) / "sizes.npy"), str(Path(tmp) / "out.npz"),
                        json.dumps(blocks), str(epochs)], check=True, timeout=1800)
        with np.load(Path(tmp) / "out.npz") as found:
            return {b: [found[f"{b}-{e}"].astype(np.int64) for e in range(epochs)] for b in blocks}


def figures(q: dict[str, float]) -> str:
    return (f"{q['same_shard']:.3f} | {q['id_step']:.3f} | {q['spearman']:.3f} | "
            f"{q['live_shards']} / {q['live_bytes']:.3f} | {q['shards']} / {q['bytes']:.3f}")


def compare(n: int, shards: int, epochs: int) -> None:
    from shardwise._core.locality import LocalityPermutation
    from shardwise._core.seeds import derive_seed
    from shardwise._core.streams import StreamPermutation

    sizes = uneven_sizes(n, shards)
    lookahead = n // shards
    print(f"\n### {n:,} samples in {shards} uneven shards (sizes {sizes.min()}..{sizes.max()}), "
          f"{epochs} epochs, lookahead {lookahead} positions\n")
    print("| order | same-shard pairs | mean \\|id step\\| / n | \\|Spearman\\| | live shards / samples | "
          "with lookahead: shards / samples |")
    print("|---|---|---|---|---|---|")
    uniform = row([np.random.default_rng(e).permutation(n) for e in range(epochs)], sizes, lookahead)
    print(f"| uniform | {figures(uniform)} |")
    ours: dict[str, dict[str, float]] = {}
    for window in WINDOWS:
        plans = [LocalityPermutation(sizes, window=window, key=derive_seed(0, "bench", e)) for e in range(epochs)]
        ours[f"windows {window}"] = row([plan(np.arange(n)) for plan in plans], sizes, lookahead)
    for streams in STREAMS:
        plans = [StreamPermutation(sizes, streams=streams, key=derive_seed(0, "bench", e)) for e in range(epochs)]
        ours[f"streams {streams}"] = row([plan(np.arange(n)) for plan in plans], sizes, lookahead)
    for name, q in ours.items():
        print(f"| shardwise {name} | {figures(q)} |")
    blocks = sorted({int(lookahead * b) for b in BLOCKS})
    orders = py1e_orders(sizes, blocks, epochs)
    if orders is None:
        return
    theirs = {b: row(orders[b], sizes, lookahead) for b in blocks}
    for b in blocks:
        print(f"| py1e block {b} | {figures(theirs[b])} |")
    print("\nAt shardwise's budget (py1e's figures interpolated between the two block sizes whose budgets, with "
          "lookahead, bracket it):\n")
    print("| shardwise | budget (samples / n) | same-shard: shardwise / py1e | \\|id step\\|: shardwise / py1e | "
          "\\|Spearman\\|: shardwise / py1e |")
    print("|---|---|---|---|---|")
    budgets = np.array([theirs[b]["bytes"] for b in blocks])
    for name, q in ours.items():
        if not budgets.min() <= q["bytes"] <= budgets.max():
            print(f"| {name} | {q['bytes']:.3f} | outside py1e's range | | |")
            continue
        at = {k: at_budget(budgets, [theirs[b][k] for b in blocks], q["bytes"]) for k in ("same_shard", "id_step",
                                                                                       "spearman")}
        print(f"| {name} | {q['bytes']:.3f} | {q['same_shard']:.3f} / {at['same_shard']:.3f} | "
              f"{q['id_step']:.3f} / {at['id_step']:.3f} | {q['spearman']:.3f} / {at['spearman']:.3f} |")


def at_budget(budgets: np.ndarray, values: list[float], budget: float) -> float:
    """A figure at ``budget``, interpolated linearly over the rows sorted by budget (equal budgets averaged)."""
    xs = np.unique(budgets)
    ys = [float(np.mean([v for b, v in zip(budgets, values, strict=True) if b == x])) for x in xs]
    return float(np.interp(budget, xs, ys))


def real_cache(n: int, shards: int) -> None:
    """Bytes a node fetches in one epoch through ``ShardCache(budget_bytes=...)`` on moto's S3, per plan and budget."""

    from tests.s3_server import make_bucket, s3_endpoint, storage_options

    from bench.bench_partitions import write_shards
    from shardwise import LocalitySampler, ShardCache, ShardedSource

    plans = [("windows", w) for w in (2, 4, 8)] + [("streams", k) for k in (2, 4, 8)]
    budgets = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)
    with tempfile.TemporaryDirectory(prefix="bench-shuffle-") as tmp, s3_endpoint() as endpoint:
        root = Path(tmp)
        (root / "shards").mkdir()
        write_shards(root / "shards", n, shards, seed=0)
        fs = make_bucket(endpoint, "bench")
        fs.put(str(root / "shards") + "/", "bench/train/", recursive=True)
        urls = [f"s3://bench/train/train-{s:03d}.parquet" for s in range(shards)]
        options = storage_options(endpoint)
        total = int(ShardedSource(urls, cache=ShardCache(root / "probe", storage_options=options),
                                  index_dir=root / "index").file_sizes.sum())  # fmt: skip
        print(f"\n### The node cache on S3: bytes fetched in one epoch / dataset, {n:,} samples in {shards} shards "
              f"({total / 2**20:.1f} MiB), one rank reading every sample in plan order\n")
        print("| plan | " + " | ".join(f"budget {b:.0%}" for b in budgets) + " |")
        print("|---|" + "---|" * len(budgets))
        for run, (mixing, window) in enumerate(plans):
            cells = []
            for b, fraction in enumerate(budgets):
                budget = int(total * fraction)
                cache = ShardCache(root / f"cache-{run}-{b}", budget_bytes=budget, storage_options=options)
                source = ShardedSource(urls, cache=cache, index_dir=root / "index")
                sampler = LocalitySampler(source, window=window, mixing=mixing, num_replicas=1, rank=0, seed=0)
                for i in sampler:
                    source[i]
                cache.close()
                cells.append(f"{cache.fetched_bytes / total:.3f}")
            print(f"| {mixing} {window} | " + " | ".join(cells) + " |")


def scale() -> None:

    print("\n### Scale: one rank of 64, window 8, 1e9 samples in 1e5 shards, a fresh process each\n")
    print("| mixing | first index (s) | indices/s | private MiB |")
    print("|---|---|---|---|")
    for mixing in ("windows", "streams"):
        out = subprocess.run(module_command("bench.bench_partitions", "--scale-probe", "1", mixing), cwd=ROOT,
                             capture_output=True, text=True, check=True, timeout=600).stdout.split("SCALE ")[1].split()
        print(f"| {mixing} | {float(out[1]):.3f} | {float(out[2]):,.0f} | {int(out[3]) / 2**20:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="6000x37,200000x37,1000000x1000",
                        help="comma-separated SAMPLESxSHARDS (default: the loader bench's, the issue's, many shards)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--s3", default="6000x37", help="SAMPLESxSHARDS for the node-cache section ('' to skip)")
    parser.add_argument("--quick", action="store_true",
                        help="--cases 6000x37 --epochs 1 --s3 '', no scale section (a smoke test)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.cases, args.epochs, args.s3 = "6000x37", 1, ""
    for case in filter(None, args.cases.split(",")):
        n, shards = (int(x) for x in case.split("x"))
        compare(n, shards, args.epochs)
    if args.s3:
        real_cache(*(int(x) for x in args.s3.split("x")))
    if not args.quick:
        scale()


if __name__ == "__main__":
    main()
