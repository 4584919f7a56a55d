"""ClassBalanced, TwoStream and Weighted at scale: first batch and private memory per rank, before vs after.

Run (serialised with the other benchmarks; the inputs are written once under ``--data``)::

    flock /tmp/shardwise-bench.lock python bench/bench_samplers_scale.py --sizes 1e7 1e8

Setting: inputs are memory-mapped ``.npy`` files (``np.load(mmap_mode="r")``), rank 3 of a world
of 8, one fresh process per measurement:

- ClassBalanced: int32 labels of 100,000 classes (uniform), ``classes_per_batch=32``,
  ``samples_per_class=8``.
- TwoStream: a 10% / 90% split of ``[0, n)`` chosen by a hash, so the two sorted int64 lists
  interleave over the whole value range (the overlap check cannot skip anything);
  ``primary_batch_size=32``, ``secondary_batch_size=96``.
- Weighted: float32 exponential weights, ``num_samples=n`` with replacement; and without
  replacement, ``num_samples=n // 100`` (the per-epoch successive-sampling plan, O(n) by design).

Columns: **first batch** is construction + ``next(iter(sampler))`` in a fresh process; **cold**
runs with an empty index cache (the first rank of the node builds the shared index), **warm** with
the cache the cold run left (every other rank, and every later run). **private growth** is the
peak of ``RssAnon`` (``/proc/self/status``, sampled every 2 ms) during construction and iteration,
minus its value after imports and opening the inputs: memory-mapped inputs and cache files are
file-backed and shared, so they are not counted. **batches/s** iterates ``--batches`` more batches.
**index** is the size of the shared cache entry (one per node). **before** runs the same child
with ``--before`` (a ``src`` directory of the code before this change, default ``/work/main/src``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

WORLD_SIZE, RANK = 8, 3
CLASSES = 100_000
SAMPLERS = ("ClassBalanced", "TwoStream", "Weighted", "Weighted-distinct")


# -- inputs --------------------------------------------------------------------------------------
def make_inputs(data: Path, n: int) -> dict[str, Path]:
    """Write the memory-mapped inputs for size ``n`` (once; reused by later runs)."""
    data.mkdir(parents=True, exist_ok=True)
    paths = {name: data / f"{name}-{n}.npy" for name in ("labels", "weights", "primary", "secondary")}
    if all(path.exists() for path in paths.values()):
        return paths
    rng = np.random.default_rng(0)
    block = 1 << 23
    labels = np.lib.format.open_memmap(paths["labels"], mode="w+", dtype=np.int32, shape=(n,))
    weights = np.lib.format.open_memmap(paths["weights"], mode="w+", dtype=np.float32, shape=(n,))
    primary_count = 0
    for start in range(0, n, block):
        stop = min(start + block, n)
        labels[start:stop] = rng.integers(0, CLASSES, stop - start)
        weights[start:stop] = rng.exponential(size=stop - start)
        mask = _primary_mask(start, stop)
        primary_count += int(mask.sum())
    primary = np.lib.format.open_memmap(paths["primary"], mode="w+", dtype=np.int64, shape=(primary_count,))
    secondary = np.lib.format.open_memmap(paths["secondary"], mode="w+", dtype=np.int64, shape=(n - primary_count,))
    at_p = at_s = 0
    for start in range(0, n, block):
        stop = min(start + block, n)
        values = np.arange(start, stop, dtype=np.int64)
        mask = _primary_mask(start, stop)
        primary[at_p : at_p + int(mask.sum())] = values[mask]
        secondary[at_s : at_s + int((~mask).sum())] = values[~mask]
        at_p, at_s = at_p + int(mask.sum()), at_s + int((~mask).sum())
    for array in (labels, weights, primary, secondary):
        array.flush()
    return paths


def _primary_mask(start: int, stop: int) -> np.ndarray:
    """About 10% of the indices, spread over the whole range by a multiplicative hash."""
    x = np.arange(start, stop, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return (x >> np.uint64(40)) % np.uint64(10) == 0


# -- one measurement (child process) ----------------------------------------------------------------
def rss_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def child(args: argparse.Namespace) -> None:
    import shardwise

    inputs = {name: np.load(path, mmap_mode="r") for name, path in json.loads(args.inputs).items()}
    n = len(inputs["labels"])
    world = {"num_replicas": WORLD_SIZE, "rank": RANK, "seed": 0}
    cache = {} if args.before_mode else {"cache_dir": args.cache}
    base = rss_anon_kib()
    peak = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_anon_kib())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    sampler: Any
    if args.sampler == "ClassBalanced":
        sampler = shardwise.ClassBalancedBatchSampler(
            inputs["labels"], classes_per_batch=32, samples_per_class=8, **world, **cache
        )
    elif args.sampler == "TwoStream":
        sampler = shardwise.TwoStreamBatchSampler(
            inputs["primary"], inputs["secondary"], primary_batch_size=32, secondary_batch_size=96, **world, **cache
        )
    elif args.sampler == "Weighted":
        sampler = shardwise.WeightedSampler(inputs["weights"], num_samples=n, **world, **cache)
    else:
        sampler = shardwise.WeightedSampler(
            inputs["weights"], num_samples=n // 100, replacement=False, **world, **cache
        )
    iterator = iter(sampler)
    next(iterator)
    first = time.perf_counter() - start
    unit = 256 if args.sampler.startswith("Weighted") else 1  # index samplers: 256 indices count as a batch
    count = 0
    began = time.perf_counter()
    for _ in iterator:
        count += 1
        if count >= args.batches * unit:
            break
    rate = count / unit / (time.perf_counter() - began)
    done.set()
    watcher.join()
    peak[0] = max(peak[0], rss_anon_kib())
    print(json.dumps({"first_s": first, "growth_mib": (peak[0] - base) / 1024, "batches_per_s": rate}))


# -- driver ------------------------------------------------------------------------------------------
def run_child(sampler: str, inputs: dict[str, Path], cache: Path, batches: int, src: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src if src else here
    command = [sys.executable, __file__, "--child", sampler, "--cache", str(cache), "--batches", str(batches)]
    command += ["--inputs", json.dumps({k: str(v) for k, v in inputs.items()})]
    if src:
        command.append("--before-mode")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def entry_size(cache: Path) -> int:
    return sum(path.stat().st_size for path in cache.rglob("*.npy"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e7, 1e8])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardwise-bench-samplers")
    parser.add_argument("--batches", type=int, default=500, help="batches iterated after the first, for batches/s")
    parser.add_argument("--before", default="/work/main/src", help="src dir of the code before ('' to skip)")
    parser.add_argument("--before-max", type=float, default=1e7, help="largest n at which 'before' runs")
    parser.add_argument("--child", choices=SAMPLERS, dest="sampler")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--inputs")
    parser.add_argument("--before-mode", action="store_true")
    args = parser.parse_args()
    if args.sampler:
        child(args)
        return
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"# rank {RANK} of {WORLD_SIZE}, inputs memory-mapped .npy; {os.cpu_count()} CPUs, load at start: {load}")
    print()
    print("| sampler | n | code | cache | first batch (s) | private growth (MiB) | batches/s | shared index (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        n = int(size)
        inputs = make_inputs(args.data, n)
        for sampler in args.samplers:
            cache = Path(tempfile.mkdtemp(prefix="shardwise-bench-cache-", dir=args.data))
            try:
                runs = [("after", "cold", None), ("after", "warm", None)]
                if args.before and n <= args.before_max:
                    runs.insert(0, ("before", "-", args.before))
                for code, phase, src in runs:
                    result = run_child(sampler, inputs, cache, args.batches, src)
                    if "error" in result:
                        print(f"| {sampler} | {n:.0e} | {code} | {phase} | error: {result['error']} | | | |")
                        continue
                    index = entry_size(cache) / 2**20 if code == "after" else 0
                    print(
                        f"| {sampler} | {n:.0e} | {code} | {phase} | {result['first_s']:.3f} | "
                        f"{result['growth_mib']:.1f} | {result['batches_per_s']:.0f} | {index:.0f} |",
                        flush=True,
                    )
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    print(f"# load at end: {', '.join(f'{value:.1f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
