"""Every sampler at 1e6..1e8 (Bucket, Packed 1e9) samples, inputs memory-mapped: cold and warm start beside a floor.

Run (alone on the machine; the 1e8 rows need ~10 GB of disk under --dir, the 1e9 rows ~25 GB)::

    python -m bench.bench_scale --quick    # 3e5 samples, five samplers, no node totals: a smoke test
    python -m bench.bench_scale --sizes 1e6 1e7 1e8
    python -m bench.bench_scale --sizes 2e7 1e8 --samplers Bucket Packed ClassBalanced Weighted TwoStream --no-node
    python -m bench.bench_scale --sizes 1e9 --samplers Bucket Packed --no-node
    mkdir -p before-790903e && git archive 790903e src | tar -x -C before-790903e   # an older src
    python -m bench.bench_scale --sizes 2e7 --samplers Packed --no-node --before before-790903e/src \
        --before-max 2e7

Inputs are ``.npy`` files opened with ``np.load(mmap_mode="r")`` (generated once under ``--dir``):
lengths int32 (log-normal, 1..8192 tokens), labels int32 (100,000 classes), weights float32, the
labelled / unlabelled index lists of TwoStream (10% / 90%, int64). Every measurement runs in a
fresh process (``--one``) with ``PYTHONPATH`` on this checkout's ``src``, rank 3 of W=8, shardwise
index cache in ``SHARDWISE_CACHE_DIR``:

- cold: an empty index cache (the first rank or run builds the shared index);
- warm: the next process on the same cache (what the 7 other ranks and every later run see);
- first batch: seconds from the constructor to the first unit of the first epoch (the sampler's module
  imported before: its import time is shown beside the warm figure);
- private growth: the highest RssAnon (private anonymous memory, /proc/PID/status, sampled every
  5 ms by the parent process, so a busy child cannot skip a sample) minus RssAnon just before the
  constructor, over construction and iteration;
- rate: units (batches, or indices for index samplers) per second over the first ~2 s of iteration;
- shared files: bytes of the index cache after the run;
- node: 8 processes (ranks 0..7) at once on the warm cache, each builds and iterates ~2 s, then all
  read /proc/self/smaps_rollup while all are alive: the sum of PSS over the 8, of which anonymous.

Samplers: Bucket ``max_tokens=65536``; Packed ``max_len=4096, rows_per_batch=8`` (lengths over 4096 are
split: the piece index); ClassBalanced 32 classes x 8 samples; Weighted ``num_samples=n`` with replacement;
Weighted-distinct ``replacement=False, num_samples=n // 100``; TwoStream 32 + 96 a batch; Scheduled
a ``BatchSizeSchedule.by_samples({0: 64, n/2: 128})`` over Weighted.

Before/after: ``--before SRC`` runs every sampler's children a second time with ``PYTHONPATH`` on
another ``src`` directory (e.g. ``git archive <commit> src | tar -x -C DIR``, then ``--before
DIR/src``), cold and warm on a cache of its own, as a row labelled ``(before: <name of DIR>)`` above
the current code's row, for sizes up to ``--before-max`` (default 1e7: older O(n) samplers may
need many GB at 1e8). torch rows and node totals are not repeated.

Baseline, side by side: torch ``DistributedSampler(range(n)) + BatchSampler(batch_size=256)``.
The numpy floor of a cold start (``cold / floor``: each sampler's cold first batch over it): in a
fresh process, map the lengths and count them with one ``np.bincount`` pass (2**24 at a time),
the least any index of the inputs must do (one read, one counting pass); the same floor for
every sampler (their inputs are as large: n 4-byte values, TwoStream's two lists 8 bytes).
The build of the packing layouts uses ``SHARDWISE_BUILD_WORKERS`` extra processes (default:
CPUs - 1); set it to 0 for a one-core figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._lib.common import ROOT, module_command, smaps_rollup, status_bytes

SAMPLERS = ["torch", "Sharded", "Bucket", "Packed", "ClassBalanced", "Weighted", "Weighted-distinct", "TwoStream",
            "Scheduled", "Mixture", "Locality"]  # fmt: skip
SRC = Path(__file__).resolve().parents[1] / "src"  # the code measured, unless --before names another src
WORLD, RANK = 8, 3
CLASSES = 100_000
SHARDS = 100_000
RATE_SECONDS = 2.0
GEN_CHUNK = 1 << 22


# -- inputs ------------------------------------------------------------------------------------------
def _generate(path: Path, n: int, dtype: Any, fill: Any) -> None:
    if path.exists():
        return
    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n,))
    rng = np.random.default_rng(n)
    for first in range(0, n, GEN_CHUNK):
        stop = min(first + GEN_CHUNK, n)
        out[first:stop] = fill(rng, first, stop)
    out.flush()
    del out
    os.rename(tmp, path)


def _not_tenth(i: np.ndarray) -> np.ndarray:
    """The i-th index that is not a multiple of 10 (the unlabelled ones)."""
    return i + i // 9 + 1


def make_inputs(directory: Path, n: int, names: set[str], *, floor: bool = True) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if names & {"Bucket", "Packed"} or floor:
        _generate(directory / f"lengths-{n}.npy", n, np.int32,
                  lambda rng, a, b: np.clip(rng.lognormal(5.5, 1.0, b - a), 1, 8192).astype(np.int32))  # fmt: skip
    if names & {"ClassBalanced"}:
        _generate(directory / f"labels-{n}.npy", n, np.int32, lambda rng, a, b: rng.integers(0, CLASSES, b - a))
    if names & {"Weighted", "Weighted-distinct", "Scheduled"}:
        _generate(directory / f"weights-{n}.npy", n, np.float32,
                  lambda rng, a, b: rng.exponential(1.0, b - a).astype(np.float32))  # fmt: skip
    if names & {"TwoStream"}:
        labelled = n // 10
        _generate(directory / f"labelled-{n}.npy", labelled, np.int64,
                  lambda rng, a, b: np.arange(a, b, dtype=np.int64) * 10)  # fmt: skip
        _generate(directory / f"unlabelled-{n}.npy", n - labelled, np.int64,
                  lambda rng, a, b: _not_tenth(np.arange(a, b, dtype=np.int64)))  # fmt: skip


# -- one measurement, in a fresh process --------------------------------------------------------------
def build_sampler(name: str, n: int, directory: Path, rank: int) -> Any:  # noqa: PLR0911  (one per sampler)
    import shardwise

    mapped = lambda stem: np.load(directory / f"{stem}-{n}.npy", mmap_mode="r")  # noqa: E731
    common = {"num_replicas": WORLD, "rank": rank, "seed": 0}
    if name == "torch":
        from torch.utils.data import BatchSampler, DistributedSampler

        return BatchSampler(DistributedSampler(range(n), num_replicas=WORLD, rank=rank, seed=0), 256, False)
    if name == "Sharded":
        return shardwise.ShardedSampler(range(n), **common)
    if name == "Bucket":
        return shardwise.BucketBatchSampler(mapped("lengths"), max_tokens=65536, **common)
    if name == "Packed":
        return shardwise.PackedBatchSampler(mapped("lengths"), max_len=4096, rows_per_batch=8, **common)
    if name == "ClassBalanced":
        return shardwise.ClassBalancedBatchSampler(mapped("labels"), classes_per_batch=32, samples_per_class=8,
                                                   **common)  # fmt: skip
    if name == "Weighted":
        return shardwise.WeightedSampler(mapped("weights"), num_samples=n, **common)
    if name == "Weighted-distinct":  # the successive-sampling plan of an epoch, without replacement
        return shardwise.WeightedSampler(mapped("weights"), num_samples=n // 100, replacement=False, **common)
    if name == "TwoStream":
        return shardwise.TwoStreamBatchSampler(mapped("labelled"), mapped("unlabelled"), primary_batch_size=32,
                                               secondary_batch_size=96, **common)  # fmt: skip
    if name == "Scheduled":
        inner = shardwise.WeightedSampler(mapped("weights"), num_samples=n, **common)
        schedule = shardwise.BatchSizeSchedule.by_samples({0: 64, n // 2: 128})
        return shardwise.ScheduledBatchSampler(inner, batch_size=schedule, num_replicas=WORLD, rank=rank)
    if name == "Mixture":  # four sources (the sizes of mapped datasets: the sampler reads nothing else)
        sizes = [n // 2, n // 4, n // 8, n - n // 2 - n // 4 - n // 8]
        return shardwise.MixtureSampler(sizes, [0.4, 0.3, 0.2, 0.1], num_samples=n, **common)
    if name == "Locality":  # 1e5 shards' metadata (samples per shard), sizes spread 1:100
        shards = min(SHARDS, n)
        sizes = np.random.default_rng(0).integers(1, 101, shards).astype(np.int64)
        sizes = sizes * ((n - shards) // int(sizes.sum())) + 1  # at least one sample each, n in all
        sizes[-1] += n - int(sizes.sum())
        return shardwise.LocalitySampler(sizes, **common)
    raise ValueError(f"unknown sampler {name!r}")


CLASSES_OF = {"Sharded": "ShardedSampler", "Bucket": "BucketBatchSampler", "Packed": "PackedBatchSampler",
              "ClassBalanced": "ClassBalancedBatchSampler", "Weighted": "WeightedSampler",
              "Weighted-distinct": "WeightedSampler", "TwoStream": "TwoStreamBatchSampler",
              "Scheduled": "ScheduledBatchSampler", "Mixture": "MixtureSampler",
              "Locality": "LocalitySampler"}  # fmt: skip
"""The class each sampler's row constructs (``shardwise`` imports its module on first access)."""


def one(name: str, n: int, directory: Path, rank: int, sync: Path | None) -> dict[str, Any]:
    """Construct, take the first unit, iterate ~2 s; the parent samples RssAnon meanwhile.

    The sampler's module is imported before the clock starts (as ``from shardwise import X`` at the
    top of a training script does); its import time is reported apart (``import_s``).
    """
    import torch  # noqa: F401  (imported before the baseline, as in a training script)

    import shardwise

    np.random.PCG64  # noqa: B018  (numpy.random loads lazily)
    began_import = time.perf_counter()
    for attribute in ["BatchSizeSchedule", CLASSES_OF[name]] if name in CLASSES_OF else []:
        getattr(shardwise, attribute)
    import_s = time.perf_counter() - began_import
    ready_anon = status_bytes("RssAnon", "self")
    ready = time.time()
    start = time.perf_counter()
    sampler = build_sampler(name, n, directory, rank)
    constructed = time.perf_counter() - start
    iterator = iter(sampler)
    first = next(iterator)
    first_batch = time.perf_counter() - start
    units, samples = 1, len(first) if isinstance(first, list) else 1
    began = time.perf_counter()
    for unit in iterator:
        units += 1
        samples += len(unit) if isinstance(unit, list) else 1
        if units % 256 == 0 and time.perf_counter() - began > RATE_SECONDS:
            break
    seconds = time.perf_counter() - began
    result = {"name": name, "n": n, "rank": rank, "ready": ready, "ready_anon": ready_anon,
              "construct_s": constructed, "first_batch_s": first_batch, "import_s": import_s,
              "units_per_s": (units - 1) / seconds,
              "samples_per_s": samples / (seconds + 1e-9), "end_anon": status_bytes("RssAnon", "self"),
              "module": shardwise.__file__}  # fmt: skip
    if sync is not None:  # node measurement: read PSS while all 8 processes still map what they use
        (sync / f"iterated-{rank}").touch()
        _wait_for(sync, "iterated-", WORLD)
        result["rollup"] = smaps_rollup()
        (sync / f"read-{rank}").touch()
        _wait_for(sync, "read-", WORLD)
    return result


def _wait_for(sync: Path, prefix: str, count: int, timeout: float = 900.0) -> None:
    deadline = time.time() + timeout
    while len(list(sync.glob(prefix + "*"))) < count:
        if time.time() > deadline:
            raise TimeoutError(f"waited {timeout} s for {count} {prefix} markers")
        time.sleep(0.02)


def _child(name: str, n: int, directory: Path, cache: Path, rank: int, src: Path, sync: Path | None = None) -> Any:
    """Start one ``--one`` process on the code in ``src``, with its own index cache."""
    path = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "SHARDWISE_CACHE_DIR": str(cache), "PYTHONPATH": path}
    command = module_command("bench.bench_scale", "--one", name, str(n), "--dir", str(directory), "--rank", str(rank))
    command += ["--sync", str(sync)] if sync is not None else []
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _result(name: str, n: int, child: Any, out: str, err: str, src: Path) -> dict[str, Any]:
    if child.returncode:
        raise RuntimeError(f"{name} n={n} ({src}) failed:\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if not Path(result["module"]).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"{name} n={n}: the child imported {result['module']}, not the code in {src}")
    return result


def run_one(name: str, n: int, directory: Path, cache: Path, rank: int = RANK, src: Path = SRC) -> dict[str, Any]:
    """A fresh process for one measurement; this process samples its RssAnon every 5 ms."""
    child = _child(name, n, directory, cache, rank, src)
    samples: list[tuple[float, int]] = []
    while child.poll() is None:
        with contextlib.suppress(OSError, ValueError):  # the child may exit between poll and read
            samples.append((time.time(), status_bytes("RssAnon", child.pid)))
        time.sleep(0.005)
    result = _result(name, n, child, *child.communicate(), src)
    after = [anon for t, anon in samples if t >= result["ready"]]
    result["peak_growth"] = max([*after, result["end_anon"]]) - result["ready_anon"]
    result["shared_bytes"] = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
    return result


def run_node(name: str, n: int, directory: Path, cache: Path) -> dict[str, Any]:
    """8 processes at once on a warm cache; the sum of their PSS while all are alive."""
    sync = Path(tempfile.mkdtemp(prefix="shardwise-node-"))
    children = [_child(name, n, directory, cache, r, SRC, sync) for r in range(WORLD)]
    results = [_result(f"node {name}", n, child, *child.communicate(timeout=1800), SRC) for child in children]
    shutil.rmtree(sync, ignore_errors=True)
    pss = sum(r["rollup"]["Pss"] for r in results)
    anon = sum(r["rollup"].get("Pss_Anon", 0) for r in results)
    return {"pss": pss, "pss_anon": anon, "pss_file": sum(r["rollup"].get("Pss_File", 0) for r in results),
            "first_batch_max": max(r["first_batch_s"] for r in results)}  # fmt: skip


FLOOR_CHUNK = 1 << 24


def counting_floor(n: int, directory: Path) -> float:
    """Seconds for the numpy floor of a cold start, in a fresh process: map the lengths, read them once, count them.

    One ``np.bincount`` over the mapped lengths, 2**24 at a time (the page cache holds the file, as
    it does for the samplers' cold runs): what any index of the lengths must at least do.
    """
    code = (
        "import sys, time, numpy as np; t = time.perf_counter(); a = np.load(sys.argv[1], mmap_mode='r'); "
        f"c = np.zeros(8193, np.int64); step = {FLOOR_CHUNK}\n"
        "for i in range(0, a.size, step): c += np.bincount(a[i : i + step], minlength=c.size)\n"
        "print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(directory / f"lengths-{n}.npy")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return float(out.stdout.strip())


# -- the table ---------------------------------------------------------------------------------------
def mb(value: float) -> str:
    return f"{value / 2**20:,.1f} MB" if value < 2**30 else f"{value / 2**30:,.2f} GB"


def row(n: int, label: str, cold: dict[str, Any], warm: dict[str, Any], floor: float | None, node: str = "") -> str:
    ratio = f"{cold['first_batch_s'] / floor:.1f}x" if floor else ""
    imported = f" (import {warm['import_s'] * 1e3:.0f} ms)" if "import_s" in warm else ""
    return (f"| {n:.0e} | {label} | {cold['first_batch_s']:.3f} s | {ratio} | {warm['first_batch_s']:.3f} s{imported} "
            f"| {mb(cold['peak_growth'])} / {mb(warm['peak_growth'])} | {mb(warm['shared_bytes'])} "
            f"| {warm['units_per_s']:,.0f} | {node} |")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1e6", "1e7", "1e8"])
    parser.add_argument("--samplers", nargs="+", default=SAMPLERS, choices=SAMPLERS)
    parser.add_argument(
        "--dir",
        default=str(Path(tempfile.gettempdir()) / "shardwise-bench-scale"),
        help="inputs (and caches) live here (default: shardwise-bench-scale in the temporary folder)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 3e5 samples, Bucket Packed ClassBalanced Weighted TwoStream, no node totals",
    )
    parser.add_argument("--no-node", action="store_true", help="skip the 8-process node totals")
    parser.add_argument("--node-sizes", nargs="*", default=["1e8"], help="sizes that get the node totals")
    parser.add_argument(
        "--node-samplers",
        nargs="*",
        default=["Sharded", "Bucket"],
        help="samplers that get the node totals (8 x an O(n) sampler's memory may not fit)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the numpy floor (one read + one bincount)")
    parser.add_argument("--before", type=Path, default=None, metavar="SRC",
                        help="also run each sampler on the code in this src directory (before/after rows)")  # fmt: skip
    parser.add_argument("--before-max", default="1e7", help="largest n that gets a before row (default 1e7)")
    parser.add_argument("--one", nargs=2, metavar=("SAMPLER", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=RANK, help=argparse.SUPPRESS)
    parser.add_argument("--sync", default=None, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    directory = Path(args.dir)
    if args.quick:
        args.sizes, args.no_node = ["3e5"], True
        args.samplers = ["Bucket", "Packed", "ClassBalanced", "Weighted", "TwoStream"]
    if args.one:
        result = one(args.one[0], int(args.one[1]), directory, args.rank, Path(args.sync) if args.sync else None)
        print(json.dumps(result))
        return
    import torch

    if args.before is not None and not (args.before / "shardwise").is_dir():
        parser.error(f"--before {args.before}: no shardwise package in it")
    load, now = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"bench_scale: W={WORLD}, rank {RANK}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {now}")  # fmt: skip
    print(f"code: {SRC}" + (f"; before: {args.before}" if args.before is not None else "") + "\n")
    print("| n | sampler | cold first batch | cold / floor | warm first batch | private growth cold / warm "
          "| shared files | units/s (warm) | node: 8 ranks sum PSS (anon) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        n = int(float(size))
        make_inputs(directory, n, set(args.samplers), floor=not args.no_floor)
        floor = None
        if not args.no_floor:
            floor = counting_floor(n, directory)
            label = "floor: map the lengths, one np.bincount (fresh process)"
            print(f"| {n:.0e} | {label} | {floor:.3f} s | 1x | | | | | |")
        for name in args.samplers:
            if args.before is not None and name != "torch" and n <= int(float(args.before_max)):
                cache = directory / f"cache-{name}-{n}-before"
                shutil.rmtree(cache, ignore_errors=True)
                cold = run_one(name, n, directory, cache, src=args.before)
                warm = run_one(name, n, directory, cache, src=args.before)
                print(row(n, f"{name} (before: {args.before.parent.name})", cold, warm, floor), flush=True)
                shutil.rmtree(cache, ignore_errors=True)
            cache = directory / f"cache-{name}-{n}"
            shutil.rmtree(cache, ignore_errors=True)
            cold = run_one(name, n, directory, cache)
            warm = run_one(name, n, directory, cache)
            node = ""
            if not args.no_node and name in args.node_samplers and n in {int(float(s)) for s in args.node_sizes}:
                totals = run_node(name, n, directory, cache)
                node = f"{mb(totals['pss'])} ({mb(totals['pss_anon'])})"
            print(row(n, name, cold, warm, floor, node), flush=True)
            shutil.rmtree(cache, ignore_errors=True)
    load = os.getloadavg()
    print(f"\nload at end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
