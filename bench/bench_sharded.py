"""ShardedSampler against torch's DistributedSampler and torchdata's StatefulDataLoader resume.

Run (serialised with the other benchmarks)::

    python -m bench.bench_sharded

Every measurement runs in a fresh subprocess (this script re-invokes itself with ``--arm`` and
reads one JSON line back), so one arm's peak memory cannot hide another's and every "first
batch" is a cold one. All arms use rank 3 of a world of 8 and ``BatchSampler(batch_size=256)``.

- first batch: time from building the sampler to ``next(iter(batch_sampler))`` returning;
- epoch: time until this rank's last batch (first batch included);
- peak growth: the child's peak RSS (``ru_maxrss``) minus its RSS after imports;
- resume: a state taken after ``k`` batches is loaded into a freshly built sampler (shardwise:
  ``load_state_dict``; torchdata: a new ``StatefulDataLoader``'s ``load_state_dict``, which
  fast-forwards a plain ``DistributedSampler``) and the time to the next batch is measured; the
  batch is checked against the one the uninterrupted run yielded.

Times are wall-clock medians over ``--repeat`` fresh processes, the two sides interleaved (torch
at n = 1e8 runs once: ~25 s and ~4.6 GB). The machine is shared, so each time is also taken as
CPU time of the process (``time.process_time``), which waiting for a core does not inflate.
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


class Clock:
    """Wall-clock and CPU time since construction."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self, name: str) -> dict[str, float]:
        return {f"{name}_s": time.perf_counter() - self.wall, f"{name}_cpu_s": time.process_time() - self.cpu}


# -- arms (each runs in its own subprocess) -----------------------------------------------------


def batches_per_rank(n: int) -> int:
    """Batches one rank yields in an epoch (padding to equal lengths, last batch kept)."""
    per_rank = (n + WORLD_SIZE - 1) // WORLD_SIZE
    return (per_rank + BATCH_SIZE - 1) // BATCH_SIZE


def resume_points(n: int, fractions: list[float]) -> list[tuple[float, int]]:
    """``(fraction, k)``: resume after ``k`` of this rank's batches, ``0 < k < batches``."""
    batches = batches_per_rank(n)
    return [(fraction, max(1, min(batches - 1, round(fraction * batches)))) for fraction in fractions]


def arm_epoch(impl: str, n: int, limit: int | None) -> dict[str, Any]:
    """First batch, then the whole epoch (or ``limit`` indices of it), and the peak RSS growth."""
    from torch.utils.data import BatchSampler, DistributedSampler

    from shardwise import ShardedSampler

    make = DistributedSampler if impl == "torch" else ShardedSampler
    gc.collect()
    base = rss()
    clock = Clock()
    sampler = make(range(n), num_replicas=WORLD_SIZE, rank=RANK, shuffle=True, seed=0)
    iterator = iter(BatchSampler(sampler, batch_size=BATCH_SIZE, drop_last=False))
    count = len(next(iterator))
    first = clock.read("first_batch")
    for batch in iterator:
        count += len(batch)
        if limit is not None and count >= limit:
            break
    return {**first, **clock.read("elapsed"), "indices": count, "peak_growth_bytes": peak_rss() - base}


def arm_resume_shardwise(n: int, fractions: list[float]) -> dict[str, Any]:
    """Load the state saved after k batches into a new ShardedSampler; time to the next batch."""
    from torch.utils.data import BatchSampler, DataLoader

    from shardwise import ShardedSampler
    from shardwise.tools.scenarios import IndexDataset

    dataset = IndexDataset(n)

    def fresh() -> ShardedSampler:
        return ShardedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK, seed=0)

    results = []
    for fraction, k in resume_points(n, fractions):
        # The state every rank would save after k batches (256 indices each, on every rank).
        saving = fresh()
        iterator = iter(BatchSampler(saving, batch_size=BATCH_SIZE, drop_last=False))
        for _ in range(k):
            next(iterator)
        state = saving.state_dict()
        expected = next(iterator)
        del iterator, saving
        gc.collect()

        clock = Clock()
        sampler = fresh()
        sampler.load_state_dict(state)
        batch = next(iter(BatchSampler(sampler, batch_size=BATCH_SIZE, drop_last=False)))
        alone = clock.read("resume")
        if batch != expected:
            raise RuntimeError(f"shardwise resumed at batch {k} with a batch other than the uninterrupted run's")

        # The same inside a plain DataLoader (collation included), like the torchdata arm.
        clock = Clock()
        sampler = fresh()
        sampler.load_state_dict(state)
        tensor = next(iter(DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)))
        in_loader = clock.read("loader_resume")
        if tensor.tolist() != expected:
            raise RuntimeError(f"shardwise in a DataLoader resumed at batch {k} with another batch")
        results.append({"fraction": fraction, "k": k, **alone, **in_loader})
    return {"resume": results}


def arm_resume_torchdata(n: int, fractions: list[float]) -> dict[str, Any]:
    """torchdata's StatefulDataLoader over a plain DistributedSampler: its default fast-forward."""
    import warnings

    from torch.utils.data import DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardwise.tools.scenarios import IndexDataset

    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    dataset = IndexDataset(n)

    def loader() -> StatefulDataLoader:
        sampler = DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=RANK, shuffle=True, seed=0)
        return StatefulDataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)

    results = []
    for fraction, k in resume_points(n, fractions):
        saving = loader()
        iterator = iter(saving)
        for _ in range(k):
            next(iterator)
        state = saving.state_dict()
        expected = next(iterator).tolist()
        del iterator, saving
        gc.collect()

        clock = Clock()
        resumed = loader()
        resumed.load_state_dict(state)
        batch = next(iter(resumed))
        timing = clock.read("resume")
        if batch.tolist() != expected:
            raise RuntimeError(f"torchdata resumed at batch {k} with a batch other than the uninterrupted run's")
        results.append({"fraction": fraction, "k": k, **timing})
    return {"resume": results}


def run_arm(args: argparse.Namespace) -> None:
    if args.arm == "epoch":
        result = arm_epoch(args.impl, args.n, args.limit)
    elif args.impl == "shardwise":
        result = arm_resume_shardwise(args.n, args.fractions)
    else:
        result = arm_resume_torchdata(args.n, args.fractions)
    print(json.dumps(result))


# -- driver ---------------------------------------------------------------------------------------


def child(arguments: list[str]) -> dict[str, Any]:
    """Run one arm in a fresh interpreter and return its JSON result."""
    from bench._lib.common import ROOT, module_command  # here: an arm's process imports only what it measures

    command = module_command("bench.bench_sharded", *arguments)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments)} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric field's median over runs (a field that is a list: element by element)."""
    first = runs[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, list):
            out[key] = [medians([run[key][i] for run in runs]) for i in range(len(value))]
        else:
            out[key] = statistics.median(run[key] for run in runs)
    return out


def interleaved(arms: dict[str, tuple[list[str], int]]) -> dict[str, dict[str, Any]]:
    """Run each arm its number of times, alternating between arms; the median of each."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for round_ in range(max(times for _, times in arms.values())):
        for name, (arguments, times) in arms.items():
            if round_ < times:
                runs[name].append(child(arguments))
    return {name: medians(results) for name, results in runs.items()}


def epoch_arguments(impl: str, n: int, limit: int | None = None) -> list[str]:
    arguments = ["--arm", "epoch", "--impl", impl, "--n", str(n)]
    return [*arguments, "--limit", str(limit)] if limit is not None else arguments


def resume_arguments(impl: str, n: int) -> list[str]:
    return ["--arm", "resume", "--impl", impl, "--n", str(n), "--fractions", *map(str, RESUME_FRACTIONS)]


def duration(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def both(result: dict[str, Any], name: str) -> str:
    """``wall (cpu)`` of one timing."""
    return f"{duration(result[f'{name}_s'])} ({duration(result[f'{name}_cpu_s'])})"


def mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MB"


def ratio(baseline: dict[str, Any], ours: dict[str, Any], name: str) -> str:
    """``wall (cpu)`` speed-up of ours over the baseline."""
    wall = baseline[f"{name}_s"] / ours[f"{name}_s"]
    cpu = baseline[f"{name}_cpu_s"] / max(ours[f"{name}_cpu_s"], 1e-9)
    return f"{wall:.0f}x ({cpu:.0f}x)"


def sci(n: int) -> str:
    return f"1e{len(str(n)) - 1}" if str(n).rstrip("0") == "1" else str(n)


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def progress(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", choices=["epoch", "resume"], help="internal: run one arm and print JSON")
    parser.add_argument("--impl", choices=["torch", "shardwise", "torchdata"], help="internal")
    parser.add_argument("--n", type=int, help="internal")
    parser.add_argument("--limit", type=int, help="internal")
    parser.add_argument("--fractions", type=float, nargs="+", help="internal")
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per arm; the median is reported")
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke test)")
    args = parser.parse_args()
    if args.arm:
        run_arm(args)
        return

    import numpy
    import torch

    sizes = [10**5, 10**6] if args.quick else [10**6, 10**7, 10**8]
    big = 10**8 if args.quick else 10**10
    bounded = 10**5 if args.quick else BOUNDED_INDICES
    resume_sizes = (10**6, 10**7) if args.quick else (10**7, 10**8)
    repeat = args.repeat
    header = (
        f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}, "
        f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} at start; "
        f"world_size={WORLD_SIZE}, rank={RANK}, batch_size={BATCH_SIZE}; "
        f"median of {repeat} fresh processes per arm (torch at n=1e8: 1); cells: wall (CPU)"
    )
    out = [header, ""]

    rows = []
    for n in sizes:
        progress(f"epoch, n={sci(n)}")
        result = interleaved(
            {
                "ours": (epoch_arguments("shardwise", n), repeat),
                "torch": (epoch_arguments("torch", n), 1 if n >= 10**8 else repeat),
            }
        )
        ours, theirs = result["ours"], result["torch"]
        rows.append(
            [
                sci(n),
                both(theirs, "first_batch"),
                both(ours, "first_batch"),
                ratio(theirs, ours, "first_batch"),
                both(theirs, "elapsed"),
                both(ours, "elapsed"),
                ratio(theirs, ours, "elapsed"),
                mb(theirs["peak_growth_bytes"]),
                mb(ours["peak_growth_bytes"]),
            ]
        )
    out += ["DistributedSampler + BatchSampler (torch) vs ShardedSampler + BatchSampler (shardwise)", ""]
    out.append(
        table(
            [
                "n",
                "first batch, torch",
                "first batch, shardwise",
                "speed-up",
                "epoch (1 rank), torch",
                "epoch (1 rank), shardwise",
                "speed-up",
                "peak RSS growth, torch",
                "peak RSS growth, shardwise",
            ],
            rows,
        )
    )

    progress(f"alone, n={sci(big)}")
    alone = interleaved({"ours": (epoch_arguments("shardwise", big, bounded), repeat)})["ours"]
    out += [
        "",
        f"ShardedSampler + BatchSampler alone at n={sci(big)}: a rank's epoch is {big // WORLD_SIZE} indices; "
        f"only the first {alone['indices']:.0f} are timed",
        "",
    ]
    out.append(
        table(
            ["n", "first batch", f"first {alone['indices']:.0f} indices", "throughput (wall)", "peak RSS growth"],
            [
                [
                    sci(big),
                    both(alone, "first_batch"),
                    both(alone, "elapsed"),
                    f"{alone['indices'] / alone['elapsed_s'] / 1e6:.1f} M indices/s",
                    mb(alone["peak_growth_bytes"]),
                ]
            ],
        )
    )

    rows = []
    for n in resume_sizes:
        progress(f"resume, n={sci(n)}")
        arms = {"ours": (resume_arguments("shardwise", n), repeat)}
        if n == resume_sizes[0]:
            arms["torchdata"] = (resume_arguments("torchdata", n), repeat)
        result = interleaved(arms)
        for i, mine in enumerate(result["ours"]["resume"]):
            other = result["torchdata"]["resume"][i] if "torchdata" in result else None
            rows.append(
                [
                    sci(n),
                    f"{mine['fraction']:.0%} (batch {mine['k']:.0f})",
                    both(other, "resume") if other else "not run",
                    both(mine, "loader_resume"),
                    both(mine, "resume"),
                    ratio(other, mine, "resume") if other else "",
                ]
            )
    out += ["", "Resume: build, load_state_dict, time to the next batch (checked against the uninterrupted run)", ""]
    out.append(
        table(
            [
                "n",
                "position",
                "torchdata StatefulDataLoader + DistributedSampler",
                "DataLoader + ShardedSampler",
                "BatchSampler + ShardedSampler",
                "speed-up (BatchSampler + ShardedSampler)",
            ],
            rows,
        )
    )
    print("\n".join(out))


if __name__ == "__main__":
    main()
