"""The benchmark's side of the loaders that run in scratch venvs (LitData, MosaicML Streaming).

``bench_sharded_sources.py`` uses these: which venv and script each such loader runs in
(``SCRATCH``), which of them can run here (``available``), the spec of each Streaming row
(``loader_spec``), and the conversion of the Parquet rows to each one's own format on the S3
endpoint (``scratch_setup``: LitData's chunks, Streaming's MDS shards). The modules that run in the
venvs are ``bench._lib.litdata_venv`` and ``bench._lib.streaming_venv`` (sharing ``venv_ranks``), as
``python -m`` from the repository root.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench._lib.common import ROOT


def venv_python(variable: str, folder: str) -> str:
    """``$<variable>``, else ``<the temporary folder>/<folder>/bin/python``: a scratch venv's interpreter."""
    return os.environ.get(variable) or os.path.join(tempfile.gettempdir(), folder, "bin", "python")


# Loaders that run in a scratch venv of their own (docs/benchmarks/sharded-sources.md shows how each is made):
# interpreter, module. LitData's venv has torch 2.13, Streaming's torch 2.14.1.
SCRATCH = {"litdata": (venv_python("SHARDWISE_LITDATA_PYTHON", "scratch-venv"), "bench._lib.litdata_venv"),
           "streaming": (venv_python("SHARDWISE_STREAMING_PYTHON", "scratch-venv-streaming"),
                         "bench._lib.streaming_venv")}
SCRATCH["streaming-limit"] = SCRATCH["streaming-block"] = SCRATCH["streaming"]
STREAMING = ("streaming", "streaming-limit", "streaming-block")
VENV_NAMES = {SCRATCH["litdata"][0]: "LitData", SCRATCH["streaming"][0]: "Streaming"}


def loader_spec(spec: dict[str, Any], key: str) -> dict[str, Any]:
    """``spec`` for the loader named ``key``.

    ``shardwise-streams``: ``LocalitySampler(mixing="streams")`` (in this venv); ``shardwise-worker``:
    ``ShardedSource(decode="worker")``, each worker decoding the Parquet shards; ``shardwise-1thread``:
    ``ShardCache(prefetch_threads=1)``, one download at a time per rank; ``streaming-limit``:
    Streaming with a node cache of a window's bytes; ``streaming-block``: the same, and py1e blocks
    of a window's samples (``window`` x the mean shard's samples).
    """
    if key == "shardwise-streams":
        return {**spec, "loader": "shardwise", "mixing": "streams", "streaming_local": "default"}
    if key == "shardwise-worker":
        return {**spec, "loader": "shardwise", "decode": "worker", "streaming_local": "default"}
    if key == "shardwise-1thread":
        return {**spec, "loader": "shardwise", "prefetch_threads": 1, "streaming_local": "default"}
    if key == "streaming-limit":
        return {**spec, "loader": "streaming", "cache_limit": spec["streaming_window_bytes"],
                "streaming_local": "limit"}
    if key == "streaming-block":
        return {**spec, "loader": "streaming", "cache_limit": spec["streaming_window_bytes"],
                "shuffle_block_size": spec["streaming_window_samples"], "streaming_local": "block"}
    return {**spec, "loader": key, "streaming_local": "default"}


def scratch_run(key: str, *args: str, timeout: float = 1200) -> Any:
    """Run ``key``'s module in its scratch venv: ``python -m`` from the repository root (``bench`` importable), with
    this worktree's ``src`` on ``PYTHONPATH`` (shardwise is not installed there)."""
    import subprocess

    python, module = SCRATCH[key]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([python, "-m", module, *args], cwd=ROOT, env=env, check=False, capture_output=True,
                          text=True, timeout=timeout)


def available(loaders: list[str]) -> list[str]:
    """The loaders that can run here: LitData and Streaming only with their scratch venvs."""
    kept, missing = [], set()
    for name in loaders:
        python = SCRATCH.get(name, ("",))[0]
        if python and not os.path.exists(python):
            if python not in missing:  # one line a venv
                print(f"{VENV_NAMES[python]} left out: no {python} (BENCHMARKS.md shows how to make that venv)")
            missing.add(python)
            continue
        kept.append(name)
    return kept


def scratch_setup(spec: dict[str, Any], loaders: list[str], root: Path, fs: Any, sizes: np.ndarray, window: int,
                  shard_of: np.ndarray, quality: Callable[[np.ndarray, np.ndarray], str]) -> list[tuple[str, str, str]]:
    """LitData's and Streaming's own formats of the rows, on the endpoint, for the loaders that run."""
    if "litdata" in loaders:  # LitData reads its own chunks: the same rows, optimized
        litdata_setup(spec, root, fs, int(sizes.sum()) // len(sizes))
    if set(STREAMING) & set(loaders):  # Streaming reads MDS shards: the same rows
        return streaming_setup(spec, root, fs, len(sizes), window, shard_of, quality)
    return []


def litdata_setup(spec: dict[str, Any], root: Path, fs: Any, chunk: int) -> None:
    """The rows ``optimize``d into LitData's chunks of ``chunk`` samples, on the endpoint (``spec`` gets their URL)."""
    done = scratch_run("litdata", "optimize", str(root / "shards"), str(root / "litdata"), str(chunk), timeout=600)
    if done.returncode:
        raise RuntimeError(f"litdata optimize failed: {done.stderr[-2000:]}")
    fs.put(str(root / "litdata") + "/", "bench/litdata/", recursive=True)
    spec["litdata_url"] = "s3://bench/litdata"


def streaming_setup(spec: dict[str, Any], root: Path, fs: Any, shards: int, window: int, shard_of: np.ndarray,
                    quality: Callable[[np.ndarray, np.ndarray], str]) -> list[tuple[str, str, str]]:
    """The rows as MDS shards on the endpoint (``spec`` gets their URL and a window's bytes); py1e's own order."""
    import json

    done = scratch_run("streaming", "mds", str(root / "shards"), str(root / "mds"), str(shards), timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("MDS ")]
    if done.returncode or not lines:
        raise RuntimeError(f"MDS conversion failed: {done.stderr[-2000:]}")
    mds = json.loads(lines[-1].removeprefix("MDS "))
    fs.put(str(root / "mds") + "/", "bench/mds/", recursive=True)
    spec["streaming_url"] = "s3://bench/mds"
    counts = np.asarray([s["samples"] for s in mds], dtype=np.int64)
    sizes = np.sort([s["bytes"] for s in mds])
    spec["streaming_bytes"] = int(sizes.sum())
    # What shardwise's window holds: the `window` largest shards (Streaming refuses less than 4 of its largest).
    spec["streaming_window_bytes"] = max(int(sizes[-window:].sum()), 4 * int(sizes[-1]) + 1)
    spec["streaming_window_samples"] = window * -(-int(counts.sum()) // len(counts))
    np.save(root / "mds-sizes.npy", counts)
    order_file = root / "py1e-order.npy"
    done = scratch_run("streaming", "py1e", str(root / "mds-sizes.npy"), str(order_file), "--seed", "0", timeout=300)
    if done.returncode:
        raise RuntimeError(f"py1e order failed: {done.stderr[-2000:]}")
    order = np.load(order_file)
    mds_shard_of = np.repeat(np.arange(len(counts)), counts)
    print(f"MDS: {len(counts)} shards of {counts.min()}..{counts.max()} samples, {sizes[0]}..{sizes[-1]} bytes; "
          f"cache_limit for a window: {spec['streaming_window_bytes']} bytes", flush=True)
    return [
        ("MDS shards: count, samples min..max, bytes min..max", "Streaming",
         f"{len(counts)}, {counts.min()}..{counts.max()}, {sizes[0]:,}..{sizes[-1]:,}"),
        ("cache_limit = window: bytes (the window's largest MDS shards); shuffle_block_size = window: samples",
         "Streaming", f"{spec['streaming_window_bytes']:,}; {spec['streaming_window_samples']:,}"),
        ("same-shard pairs / mean |id step|/n / Spearman", "Streaming py1e global order (1 canonical node, defaults)",
         quality(order, shard_of)),
        ("same, same-shard pairs counted on its MDS shards", "Streaming py1e global order (1 canonical node, defaults)",
         quality(order, mds_shard_of)),
    ]
