"""What ``RaggedArray.verify()`` costs, per GiB of store, against reading the same bytes without a checksum.

Run (alone on the machine: the figures are timings)::

    python -m bench.bench_ragged_verify              # 2 GiB store
    python -m bench.bench_ragged_verify --size-gib 1
    python -m bench.bench_ragged_verify --quick      # a 0.05 GiB store (a smoke test)

A store of ``--size-gib`` of float32 rows (80 features) is written in the temporary folder and
deleted at the end. Measured, each in this process: ``RaggedArray(path)`` (open: sizes, headers, offsets, 16
sampled blocks), ``verify()`` with the files in the page cache (median of 3) and after evicting
them with ``posix_fadvise(DONTNEED)`` on the store's own files (cold: disk speed), and the
baseline: reading the same files with plain 16 MiB reads and no checksum, warm and cold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from shardwise import RaggedArray

FEATURES = 80
GIB = 1 << 30


def store_files(path: Path) -> list[Path]:
    """The files ``verify()`` reads: the store's own (its ``index/`` folder holds a length-index cache)."""
    return sorted(file for file in path.iterdir() if file.is_file())


def evict(path: Path) -> None:
    """Drop the store's files from the page cache (only these files: the machine is shared)."""
    for file in store_files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_plain(path: Path) -> None:
    """The baseline: every byte of every file, 16 MiB at a time, nothing computed."""
    buffer = memoryview(bytearray(1 << 24))
    for file in store_files(path):
        with open(file, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass


def timed(function: object) -> float:
    start = time.perf_counter()
    function()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="--size-gib 0.05 (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.size_gib = 0.05
    root = Path(tempfile.mkdtemp(prefix="shardwise-verify-"))
    try:
        rng = np.random.default_rng(0)
        rows_total = int(args.size_gib * GIB) // (4 * FEATURES)
        block = rng.standard_normal((4096, FEATURES)).astype(np.float32)

        def samples():
            left = rows_total
            while left > 0:
                rows = min(left, int(rng.integers(50, 1500)))
                left -= rows
                yield block[np.arange(rows) % len(block)]

        start = time.perf_counter()
        store = RaggedArray.write(root / "store", samples())
        written = time.perf_counter() - start
        size = sum(f.stat().st_size for f in store_files(store.path)) / GIB
        print(f"store: {size:.2f} GiB, {len(store)} samples (written in {written:.1f} s)")

        opens = [timed(lambda: RaggedArray(root / "store")) for _ in range(10)]
        warm = [timed(store.verify) for _ in range(3)]
        plain_warm = [timed(lambda: read_plain(store.path)) for _ in range(3)]
        evict(store.path)
        cold = timed(store.verify)
        evict(store.path)
        plain_cold = timed(lambda: read_plain(store.path))

        rows = [
            ("open (median of 10)", statistics.median(opens), None),
            ("verify(), page cache (median of 3)", statistics.median(warm), statistics.median(plain_warm)),
            ("plain read, page cache (median of 3)", statistics.median(plain_warm), statistics.median(plain_warm)),
            ("verify(), evicted (cold)", cold, plain_cold),
            ("plain read, evicted (cold)", plain_cold, plain_cold),
        ]
        print(f"{'':38} {'seconds':>9} {'s per GiB':>10} {'x plain read':>13}")
        for label, seconds, base in rows:
            ratio = "" if base is None else f"{seconds / base:.2f}x"
            per_gib = f"{seconds * 1e3:.2f} ms" if base is None else f"{seconds / size:.3f}"
            print(f"{label:38} {seconds:9.3f} {per_gib:>10} {ratio:>13}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
