"""The multi-process figures of ``bench_sharded_sources.py``: each loader on real gloo ranks, resumed its way.

``launch`` runs ``rank_loop.rank_main`` on ranks of this venv (``shardwise.tools.launch.run_distributed``),
or, for LitData and MosaicML Streaming, in their scratch venvs (``scratch_venvs``); ``rank_figures``
reads one epoch at W=3 (2 workers a rank: steps, samples lost or repeated, shuffle step by step,
samples/s cold and warm, seconds to the first batch and for the epoch, peak memory) and resumes
it at W=3 and W=2 (``resume_rows``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._lib.common import shuffle_quality
from bench._lib.scratch_venvs import SCRATCH, STREAMING, loader_spec, scratch_run

BATCH = 32


NAMES = {"shardwise": "shardwise", "shardwise-streams": "shardwise, mixing=streams",
         "shardwise-worker": "shardwise, decode=worker", "shardwise-1thread": "shardwise, prefetch_threads=1",
         "hf": "HF datasets",
         "webdataset": "WebDataset", "litdata": "LitData", "streaming": "Streaming",
         "streaming-limit": "Streaming, cache_limit = window",
         "streaming-block": "Streaming, cache_limit = window, shuffle_block_size = window"}
RESUMED_BY = {"shardwise": "sampler state", "hf": "StatefulDataLoader state, rank r <- rank r",
              "webdataset": "no resume: restarts the epoch", "litdata": "StreamingDataLoader state of rank 0",
              "streaming": "StreamingDataLoader state of rank 0"}
RESUMED_BY["streaming-limit"] = RESUMED_BY["streaming-block"] = RESUMED_BY["streaming"]
RESUMED_BY["shardwise-streams"] = RESUMED_BY["shardwise-worker"] = RESUMED_BY["shardwise"]
RESUMED_BY["shardwise-1thread"] = RESUMED_BY["shardwise"]


def lost_repeated(reads: list[int], n: int) -> str:
    """Samples of ``range(n)`` never read, and reads beyond the first of a sample."""
    unique = set(reads)
    return f"{n - len(unique & set(range(n)))} / {len(reads) - len(unique)}"


def launch(world_size: int, spec: dict[str, Any], key: str | None = None) -> list[dict[str, Any]]:
    """``rank_main`` on ``world_size`` real gloo ranks; LitData's and Streaming's in their scratch venvs.

    RuntimeError if a rank raised.
    """
    key = key or spec["loader"]
    if key not in SCRATCH:
        from bench._lib.rank_loop import rank_main
        from shardwise.tools.launch import run_distributed

        reports: list[dict[str, Any]] = run_distributed(rank_main, world_size, spec, timeout=900)
        return reports
    spec_file = Path(spec["root"]) / f"{key}-spec.json"
    spec_file.write_text(json.dumps({**spec, "world_size": world_size}))
    done = scratch_run(key, "ranks", str(spec_file))
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORTS ")]
    if not lines:
        raise RuntimeError(f"{NAMES[key]}'s ranks printed no reports: {done.stderr[-2000:]}")
    answer = json.loads(lines[-1].removeprefix("REPORTS "))
    if isinstance(answer, dict):
        print(done.stderr[-4000:], file=sys.stderr)
        raise RuntimeError(answer["error"])
    return list(answer)


def resume_rows(spec: dict[str, Any], key: str, n: int, stop: int, name: str,
                first: list[dict[str, Any]] | None = None) -> list[tuple[str, str, str]]:
    """Stop W=3 ranks at step ``stop``, resume at W=3 and at W=2: samples lost and repeated over the epoch."""
    spec = {**loader_spec(spec, key), "cache": f"cache-ranks-{key}"}
    if first is None:
        first = launch(3, {**spec, "stop": stop}, key)
    before = [i for r in first for i in r["before"]]
    state = [r["state"] for r in first] if key == "hf" else first[0]["state"]
    rows = []
    for resumed in (3, 2):
        try:
            second = launch(resumed, {**spec, "state": state}, key)
            value = lost_repeated(before + [i for r in second for i in r["ids"]], n)
        except RuntimeError as error:  # a rank raised: say how
            lines = [line for line in str(error).splitlines() if "Error" in line]
            value = f"fails: {(lines[-1] if lines else str(error))[:160]}"
        rows.append((f"lost / repeated, stopped at step {stop} of W=3, resumed at W={resumed}",
                     f"{name} ({RESUMED_BY[key]})", value))
    return rows


def step_order(reports: list[dict[str, Any]]) -> np.ndarray:
    """The ids the ranks read in one epoch in training order: step 0's batches of rank 0, 1, ..., then step 1's."""
    order = []
    for step in range(max(r["steps"] for r in reports)):
        for r in reports:
            order.extend(r["ids"][step * BATCH : (step + 1) * BATCH])
    return np.asarray(order, dtype=np.int64)


def quality_text(order: np.ndarray, shard_of: np.ndarray) -> str:
    quality = shuffle_quality(order, shard_of)
    return f"{quality['same_shard']:.3f} / {quality['id_step']:.3f} / {quality['spearman']:+.3f}"


def rank_figures(spec: dict[str, Any], n: int, loaders: list[str], shard_of: np.ndarray) -> list[tuple[str, str, str]]:
    """Ranks as processes, 2 workers each: an epoch at W=3 (cold, stopping point, warm), resumed at W=3 and W=2."""
    rows: list[tuple[str, str, str]] = []
    world_size = 3
    stop = max(1, int(0.4 * n / (world_size * BATCH)))  # 40% into the epoch
    for key in loaders:
        name = NAMES[key]
        began = time.perf_counter()
        try:
            fetch_log = str(Path(spec["root"]) / f"fetched-{key}")  # Streaming logs its downloads there
            first = launch(world_size, {**loader_spec(spec, key), "stop": stop, "warm": True,
                                        "cache": f"cache-ranks-{key}", "fetch_log": fetch_log}, key)
        except RuntimeError as error:
            rows.append(("one epoch at W=3, 2 workers", name, f"fails: {str(error)[-160:]}"))
            continue
        counts = [r["steps"] for r in first]
        rows.append(("steps per rank, W=3, 2 workers (min / max)", name, f"{min(counts)} / {max(counts)}"))
        rows.append(("one epoch, uninterrupted: lost / repeated", name,
                     lost_repeated([i for r in first for i in r["ids"]], n)))
        rows.append(("same-shard pairs / mean |id step|/n / Spearman, the W=3 ranks' reads step by step", name,
                     quality_text(step_order(first), shard_of)))
        for label in ("cold", "warm"):
            rates = [r[label] for r in first]
            rows.append((f"samples/s per rank, W=3, 2 workers, {label} (mean, min..max)", name,
                         f"{np.mean(rates):,.0f} ({min(rates):,.0f}..{max(rates):,.0f})"))
        for label in ("cold", "warm"):
            waits = [r.get(f"startup_{label}", float("nan")) for r in first]
            rows.append((f"seconds from iter(loader) to the first batch, W=3, 2 workers, {label} (mean, min..max)",
                         name, f"{np.mean(waits):.2f} ({min(waits):.2f}..{max(waits):.2f})"))
        for label in ("cold", "warm"):
            walls = [r.get(f"epoch_{label}", float("nan")) for r in first]
            rows.append((f"seconds for the whole epoch, iter(loader) to the last batch, {label} (mean, min..max)",
                         name, f"{np.mean(walls):.2f} ({min(walls):.2f}..{max(walls):.2f})"))
        peaks = [r["peak"] / 2**20 for r in first]
        bases = [r["base"] / 2**20 for r in first]
        rows.append(("peak anonymous MiB per rank, rank + 2 workers, Pss_Anon (max, min..max; before the loader)", name,
                     f"{max(peaks):,.0f} ({min(peaks):,.0f}..{max(peaks):,.0f}); {np.mean(bases):,.0f}"))
        if key in STREAMING:
            from bench._lib.streaming_loader import fetched_bytes

            local = Path(spec["root"]) / "streaming-cache" / loader_spec(spec, key)["streaming_local"]
            held = sum(p.stat().st_size for p in local.glob("shard.*"))
            rows.append(("bytes fetched / dataset, W=3, both epochs (cold + warm); shard bytes in its cache after",
                         name, f"{fetched_bytes(fetch_log) / spec['streaming_bytes']:.3f}; {held:,}"))
        rows.extend(resume_rows(spec, key, n, stop, f"{name}, 2 workers", first))
        if key == "hf":  # its resume with workers fails: the same resume without workers
            rows.extend(resume_rows({**spec, "workers": 0}, key, n, stop, f"{name}, num_workers=0"))
        print(f"{name}: ranks done in {time.perf_counter() - began:.0f} s", flush=True)
    return rows
