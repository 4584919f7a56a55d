"""ShardedSampler against torch's DistributedSampler and torchdata's StatefulDataLoader resume.

Run (serialised with the other benchmarks)::

    flock /tmp/shardwise-bench.lock python bench/bench_sharded.py

Every measurement runs in a fresh subprocess (this script re-invokes itself with ``--arm``, and
reads one JSON line back), so one arm's peak memory cannot hide another's and every "first
batch" is a cold one. All arms use rank 3 of a world of 8 and ``BatchSampler(batch_size=256)``.

- first batch: wall time of ``next(iter(batch_sampler))`` on a freshly built sampler;
- epoch: wall time until this rank's last batch (first batch included);
- peak growth: the child's peak RSS (``ru_maxrss``) minus its RSS after imports and set-up;
- resume: a state taken after ``k`` batches is loaded into a freshly built sampler (shardwise:
  ``load_state_dict``; torchdata: a new ``StatefulDataLoader``'s ``load_state_dict``, which
  fast-forwards a plain ``DistributedSampler``) and the wall time to the next batch is measured;
  the batch is checked against the one the uninterrupted run yielded.

Options: ``--quick`` runs only the small sizes (a smoke test), ``--repeat R`` repeats the cheap
arms and reports the median (torch at n = 1e8 always runs once).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

WORLD_SIZE = 8
RANK = 3
BATCH_SIZE = 256
BOUNDED_INDICES = 10**7
"""At n = 1e10 a rank's epoch is 1.25e9 indices; only this many are timed (throughput)."""

RESUME_FRACTIONS = (0.01, 0.5, 0.99)


def rss() -> int:
    """Current resident set size of this process, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class IndexDataset:
    """A trivial map-style dataset: item ``i`` is ``i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


# -- arms (each runs in its own subprocess) -----------------------------------------------------


def batches_per_rank(n: int) -> int:
    """Batches one rank yields in an epoch (padding to equal lengths, last batch kept)."""
    per_rank = (n + WORLD_SIZE - 1) // WORLD_SIZE
    return (per_rank + BATCH_SIZE - 1) // BATCH_SIZE


def make_sampler(impl: str, n: int) -> Any:
    from torch.utils.data import BatchSampler, DistributedSampler

    from shardwise import ShardedSampler

    if impl == "torch":
        sampler = DistributedSampler(range(n), num_replicas=WORLD_SIZE, rank=RANK, shuffle=True, seed=0)
    else:
        sampler = ShardedSampler(range(n), num_replicas=WORLD_SIZE, rank=RANK, shuffle=True, seed=0)
    return BatchSampler(sampler, batch_size=BATCH_SIZE, drop_last=False)


def arm_epoch(impl: str, n: int, limit: int | None) -> dict[str, Any]:
    """First batch, then the whole epoch (or ``limit`` indices of it), and the peak RSS growth."""
    import torch.utils.data  # noqa: F401  (imports are outside the measurement)

    import shardwise  # noqa: F401

    gc.collect()
    base = rss()
    start = time.perf_counter()
    batches = make_sampler(impl, n)
    iterator = iter(batches)
    first = next(iterator)
    first_batch = time.perf_counter() - start
    count = len(first)
    wanted = limit if limit is not None else None
    for batch in iterator:
        count += len(batch)
        if wanted is not None and count >= wanted:
            break
    elapsed = time.perf_counter() - start
    return {
        "first_batch_s": first_batch,
        "elapsed_s": elapsed,
        "indices": count,
        "peak_growth_bytes": peak_rss() - base,
        "rss_base_bytes": base,
    }


def arm_resume_shardwise(n: int, fractions: list[float]) -> dict[str, Any]:
    """Load the state saved after k batches into a new ShardedSampler; time to the next batch."""
    from torch.utils.data import BatchSampler, DataLoader

    from shardwise import ShardedSampler

    dataset = IndexDataset(n)
    per_rank_batches = batches_per_rank(n)
    results = []
    for fraction in fractions:
        k = max(1, min(per_rank_batches - 1, round(fraction * per_rank_batches)))
        # The state every rank would save after k batches (a full batch is 256 indices per rank).
        saving = ShardedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK, seed=0)
        saving_batches = BatchSampler(saving, batch_size=BATCH_SIZE, drop_last=False)
        iterator = iter(saving_batches)
        for _ in range(k):
            next(iterator)
        state = saving.state_dict()
        expected = next(iterator)
        del iterator, saving, saving_batches
        gc.collect()

        start = time.perf_counter()
        sampler = ShardedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK, seed=0)
        sampler.load_state_dict(state)
        batch = next(iter(BatchSampler(sampler, batch_size=BATCH_SIZE, drop_last=False)))
        elapsed = time.perf_counter() - start
        if batch != expected:
            raise RuntimeError(f"shardwise resumed at batch {k} with a batch other than the uninterrupted run's")

        # The same inside a plain DataLoader (collation included), like the torchdata arm.
        start = time.perf_counter()
        sampler = ShardedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK, seed=0)
        sampler.load_state_dict(state)
        tensor = next(iter(DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)))
        in_loader = time.perf_counter() - start
        if tensor.tolist() != expected:
            raise RuntimeError(f"shardwise in a DataLoader resumed at batch {k} with another batch")
        results.append({"fraction": fraction, "k": k, "resume_s": elapsed, "loader_resume_s": in_loader})
    return {"resume": results}


def arm_resume_torchdata(n: int, fractions: list[float]) -> dict[str, Any]:
    """torchdata's StatefulDataLoader over a plain DistributedSampler: its default fast-forward."""
    from torch.utils.data import DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = IndexDataset(n)

    def loader() -> StatefulDataLoader:
        sampler = DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK, shuffle=True, seed=0)
        return StatefulDataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)

    per_rank_batches = batches_per_rank(n)
    results = []
    for fraction in fractions:
        k = max(1, min(per_rank_batches - 1, round(fraction * per_rank_batches)))
        saving = loader()
        iterator = iter(saving)
        for _ in range(k):
            next(iterator)
        state = saving.state_dict()
        expected = next(iterator).tolist()
        del iterator, saving
        gc.collect()

        start = time.perf_counter()
        resumed = loader()
        resumed.load_state_dict(state)
        batch = next(iter(resumed))
        elapsed = time.perf_counter() - start
        if batch.tolist() != expected:
            raise RuntimeError(f"torchdata resumed at batch {k} with a batch other than the uninterrupted run's")
        results.append({"fraction": fraction, "k": k, "resume_s": elapsed})
    return {"resume": results}


def run_arm(args: argparse.Namespace) -> None:
    if args.arm == "epoch":
        result = arm_epoch(args.impl, args.n, args.limit)
    elif args.arm == "resume" and args.impl == "shardwise":
        result = arm_resume_shardwise(args.n, args.fractions)
    elif args.arm == "resume":
        result = arm_resume_torchdata(args.n, args.fractions)
    else:
        raise ValueError(f"unknown arm {args.arm!r}")
    print(json.dumps(result))


# -- driver ---------------------------------------------------------------------------------------


def child(*arguments: str) -> dict[str, Any]:
    """Run one arm in a fresh interpreter and return its JSON result."""
    command = [sys.executable, os.path.abspath(__file__), *arguments]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments)} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def epoch(impl: str, n: int, repeat: int, limit: int | None = None) -> dict[str, Any]:
    arguments = ["--arm", "epoch", "--impl", impl, "--n", str(n)]
    if limit is not None:
        arguments += ["--limit", str(limit)]
    return median_of([child(*arguments) for _ in range(repeat)])


def resume(impl: str, n: int, fractions: tuple[float, ...], repeat: int) -> list[dict[str, Any]]:
    arguments = ["--arm", "resume", "--impl", impl, "--n", str(n), "--fractions", *map(str, fractions)]
    runs = [child(*arguments)["resume"] for _ in range(repeat)]
    timings = [key for key in runs[0][0] if key.endswith("_s")]
    return [
        {**runs[0][i], **{key: statistics.median(run[i][key] for run in runs) for key in timings}}
        for i in range(len(fractions))
    ]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MB"


def ratio(baseline: float, ours: float) -> str:
    return f"{baseline / ours:.0f}x" if ours > 0 else "inf"


def sci(n: int) -> str:
    return f"1e{len(str(n)) - 1}" if str(n).strip("0") == "1" else str(n)


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", choices=["epoch", "resume"])
    parser.add_argument("--impl", choices=["torch", "shardwise", "torchdata"])
    parser.add_argument("--n", type=int)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--fractions", type=float, nargs="+")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cheap arm; the median is reported")
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    args = parser.parse_args()
    if args.arm:
        run_arm(args)
        return

    import numpy
    import torch

    sizes = [10**5, 10**6] if args.quick else [10**6, 10**7, 10**8]
    big = 10**8 if args.quick else 10**10
    bounded = 10**5 if args.quick else BOUNDED_INDICES
    print(
        f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}, "
        f"{os.cpu_count()} cpus; world_size={WORLD_SIZE}, rank={RANK}, batch_size={BATCH_SIZE}, "
        f"median of {args.repeat} fresh processes (torch at n=1e8: one)\n"
    )

    rows = []
    for n in sizes:
        ours = epoch("shardwise", n, args.repeat)
        theirs = epoch("torch", n, 1 if n >= 10**8 else args.repeat)
        rows.append(
            [
                sci(n),
                ms(theirs["first_batch_s"]),
                ms(ours["first_batch_s"]),
                ratio(theirs["first_batch_s"], ours["first_batch_s"]),
                ms(theirs["elapsed_s"]),
                ms(ours["elapsed_s"]),
                ratio(theirs["elapsed_s"], ours["elapsed_s"]),
                mb(theirs["peak_growth_bytes"]),
                mb(ours["peak_growth_bytes"]),
            ]
        )
        print(f"  measured n={sci(n)}", file=sys.stderr, flush=True)
    print("DistributedSampler + BatchSampler (torch) vs ShardedSampler + BatchSampler (shardwise)\n")
    print(
        table(
            [
                "n",
                "first batch torch",
                "first batch shardwise",
                "speed-up",
                "epoch torch",
                "epoch shardwise",
                "speed-up",
                "peak growth torch",
                "peak growth shardwise",
            ],
            rows,
        )
    )

    alone = epoch("shardwise", big, args.repeat, limit=bounded)
    print(f"\nShardedSampler alone at n={sci(big)} ({big // WORLD_SIZE} indices per rank; only the first "
          f"{alone['indices']} are timed)\n")
    print(
        table(
            ["n", "first batch", f"time for {alone['indices']} indices", "throughput", "peak growth"],
            [
                [
                    sci(big),
                    ms(alone["first_batch_s"]),
                    ms(alone["elapsed_s"]),
                    f"{alone['indices'] / alone['elapsed_s'] / 1e6:.1f} M indices/s",
                    mb(alone["peak_growth_bytes"]),
                ]
            ],
        )
    )

    resume_n = 10**6 if args.quick else 10**7
    ours_resume = resume("shardwise", resume_n, RESUME_FRACTIONS, args.repeat)
    theirs_resume = resume("torchdata", resume_n, RESUME_FRACTIONS, args.repeat)
    rows = [
        [
            sci(resume_n),
            f"{mine['fraction']:.0%} (batch {mine['k']})",
            ms(other["resume_s"]),
            ms(mine["loader_resume_s"]),
            ratio(other["resume_s"], mine["loader_resume_s"]),
            ms(mine["resume_s"]),
            ratio(other["resume_s"], mine["resume_s"]),
        ]
        for mine, other in zip(ours_resume, theirs_resume, strict=True)
    ]
    resume_big = 10**7 if args.quick else 10**8
    rows += [
        [
            sci(resume_big),
            f"{mine['fraction']:.0%} (batch {mine['k']})",
            "not run",
            ms(mine["loader_resume_s"]),
            "",
            ms(mine["resume_s"]),
            "",
        ]
        for mine in resume("shardwise", resume_big, RESUME_FRACTIONS, args.repeat)
    ]
    print("\nResume: new sampler, load_state_dict, time to the next batch (checked against the uninterrupted run)\n")
    print(
        table(
            [
                "n",
                "position",
                "torchdata StatefulDataLoader + DistributedSampler",
                "DataLoader + ShardedSampler",
                "speed-up",
                "BatchSampler + ShardedSampler",
                "speed-up",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
