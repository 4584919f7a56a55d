"""The memory-mapped ragged store against the naive way: every rank loads every array into its RAM.

Run (alone on the machine: the figures are timings)::

    python -m bench.bench_ragged            # 4 GiB store
    python -m bench.bench_ragged --size-gib 1
    python -m bench.bench_ragged --quick    # a 0.05 GiB store (a smoke test)

A store of ``--size-gib`` of float32 rows (80 features, 50..1500 rows a sample) is written under
``--dir`` (default: the temporary folder; checked free space first) and deleted at the end. Three measurements:

1. memory: 4 spawned gloo ranks read one epoch through ``BucketBatchSampler`` + ``pad_collate``
   (an all_reduce every step, no DataLoader workers so that each rank's memory is its own).
   After the epoch, with every rank still alive and mapping, each reads its proportional set
   size from /proc/self/smaps_rollup (PSS shares every page among the processes mapping it, so
   the sum over ranks counts the page cache once). Baseline: the same ranks and epoch, each
   first loading every array into its own memory (values read with plain file reads into an
   anonymous buffer, one tensor per sample). The naive arm allocates ranks x store size: it runs
   at 4 ranks only when MemAvailable >= 20 GiB + the store, else with as many ranks as fit, and
   every rank aborts if MemAvailable drops below 2 GiB while it loads (the machine is shared).
2. throughput: one process, one epoch of bucketed batches (world size 1), ``pad_collate`` on
   views of the mapped store against the same batches from an in-RAM list of tensors (loaded
   beforehand; its load time is printed apart). The store is read cold (evicted from the page
   cache with ``posix_fadvise(DONTNEED)`` on its own files), then warm through a fresh mapping
   (its first epoch pays a page fault per page mapped), then a second epoch on that mapping.
   Wall and CPU time.
3. open: ``RaggedArray(path)`` time, median of 30 (warm) and once after evicting the files from
   the page cache (cold), for the big store and a store 64x smaller.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from bench._lib.common import smaps_rollup
from shardwise import BucketBatchSampler, RaggedArray, pad_collate
from shardwise.data.ragged import MANIFEST, OFFSETS, VALUES
from shardwise.tools.launch import run_distributed

GIB = 1 << 30
FEATURES = 80
MIN_ROWS, MAX_ROWS = 50, 1500
MAX_TOKENS = 16384  # padded rows per batch: ~5 MiB batches
RANKS = 4
NAIVE_FULL_AVAILABLE = 20 * GIB
GUARD = 2 * GIB
READ_CHUNK = 256 << 20


def mem_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def pss() -> dict[str, int]:
    """This process's Pss, Pss_Anon and Pss_File in bytes, from /proc/self/smaps_rollup."""
    rollup = smaps_rollup()
    return {key: rollup[key] for key in ("Pss", "Pss_Anon", "Pss_File") if key in rollup}


def write_store(path: Path, target_bytes: int, seed: int = 0) -> RaggedArray:
    """Samples are row slices of a 40 MiB random pool (views: writing is disk-bound, not RNG-bound)."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal((1 << 17, FEATURES)).astype(np.float32)
    row_bytes = FEATURES * 4

    def samples():
        written = 0
        while written < target_bytes:
            rows = int(rng.integers(MIN_ROWS, MAX_ROWS + 1))
            start = int(rng.integers(0, len(pool) - rows))
            written += rows * row_bytes
            yield pool[start : start + rows]

    return RaggedArray.write(path, samples())


def load_into_ram(path: Path, guard: int = GUARD) -> list[torch.Tensor]:
    """The naive way: every array in this process's memory (read in chunks, aborting if RAM runs low)."""
    store = RaggedArray(path)  # only for the layout; values are read with plain reads, not mapped
    values = np.empty(store.values.shape, store.dtype)
    flat = values.reshape(-1).view(np.uint8)
    header = store.manifest["files"][VALUES]["header_bytes"]
    with open(path / VALUES, "rb", buffering=0) as file:
        file.seek(header)
        for start in range(0, flat.size, READ_CHUNK):
            if mem_available() < guard:
                raise MemoryError(f"naive arm aborted: MemAvailable fell below {guard >> 30} GiB while loading")
            file.readinto(flat[start : start + READ_CHUNK].data)
    offsets = np.load(path / OFFSETS)
    return [torch.from_numpy(values[offsets[i] : offsets[i + 1]]) for i in range(len(offsets) - 1)]


def _rank_epoch(rank: int, world_size: int, path: str, naive: bool) -> dict[str, Any]:
    before = pss()
    ready = time.perf_counter()
    store = RaggedArray(path)
    dataset: Any = load_into_ram(Path(path)) if naive else store
    ready = time.perf_counter() - ready
    sampler = BucketBatchSampler(store.lengths, max_tokens=MAX_TOKENS, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate, num_workers=0)
    dist.barrier()
    start = time.perf_counter()
    steps = rows = 0
    for batch in loader:
        dist.all_reduce(torch.ones(1))
        steps += 1
        rows += int(batch.lengths.sum())
    elapsed = time.perf_counter() - start
    del batch
    gc.collect()
    dist.barrier()  # every rank has finished and still maps what it read
    after = pss()
    dist.barrier()  # nobody exits before everybody has measured
    return {"before": before, "after": after, "steps": steps, "rows": rows, "seconds": elapsed, "ready": ready}


def memory_arm(path: Path, ranks: int, naive: bool) -> dict[str, Any]:
    reports = run_distributed(_rank_epoch, ranks, str(path), naive, timeout=1800, collective_timeout=900)
    if len({r["steps"] for r in reports}) != 1:
        raise RuntimeError(f"ranks took different numbers of steps: {[r['steps'] for r in reports]}")
    return {
        "ranks": ranks,
        "pss": sum(r["after"]["Pss"] for r in reports),
        "pss_anon": sum(r["after"]["Pss_Anon"] for r in reports),
        "pss_file": sum(r["after"]["Pss_File"] for r in reports),
        "baseline": sum(r["before"]["Pss"] for r in reports),
        "rows": sum(r["rows"] for r in reports),
        "seconds": max(r["seconds"] for r in reports),
        "ready": max(r["ready"] for r in reports),
    }


def evict(path: Path) -> None:
    """Drop this store's files from the page cache (only its own pages; nobody else's)."""
    for name in (VALUES, OFFSETS, MANIFEST):
        fd = os.open(path / name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def epoch(dataset: Any, lengths: np.ndarray) -> tuple[float, float, int, int]:
    """(wall s, cpu s, samples, bytes of real rows) of one bucketed epoch at world size 1."""
    sampler = BucketBatchSampler(lengths, max_tokens=MAX_TOKENS, seed=0, num_replicas=1, rank=0)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate, num_workers=0)
    wall, cpu = time.perf_counter(), time.process_time()
    samples = rows = 0
    for batch in loader:
        samples += len(batch.lengths)
        rows += int(batch.lengths.sum())
    return time.perf_counter() - wall, time.process_time() - cpu, samples, rows * FEATURES * 4


def open_times(path: Path, repeat: int = 30) -> tuple[float, float]:
    """(median warm ms, cold ms) of RaggedArray(path)."""
    warm = []
    for _ in range(repeat):
        start = time.perf_counter()
        RaggedArray(path)
        warm.append((time.perf_counter() - start) * 1e3)
    evict(path)
    start = time.perf_counter()
    RaggedArray(path)
    cold = (time.perf_counter() - start) * 1e3
    return statistics.median(warm), cold


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=4.0)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the store is written (and deleted)")
    parser.add_argument("--skip-naive", action="store_true", help="skip the baseline that loads every array")
    parser.add_argument("--quick", action="store_true", help="--size-gib 0.05 (a smoke test)")
    args = parser.parse_args()
    args.size_gib = 0.05 if args.quick else args.size_gib
    target = int(args.size_gib * GIB)
    free = shutil.disk_usage(args.dir).free
    if free < 2 * target + 2 * GIB:
        sys.exit(f"{args.dir} has {gib(free)} free; this benchmark needs {gib(2 * target + 2 * GIB)}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-ragged-", dir=args.dir) as tmp:
        start = time.perf_counter()
        store = write_store(Path(tmp) / "big", target)
        write_s = time.perf_counter() - start
        small = write_store(Path(tmp) / "small", target // 64, seed=1)
        size, lengths, big_n = store.nbytes, store.lengths, len(store)
        print(f"store: {store!r}, {gib(size)} of values, written in {write_s:.1f} s", flush=True)
        print(f"free disk under {args.dir}: {gib(free)}; MemAvailable: {gib(mem_available())}", flush=True)
        del store  # the ranks' mappings alone
        gc.collect()

        # 1. memory of 4 ranks
        mapped = memory_arm(Path(tmp) / "big", RANKS, naive=False)
        print("mapped:", json.dumps(mapped), flush=True)
        naive: dict[str, Any] | None = None
        naive_note = ""
        if not args.skip_naive:
            available = mem_available()
            if available >= NAIVE_FULL_AVAILABLE:
                naive_ranks = RANKS
            else:
                naive_ranks = min(RANKS, int((available - GUARD - 2 * GIB) // size))
                naive_note = f" (MemAvailable {gib(available)}: naive run with {naive_ranks} ranks, not {RANKS})"
            if naive_ranks >= 1:
                naive = memory_arm(Path(tmp) / "big", naive_ranks, naive=True)
                print("naive:", json.dumps(naive), flush=True)
            else:
                naive_note = f" (MemAvailable {gib(available)}: naive arm not run)"

        # 2. throughput, one process: cold cache, then warm; first epoch of a mapping, then second
        throughput: dict[str, tuple[float, float, int, int] | None] = {}
        evict(Path(tmp) / "big")
        mapping = RaggedArray(Path(tmp) / "big")
        throughput["mapped, cold cache, 1st epoch"] = epoch(mapping, lengths)
        del mapping
        gc.collect()  # unmapped: the next mapping faults its pages in again, from the page cache
        mapping = RaggedArray(Path(tmp) / "big")
        throughput["mapped, warm cache, 1st epoch"] = epoch(mapping, lengths)
        throughput["mapped, warm cache, 2nd epoch"] = epoch(mapping, lengths)
        del mapping
        gc.collect()
        throughput["in-RAM list of tensors"] = None
        load_s = None
        if mem_available() >= size + 4 * GIB:
            load_s = time.perf_counter()
            tensors = load_into_ram(Path(tmp) / "big")
            load_s = time.perf_counter() - load_s
            throughput["in-RAM list of tensors"] = epoch(tensors, lengths)
            del tensors
            gc.collect()

        # 3. open time
        big_open = open_times(Path(tmp) / "big")
        small_open = open_times(small.path)

    print()
    print(f"Store: {gib(size)} of float32 values, {big_n} samples of {MIN_ROWS}..{MAX_ROWS} rows x {FEATURES}.")
    print()
    print(f"(1) Memory of {RANKS} ranks after one epoch (sum of PSS over ranks){naive_note}")
    print()
    print("| arm | ranks | sum PSS | of which anon | of which file | minus PSS before opening | / store size "
          "| ready (open or load) s | epoch s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    arms = [("mapped RaggedArray", mapped)] + ([("naive: each rank loads all", naive)] if naive else [])
    for name, arm in arms:
        grown = arm["pss"] - arm["baseline"]
        print(
            f"| {name} | {arm['ranks']} | {gib(arm['pss'])} | {gib(arm['pss_anon'])} | {gib(arm['pss_file'])} "
            f"| {gib(grown)} | {grown / size:.2f}x | {arm['ready']:.2f} | {arm['seconds']:.2f} |"
        )
    if naive:
        per_rank = (naive["pss"] - naive["baseline"]) / naive["ranks"]
        print(f"\nnaive per rank: {gib(per_rank)}; mapped / naive (growth, {RANKS} ranks, naive scaled to {RANKS}): "
              f"{(mapped['pss'] - mapped['baseline']) / (per_rank * RANKS):.2f}x")  # fmt: skip
    print()
    print("(2) One bucketed epoch, 1 process, pad_collate (samples/s and MB/s of real rows, from wall time)")
    print()
    print("| source | wall s | samples/s | MB/s | CPU s | wall vs in-RAM list |")
    print("|---|---|---|---|---|---|")
    base = throughput["in-RAM list of tensors"]
    for name, result in throughput.items():
        if result is None:
            print(f"| {name} | not run (not enough free memory) | | | | |")
            continue
        wall, cpu, samples, nbytes = result
        ratio = f"{wall / base[0]:.2f}x" if base else "-"
        print(f"| {name} | {wall:.2f} | {samples / wall:,.0f} | {nbytes / wall / 1e6:,.0f} | {cpu:.2f} | {ratio} |")
    if load_s is not None:
        print(f"\nLoading the in-RAM list first took {load_s:.2f} s (not included above); opening the store: ms (3).")
    print()
    print("(3) Time to open (RaggedArray(path)), ms")
    print()
    print("| store | samples | values | warm (median of 30) | cold (files evicted) |")
    print("|---|---|---|---|---|")
    print(f"| big | {big_n} | {gib(size)} | {big_open[0]:.2f} | {big_open[1]:.2f} |")
    print(f"| small | {len(small)} | {gib(small.nbytes)} | {small_open[0]:.2f} | {small_open[1]:.2f} |")


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn", force=True)
    main()
