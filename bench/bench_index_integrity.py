"""Cost of the shared index's integrity checks: full checksums at 1e8 and 1e9, first-batch latency before/after.

Usage (a few minutes; writes up to 4 GB under --dir, removed at the end)::

    mkdir -p ../shardwise-baseline && git archive 7219ef3 src | tar -x -C ../shardwise-baseline   # before the checks
    python -m bench.bench_index_integrity --sizes 1e8 1e9 --first-batch 1e8 \
        --baseline-src ../shardwise-baseline/src
    python -m bench.bench_index_integrity --quick   # n = 1e6, one repeat, emulated baseline (a smoke test)

Table 1, per n: an ``order.npy`` of n uint32 indices (the length index of n samples) in the page
cache: the open-time sampled CRC-32 (what opening cost before and still costs), the full CRC-32
(what a node's one background verification reads), and the build-time pass (full CRC-32 plus the
range of the values, once per build), as seconds and as a ratio to the index build itself when
``n`` is also in ``--first-batch`` (measured there).

Table 2, ``BucketBatchSampler`` over n memory-mapped lengths with its index already built, each
arm in a fresh process, interleaved, median of ``--repeats``: opening the sampler, its first
batch and its first 100 batches, for

- ``before``: the previous release (sampled CRC-32 at open, no value check, no full
  verification): with ``--baseline-src DIR`` its real code (``git archive <commit> src | tar -x -C DIR``,
  its own format-1 entry), else emulated by switching the new checks off in that process;
- ``verified``: this node verified the entry before (the builder's marker): value checks only;
- ``first-open``: the first open on this node (no marker), the default: the open waits for the
  full check (``SHARDWISE_INDEX_VERIFY=before-use``);
- ``first-open-background``: the same with ``SHARDWISE_INDEX_VERIFY=background``: the full check
  runs in a background thread while the first batches are range-checked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._lib.common import ROOT, module_command
from shardwise._core.files import sampled_crc

ARMS = ("before", "verified", "first-open", "first-open-background")


def write_order(path: Path, n: int) -> None:
    """n uint32 values (chunks of a shuffled range: the layout of a length index) written 2**24 at a time."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint32, shape=(n,))
    rng = np.random.default_rng(0)
    step = 1 << 24
    for first in range(0, n, step):
        out[first : first + step] = rng.permutation(np.arange(first, min(n, first + step), dtype=np.uint32))
    out.flush()
    del out


def checksum_row(path: Path) -> dict[str, float]:
    from shardwise.index.checksums import describe_file, full_crc
    from shardwise.index.manifest import npy_layout

    dtype, _, header = npy_layout(path)
    size = path.stat().st_size
    full_crc(path)  # warm the page cache: a node verifies what its ranks just mapped
    timings: dict[str, float] = {}
    for name, work in (
        ("sampled", lambda: sampled_crc(path, header, size)),
        ("full", lambda: full_crc(path)),
        ("describe", lambda: describe_file(path, header, dtype)),
    ):
        best = float("inf")
        for _ in range(3 if size < 2**31 else 1):
            start = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - start)
        timings[name] = best
    timings["bytes"] = size
    return timings


def one(arm: str, lengths_path: str, cache: str) -> None:
    """One arm in this fresh process: print its timings as JSON."""
    from shardwise import BucketBatchSampler

    if not os.environ.get("BENCH_BASELINE"):  # the baseline release has neither module
        from shardwise.index import grouped, integrity
    if arm == "before" and not os.environ.get("BENCH_BASELINE"):  # emulated: the new checks switched off

        grouped.read_checked = lambda source, values: values  # type: ignore[attr-defined]
        integrity.EntryCheck.ensure_verifying = lambda self: None  # type: ignore[method-assign]
    lengths = np.load(lengths_path, mmap_mode="r")
    start = time.perf_counter()
    sampler = BucketBatchSampler(lengths, batch_size=64, cache_dir=cache, num_replicas=8, rank=3)
    opened = time.perf_counter()
    batches = iter(sampler)
    next(batches)
    first = time.perf_counter()
    for _ in range(99):
        next(batches)
    hundred = time.perf_counter()
    verified = float("nan")
    if arm.startswith("first-open"):
        for check in list(integrity._checks.values()):
            check.wait()
        verified = time.perf_counter() - start
        assert all(check.status == integrity.VERIFIED for check in integrity._checks.values())
    print(json.dumps({"open": opened - start, "first": first - start, "hundred": hundred - start,
                      "verified": verified}))  # fmt: skip


def run_arm(arm: str, lengths_path: Path, cache: Path, baseline: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if arm == "before" and baseline:
        env.update(PYTHONPATH=baseline, BENCH_BASELINE="1")
    env["SHARDWISE_INDEX_VERIFY"] = "background" if arm in ("before", "first-open-background") else "before-use"
    out = subprocess.run(module_command("bench.bench_index_integrity", "--one", arm, str(lengths_path), str(cache)),
                         cwd=ROOT, check=True, capture_output=True, text=True, env=env)  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def first_batch_table(
    n: int, work: Path, repeats: int, baseline: str | None
) -> tuple[dict[str, dict[str, float]], float]:
    lengths_path = work / f"lengths_{n}.npy"
    lengths = np.lib.format.open_memmap(lengths_path, mode="w+", dtype=np.int32, shape=(n,))
    rng = np.random.default_rng(1)
    for first in range(0, n, 1 << 24):
        lengths[first : first + (1 << 24)] = rng.integers(1, 512, min(n - first, 1 << 24))
    lengths.flush()
    del lengths
    cache = work / "cache"
    start = time.perf_counter()  # the build, in this process (the same as a rank's first start)
    from shardwise import BucketBatchSampler

    BucketBatchSampler(np.load(lengths_path, mmap_mode="r"), batch_size=64, cache_dir=cache, num_replicas=8, rank=3)
    build = time.perf_counter() - start
    if baseline:
        run_arm("before", lengths_path, cache, baseline)  # builds the baseline's own entry, untimed
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for _ in range(repeats):
        for arm in ARMS:
            if arm.startswith("first-open"):
                for marker in cache.glob("*/verified.*.json"):
                    marker.unlink()
            runs[arm].append(run_arm(arm, lengths_path, cache, baseline))
    medians = {arm: {key: float(np.median([r[key] for r in rows])) for key in rows[0]} for arm, rows in runs.items()}
    return medians, build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e8, 1e9])
    parser.add_argument("--first-batch", nargs="*", type=float, default=[1e8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "shardwise-bench-integrity"),
                        help="scratch folder, deleted at the end (default: in the temporary folder)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="--sizes 1e6 --first-batch 1e6 --repeats 1 (a smoke test)")  # fmt: skip
    parser.add_argument("--baseline-src", default=None, help="the previous release's src/ (see the docstring)")
    parser.add_argument("--one", nargs=3, metavar=("ARM", "LENGTHS", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.first_batch, args.repeats = [1e6], [1e6], 1
    if args.one:
        one(*args.one)
        return
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        builds: dict[int, float] = {}
        tables = []
        for n in (int(x) for x in args.first_batch):
            medians, builds[n] = first_batch_table(n, work, args.repeats, args.baseline_src)
            tables.append((n, medians))
        print("\nTable 1: integrity checks of one order.npy (n uint32), warm page cache")
        print("| n | file | sampled CRC (open) | full CRC-32 (node verification) | build pass (CRC + range) "
              "| full CRC / index build |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for n in (int(x) for x in args.sizes):
            path = work / f"order_{n}.npy"
            write_order(path, n)
            row = checksum_row(path)
            path.unlink()
            gbps = row["bytes"] / row["full"] / 1e9
            ratio = f"{row['full'] / builds[n]:.3f} (build {builds[n]:.1f} s)" if n in builds else "n/a"
            print(f"| {n:.0e} | {row['bytes'] / 2**30:.2f} GiB | {row['sampled'] * 1e3:.2f} ms | "
                  f"{row['full']:.2f} s ({gbps:.2f} GB/s) | {row['describe']:.2f} s | {ratio} |")  # fmt: skip
        for n, medians in tables:
            print(f"\nTable 2: BucketBatchSampler, n={n:.0e} memory-mapped lengths, index built; "
                  f"median of {args.repeats} fresh processes per arm (ratio to before)")  # fmt: skip
            print("| arm | open | first batch | first 100 batches | full check done |")
            print("|---|---|---|---|---|")
            base = medians["before"]
            for arm in ARMS:
                m = medians[arm]
                cells = [f"{m[k] * 1e3:.1f} ms ({m[k] / base[k]:.2f}x)" for k in ("open", "first", "hundred")]
                done = "n/a" if np.isnan(m["verified"]) else f"{m['verified']:.2f} s"
                print(f"| {arm} | {' | '.join(cells)} | {done} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("SHARDWISE_PROGRESS", "off")
    main()
