"""MixtureSampler against the anchors' mixing methods, side by side: proportions, memory, build, resume.

Run (alone on the machine; the greedy index at 1e8 takes about 1 GB)::

    python -m bench.bench_mixture

Setting: 5 sources of sizes 4e8, 3e8, 2e8, 5e7, 5e7 with weights 0.4, 0.3, 0.15, 0.1, 0.05.
The arms, each a reimplementation of the method (not the library), run in this script:

- **shardwise**: ``MixtureSampler(sizes, weights, num_samples=n)`` at its default block (20 here:
  the weights are 8:6:3:2:1) and with ``block=1024`` (a global batch of 8 x 128, the batch option),
  each with the shuffled block order (the default) and with ``interleave=True``.
- **random draws**: each position draws a source with probability ``w_i`` (i.i.d.), as torchdata
  ``nodes.MultiNodeWeightedSampler``, LitData ``CombinedStreamingDataset`` and HF
  ``interleave_datasets(probabilities=...)`` do; numpy ``Generator.choice``.
- **greedy index**: Megatron-LM ``BlendedDataset``'s ``build_blending_indices``: at step ``t`` pick
  the source with the largest deficit ``w_i * (t + 1) - count_i``, record ``(source, count_i)``: an
  O(n) index (uint8 + int64 per sample, as Megatron's ``dataset_index``/``dataset_sample_index``),
  computed here by the same loop in C (compiled at run time with ``cc -O2``; Megatron's is C++).

Proportions: over the first 4e6 positions of the global plan, for every window of 1k, 10k and 1M
consecutive positions (every start), the largest ``|count_i - w_i * window|`` over the sources, and
the same divided by the blocks the window touches (the target is <= 1 per source per block).

Memory (RssAnon growth, fresh process per arm) and build time at n = 1e9 planned samples (shardwise:
build and the first 1e6 indices of rank 3 of 8; random draws: nothing to build; greedy index: measured
at n = 1e8 and 1e7, and extrapolated linearly to 1e9 where stated). Resume at 50% of a 1e9 plan:
build a sampler, ``load_state_dict`` a state saved at W = 8, take the next batch of 256 at W = 6
(median of 7); the next batches are checked against the plan's positions. ``--quick`` shrinks n.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from bench._lib.common import ROOT, module_command, status_bytes

SIZES = [400_000_000, 300_000_000, 200_000_000, 50_000_000, 50_000_000]
WEIGHTS = [0.4, 0.3, 0.15, 0.1, 0.05]
WINDOWS = [1_000, 10_000, 1_000_000]
PLAN = 4_000_000  # positions whose source sequence is measured

_GREEDY_C = r"""
#include <stdint.h>
void build_blending_indices(uint8_t *dataset_index, int64_t *dataset_sample_index, const double *weights,
                            int32_t num_datasets, int64_t size) {
    int64_t current_samples[256] = {0};
    for (int64_t i = 0; i < size; ++i) {
        double sample_idx_double = (double)(i > 1 ? i : 1);
        int64_t max_error_index = 0;
        double max_error = weights[0] * sample_idx_double - (double)current_samples[0];
        for (int32_t j = 1; j < num_datasets; ++j) {
            double error = weights[j] * sample_idx_double - (double)current_samples[j];
            if (error > max_error) { max_error = error; max_error_index = j; }
        }
        dataset_index[i] = (uint8_t)max_error_index;
        dataset_sample_index[i] = current_samples[max_error_index];
        current_samples[max_error_index] += 1;
    }
}
"""


def greedy_library() -> Any:
    """The C loop, compiled once into a temporary shared library."""
    folder = tempfile.mkdtemp(prefix="shardwise-bench-")
    source, library = os.path.join(folder, "greedy.c"), os.path.join(folder, "greedy.so")
    with open(source, "w") as handle:
        handle.write(_GREEDY_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", source, "-o", library], check=True)
    lib = ctypes.CDLL(library)
    lib.build_blending_indices.restype = None
    return lib


def greedy_index(n: int, lib: Any) -> tuple[np.ndarray, np.ndarray]:
    dataset_index = np.empty(n, dtype=np.uint8)
    sample_index = np.empty(n, dtype=np.int64)
    weights = np.asarray(WEIGHTS, dtype=np.float64)
    lib.build_blending_indices(
        dataset_index.ctypes.data_as(ctypes.c_void_p), sample_index.ctypes.data_as(ctypes.c_void_p),
        weights.ctypes.data_as(ctypes.c_void_p), ctypes.c_int32(len(WEIGHTS)), ctypes.c_int64(n),
    )  # fmt: skip
    return dataset_index, sample_index


# -- proportions ----------------------------------------------------------------------------------
def sources_shardwise(block: int | None, *, length: int, interleave: bool = False) -> tuple[np.ndarray, int]:
    from shardwise import MixtureSampler

    sampler = MixtureSampler(SIZES, WEIGHTS, num_samples=10**9, block=block, interleave=interleave, seed=0,
                             num_replicas=1, rank=0)  # fmt: skip
    return sampler._plan.locate(0, 0, np.arange(length, dtype=np.int64)).sources, sampler.block


def max_deviation(sources: np.ndarray, window: int) -> float:
    """Largest |count_i - w_i * window| over every window of ``window`` consecutive positions and source."""
    worst = 0.0
    for i, weight in enumerate(WEIGHTS):
        hits = np.zeros(len(sources) + 1, dtype=np.int32)
        np.cumsum(sources == i, out=hits[1:])
        counts = hits[window:] - hits[:-window]
        worst = max(worst, float(np.abs(counts - weight * window).max()))
    return worst


def proportions(length: int) -> list[dict[str, Any]]:
    rows = []
    ours, block = sources_shardwise(None, length=length)
    ours_1024, _ = sources_shardwise(1024, length=length)
    interleaved, _ = sources_shardwise(None, interleave=True, length=length)
    interleaved_1024, _ = sources_shardwise(1024, interleave=True, length=length)
    random = np.random.default_rng(0).choice(len(WEIGHTS), size=length, p=WEIGHTS).astype(np.int64)
    greedy = greedy_index(length, greedy_library())[0].astype(np.int64)
    arms = [
        (f"shardwise (block {block})", ours, block),
        ("shardwise (block 1024)", ours_1024, 1024),
        (f"shardwise interleave=True (block {block})", interleaved, block),
        ("shardwise interleave=True (block 1024)", interleaved_1024, 1024),
        ("random draws (torchdata/LitData/HF)", random, None),
        ("greedy index (Megatron)", greedy, None),
    ]
    for name, sources, arm_block in arms:
        row: dict[str, Any] = {"arm": name}
        for window in WINDOWS:
            deviation = max_deviation(sources, window)
            row[f"max dev, window {window}"] = f"{deviation:.2f}"
            if arm_block is not None:
                touched = -(-window // arm_block) + 1
                row[f"max dev, window {window}"] += f" ({deviation / touched:.3f}/block)"
        rows.append(row)
    return rows


# -- memory and build, one fresh process per arm ----------------------------------------------------
def child(arm: str, n: int) -> dict[str, Any]:
    import torch  # noqa: F401  # imported before the baseline, as a training script has it

    import shardwise

    before = status_bytes("RssAnon")
    start = time.perf_counter()
    if arm == "shardwise":
        sampler = shardwise.MixtureSampler(SIZES, WEIGHTS, num_samples=n, seed=0, num_replicas=8, rank=3)
        iterator = iter(sampler)
        first = next(iterator)
        built = time.perf_counter()
        for _ in range(min(10**6, len(sampler)) - 1):  # --quick: a rank may hold fewer than 1e6
            next(iterator)
        del first
    elif arm == "random":
        rng = np.random.default_rng(0)
        built = time.perf_counter()
        rng.choice(len(WEIGHTS), size=10**6, p=WEIGHTS)
    else:
        lib = greedy_library()
        start = time.perf_counter()
        index = greedy_index(n, lib)
        built = time.perf_counter()
        return {"build_s": built - start, "rss_anon_growth": status_bytes("RssAnon") - before, "entries": len(index[0])}
    return {"build_s": built - start, "rss_anon_growth": status_bytes("RssAnon") - before}


def run_child(arm: str, n: int) -> dict[str, Any]:
    out = subprocess.run(module_command("bench.bench_mixture", "--child", arm, str(n)), cwd=ROOT, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# -- resume -------------------------------------------------------------------------------------
def resume(n: int) -> dict[str, Any]:
    from torch.utils.data import BatchSampler

    from shardwise import MixtureSampler

    saver = MixtureSampler(SIZES, WEIGHTS, num_samples=n, seed=0, num_replicas=8, rank=0)
    state = saver.state_dict() | {"consumed": n // 2}
    times_8, times_6 = [], []
    for world_size, times in ((8, times_8), (6, times_6)):
        for _ in range(7):
            start = time.perf_counter()
            sampler = MixtureSampler(SIZES, WEIGHTS, num_samples=n, seed=0, num_replicas=world_size, rank=1)
            sampler.load_state_dict(state)
            batch = next(iter(BatchSampler(sampler, 256, drop_last=False)))
            times.append(time.perf_counter() - start)
            positions = n // 2 + 1 + world_size * np.arange(256)
            if batch != sampler._plan.indices(0, 0, positions).tolist():
                raise RuntimeError("resumed batch differs from the plan")
    # After the W=6 resume, the global sequence is the plan's: its proportions are the plan's.
    window = 60_000
    ranks = []
    for rank in range(6):
        sampler = MixtureSampler(SIZES, WEIGHTS, num_samples=n, seed=0, num_replicas=6, rank=rank)
        sampler.load_state_dict(state)
        iterator = iter(sampler)
        ranks.append([next(iterator) for _ in range(window // 6)])
    interleaved = np.asarray(ranks).T.reshape(-1)
    plan = sampler._plan.indices(0, 0, n // 2 + np.arange(window))
    return {"median_w8_ms": 1e3 * statistics.median(times_8), "median_w6_ms": 1e3 * statistics.median(times_6),
            "max_w6_ms": 1e3 * max(times_6), "w6_union_equals_plan": bool((interleaved == plan).all())}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(keys), rule, *(line([r.get(k, "") for k in keys]) for r in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("ARM", "N"), help=argparse.SUPPRESS)  # one arm (internal)
    parser.add_argument("--quick", action="store_true", help="a 1.2e6-position plan and n up to 1e8 (a smoke test)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {np.__version__}, "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    length = 1_200_000 if args.quick else PLAN
    print(f"\nProportions over the first {length:.0e} positions of the global plan (every window start)\n")
    print(table(proportions(length)))
    big = 10**8 if args.quick else 10**9
    rows = []
    for n in (big // 100, big):  # flat in n
        ours = run_child("shardwise", n)
        rows.append({"arm": "shardwise", "n": f"{n:.0e}", "build + first index": f"{1e3 * ours['build_s']:.1f} ms",
                     "RssAnon growth (build + 1e6 indices)": f"{ours['rss_anon_growth'] / 2**20:.1f} MB"})  # fmt: skip
    random = run_child("random", big)
    rows.append({"arm": "random draws", "n": f"{big:.0e}", "build + first index": f"{1e3 * random['build_s']:.3f} ms",
                 "RssAnon growth (build + 1e6 indices)": f"{random['rss_anon_growth'] / 2**20:.1f} MB"})  # fmt: skip
    for n in (10**6, 10**7) if args.quick else (10**7, 10**8):
        greedy = run_child("greedy", n)
        growth = f"{greedy['rss_anon_growth'] / 2**20:.1f} MB"
        rows.append({"arm": "greedy index", "n": f"{n:.0e}", "build + first index": f"{greedy['build_s']:.2f} s",
                     "RssAnon growth (build + 1e6 indices)": growth})  # fmt: skip
    per_sample = greedy["rss_anon_growth"] / n
    rows.append({"arm": "greedy index (extrapolated x10, linear)", "n": f"{10 * n:.0e}",
                 "build + first index": f"~{10 * greedy['build_s']:.1f} s",
                 "RssAnon growth (build + 1e6 indices)": f"~{10 * n * per_sample / 2**30:.1f} GB"})  # fmt: skip
    print(f"\nMemory and build at {big:.0e} planned samples over 5 sources (fresh process per arm)\n")
    print(table(rows))
    print(f"\nResume at 50% of a {big:.0e}-sample plan (saved at W=8; build + load + next batch of 256, rank 1)\n")
    result = resume(big)
    print(table([{"resume at W=8 (median of 7)": f"{result['median_w8_ms']:.2f} ms",
                  "resume at W=6 (median of 7)": f"{result['median_w6_ms']:.2f} ms",
                  "W=6 worst": f"{result['max_w6_ms']:.2f} ms",
                  "W=6 ranks' union == plan (60k positions)": result["w6_union_equals_plan"]}]))  # fmt: skip


if __name__ == "__main__":
    main()
