"""How long ``shardwise.verify`` takes: 8 simulated ranks x 2 epochs of a 100k-sample sampler.

Run (alone on the machine: the figures are timings)::

    python -m bench.bench_verify
    python -m bench.bench_verify --quick   # 2 ranks x 2 epochs, one try a row (a smoke test)

Rows, measured in this one run, side by side:

- baseline: a fresh ``python -c "import shardwise"`` (the floor of any fresh process);
- the work: the 8 ranks x 2 epochs iterated in this process, once (what a loop over the ranks costs);
- verify: ``shardwise.verify("bench/bench_verify.py:make_sampler", world_size=8)`` in simulated mode
  (two phases of fresh processes; every check).
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time

import shardwise

SIZE = 100_000
WORLD_SIZE = 8


def make_sampler(rank: int, world_size: int) -> shardwise.ShardedSampler:
    """The factory verify calls once per rank."""
    return shardwise.ShardedSampler(SIZE, num_replicas=world_size, rank=rank, seed=1)


def _best(fn: object, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def _startup() -> None:
    subprocess.run([sys.executable, "-c", "import shardwise"], check=True)


def _work(world_size: int) -> None:
    for rank in range(world_size):
        sampler = make_sampler(rank, world_size)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            list(sampler)


def _verify(world_size: int) -> None:
    report = shardwise.verify(f"{os.path.abspath(__file__)}:make_sampler", world_size=world_size)
    if not report.ok:
        raise RuntimeError(report.summary())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=WORLD_SIZE, help=f"simulated ranks (default {WORLD_SIZE})")
    parser.add_argument("--repeat", type=int, default=3, help="tries a row (the best is shown)")
    parser.add_argument("--quick", action="store_true", help="--world-size 2 --repeat 1 (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.world_size, args.repeat = 2, 1
    w, repeat = args.world_size, args.repeat
    startup = _best(_startup, repeat)
    rows = [
        ("fresh `import shardwise` process (baseline)", startup),
        (f"{w} ranks x 2 epochs in one process", _best(functools.partial(_work, w), repeat)),
        (f"shardwise.verify, {w} ranks x 2 epochs, simulated", _best(functools.partial(_verify, w), repeat)),
    ]
    print(f"{'what':<52} {'seconds':>8} {'x baseline':>11}   (cpus: {os.cpu_count()})")
    for name, seconds in rows:
        print(f"{name:<52} {seconds:8.2f} {seconds / startup:11.1f}")


if __name__ == "__main__":
    main()
