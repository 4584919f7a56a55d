"""How long ``shardwise.verify`` takes: 8 simulated ranks x 2 epochs of a 100k-sample sampler.

Run (serialised with the other benchmarks)::

    flock /tmp/shardwise-bench.lock python bench/bench_verify.py

Rows, measured in this one run, side by side:

- baseline: a fresh ``python -c "import shardwise"`` (the floor of any fresh process);
- the work: the 8 ranks x 2 epochs iterated in this process, once (what a loop over the ranks costs);
- verify: ``shardwise.verify("bench/bench_verify.py:make_sampler", world_size=8)`` in simulated mode
  (two phases of fresh processes; every check).
"""

from __future__ import annotations

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


def _work() -> None:
    for rank in range(WORLD_SIZE):
        sampler = make_sampler(rank, WORLD_SIZE)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            list(sampler)


def _verify() -> None:
    report = shardwise.verify(f"{os.path.abspath(__file__)}:make_sampler", world_size=WORLD_SIZE)
    if not report.ok:
        raise RuntimeError(report.summary())


def main() -> None:
    startup = _best(_startup)
    rows = [
        ("fresh `import shardwise` process (baseline)", startup),
        ("8 ranks x 2 epochs in one process", _best(_work)),
        ("shardwise.verify, 8 ranks x 2 epochs, simulated", _best(_verify)),
    ]
    print(f"{'what':<52} {'seconds':>8} {'x baseline':>11}   (cpus: {os.cpu_count()})")
    for name, seconds in rows:
        print(f"{name:<52} {seconds:8.2f} {seconds / startup:11.1f}")


if __name__ == "__main__":
    main()
