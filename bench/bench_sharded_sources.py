"""Sharded data on S3, side by side: shardwise (ShardedSource + LocalitySampler) vs HF datasets streaming vs WebDataset.

The same samples are written as Parquet shards (shardwise, HF datasets) and WebDataset tars, in an
uneven number of uneven shards, and served by moto's S3 server on 127.0.0.1 (``tests/s3_server.py``).
Each loader is used as its documentation says:

- shardwise: ``ShardedSource(s3 URLs)`` + ``LocalitySampler(window=...)`` in a ``DataLoader``
  (``shardwise-streams``: with ``mixing="streams"``; ``shardwise-worker``: with ``decode="worker"``,
  each DataLoader worker decoding the Parquet shards it reads instead of the node decoding each
  once; ``shardwise-1thread``: ``ShardCache(prefetch_threads=1)``, one download at a time a rank;
  all in the multi-process figures);
- HF datasets: ``load_dataset("parquet", streaming=True)`` + ``.shuffle(buffer_size=1000)`` +
  ``split_dataset_by_node``;
- WebDataset: ``WebDataset(presigned http URLs, nodesplitter=split_by_node, shardshuffle=100).shuffle(1000)``.

Figures, in process (ranks simulated by ``RANK``/``WORLD_SIZE`` or explicit rank arguments): steps
per rank (min/max) at W = 3 and 4 (batch 32); shuffle quality of one epoch's order against a
uniform permutation (fraction of consecutive samples from one shard, mean |id difference| over n,
Spearman correlation of position and id); samples/s of one rank with ``num_workers=0``, cold and
warm; bytes shardwise fetched over the dataset's size.

Figures with ranks as real processes (``shardwise.tools.launch.run_distributed``, gloo), 2 forked
DataLoader workers each (``bench/_sharded_ranks.py``): steps per rank at W=3; samples lost and
repeated when W=3 ranks stop 40% into the epoch and resume at W=3 and at W=2, each loader resumed
its documented way; samples/s per rank, cold (first epoch) and warm (second), timed from the first
batch, the seconds before that first batch (the workers' start-up, and whatever a cold loader fetches
before it) and the seconds of the whole epoch, both included (the slowest rank's is the epoch's); peak anonymous memory
(``Pss_Anon``) of a rank plus its workers; the shuffle quality of the order the W=3 ranks read
(step by step: step 0's batches of rank 0, 1, 2, then step 1's). LitData joins these when
``/tmp/scratch-venv`` has torch 2.13, litdata and pyarrow (``bench/_litdata_ranks.py``: it reads
the same rows ``optimize``d into its chunks, on the same S3 endpoint).

MosaicML Streaming joins them when ``/tmp/scratch-venv-streaming`` has mosaicml-streaming 0.13.0
(``bench/_streaming_ranks.py``): the same rows written as MDS shards of about the mean shard's bytes
(``MDSWriter``) on the same S3 endpoint, read by ``StreamingDataset(remote="s3://...", local=<node
cache>, shuffle=True, shuffle_algo="py1e", batch_size=32)`` in a ``StreamingDataLoader``, resumed
with its ``state_dict()``/``load_state_dict()``; two rows: its defaults (``num_canonical_nodes`` =
physical nodes = 1, ``shuffle_block_size`` = max(4_000_000 // nodes, 1 << 18), no
``cache_limit``); ``cache_limit`` = the bytes of the window's largest MDS shards (what
shardwise's window holds); and that with ``shuffle_block_size`` = the window's samples (window x
the mean MDS shard's samples); plus the bytes it downloads and py1e's own global order. Streaming
imports torchvision, and PyPI's torchvision does not import beside this machine's torch 2.13.0,
so that venv has torch 2.14.1 (CPU use; BENCHMARKS.md gives the commands that make it):

    python3 -m venv /tmp/scratch-venv-streaming
    /tmp/scratch-venv-streaming/bin/pip install --no-deps mosaicml-streaming==0.13.0
    /tmp/scratch-venv-streaming/bin/pip install torch==2.14.1 torchvision==0.29.1 'numpy<2.2' \\
        boto3 zstd xxhash python-snappy Brotli tqdm 'transformers<5' catalogue pyarrow

Either venv missing: that loader is left out with one printed line.

Run: ``flock /tmp/shardwise-bench.lock python bench/bench_sharded_sources.py``
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.s3_server: the moto fixture
from _common import shuffle_quality, uneven_sizes
from _scratch_loaders import SCRATCH, STREAMING, available, loader_spec, scratch_run, scratch_setup

BATCH = 32


def write_shards(root: Path, n: int, shards: int, seed: int) -> tuple[np.ndarray, int, int]:
    """Parquet and WebDataset shards of ``n`` samples (id, ~300 int32 tokens) in ``shards`` uneven shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset

    sizes = uneven_sizes(n, shards, seed)
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(100, 500, size=n)
    first = 0
    for s, size in enumerate(sizes.tolist()):
        ids = np.arange(first, first + size)
        tokens = [rng.integers(0, 50_000, size=lengths[i], dtype=np.int32) for i in ids]
        table = pa.table({"id": ids, "tokens": pa.array(tokens, type=pa.list_(pa.int32()))})
        pq.write_table(table, root / f"train-{s:03d}.parquet", row_group_size=256)
        with webdataset.TarWriter(str(root / f"train-{s:03d}.tar")) as tar:
            for i, tok in zip(ids.tolist(), tokens, strict=True):
                tar.write({"__key__": f"{i:08d}", "cls": i, "npy": tok})
        first += size
    parquet = sum(p.stat().st_size for p in root.glob("*.parquet"))
    tars = sum(p.stat().st_size for p in root.glob("*.tar"))
    return sizes, parquet, tars


def steps(count: int) -> int:
    return math.ceil(count / BATCH)


def list_collate(batch: list[Any]) -> list[Any]:
    return batch


def timed(rows: Iterable[Any], get_id: Any) -> tuple[list[int], float]:
    start = time.perf_counter()
    ids = [int(get_id(row)) for row in rows]
    return ids, time.perf_counter() - start


def scale_probe() -> None:
    """Private memory a rank's LocalitySampler adds at 1e9 samples in 1e5 shards (the metadata simulated)."""
    import itertools

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import smaps_rollup
    from shardwise import LocalitySampler

    before = smaps_rollup()["Anonymous"]
    sizes = np.full(100_000, 10_000, dtype=np.int64)  # 1e9 samples
    sampler = LocalitySampler(sizes, window=8, num_replicas=8, rank=3, seed=0)
    start = time.perf_counter()
    drawn = sum(1 for _ in itertools.islice(iter(sampler), 1_000_000))
    seconds = time.perf_counter() - start
    grown = smaps_rollup()["Anonymous"] - before
    print(f"SCALE {drawn} {seconds:.3f} {grown}")


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
        from _sharded_ranks import rank_main
        from shardwise.tools.launch import run_distributed

        reports: list[dict[str, Any]] = run_distributed(rank_main, world_size, spec, timeout=900)
        return reports
    import json

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
            from _streaming_ranks import fetched_bytes

            local = Path(spec["root"]) / "streaming-cache" / loader_spec(spec, key)["streaming_local"]
            held = sum(p.stat().st_size for p in local.glob("shard.*"))
            rows.append(("bytes fetched / dataset, W=3, both epochs (cold + warm); shard bytes in its cache after",
                         name, f"{fetched_bytes(fetch_log) / spec['streaming_bytes']:.3f}; {held:,}"))
        rows.extend(resume_rows(spec, key, n, stop, f"{name}, 2 workers", first))
        if key == "hf":  # its resume with workers fails: the same resume without workers
            rows.extend(resume_rows({**spec, "workers": 0}, key, n, stop, f"{name}, num_workers=0"))
        print(f"{name}: ranks done in {time.perf_counter() - began:.0f} s", flush=True)
    return rows


def main() -> None:
    if "--scale-probe" in sys.argv:
        scale_probe()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6_000)
    parser.add_argument("--shards", type=int, default=37)
    parser.add_argument("--window", type=int, default=8, help="LocalitySampler window (shards mixed together)")
    parser.add_argument("--loaders", default=",".join(NAMES),
                        help="loaders of the multi-process figures, some of: %(default)s (streaming-limit: "
                             "Streaming with cache_limit = the bytes of the window's largest MDS shards; "
                             "streaming-block: that and shuffle_block_size = window x the mean MDS shard's samples)")
    parser.add_argument("--no-ranks", action="store_true", help="skip the multi-process figures")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds the S3 server waits before answering each request (real stores: 0.01-0.1)")
    args = parser.parse_args()
    unknown = sorted(set(args.loaders.split(",")) - set(NAMES))
    if unknown:
        parser.error(f"--loaders should name some of {','.join(NAMES)}, but got {','.join(unknown)}")

    import subprocess

    probe = subprocess.run([sys.executable, __file__, "--scale-probe"], capture_output=True, text=True, check=True,
                           timeout=600).stdout.split("SCALE ")[1].split()
    scale_rows = [
        ("private memory added per rank, 1e9 samples in 1e5 shards", "shardwise", f"{int(probe[2]) / 2**20:.1f} MiB"),
        ("indices/s per rank at that scale (first 1e6)", "shardwise", f"{int(probe[0]) / float(probe[1]):,.0f}"),
    ]

    import datasets
    import webdataset as wds
    from datasets.distributed import split_dataset_by_node
    from tests.s3_server import make_bucket, s3_endpoint, storage_options
    from torch.utils.data import DataLoader

    from shardwise import LocalitySampler, ShardCache, ShardedSampler, ShardedSource

    datasets.disable_progress_bars()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp, s3_endpoint(args.latency) as endpoint:
        root = Path(tmp)
        (root / "shards").mkdir()
        sizes, parquet_bytes, tar_bytes = write_shards(root / "shards", args.samples, args.shards, seed=0)
        n = int(sizes.sum())
        shard_of = np.repeat(np.arange(len(sizes)), sizes)
        fs = make_bucket(endpoint, "bench")
        fs.put(str(root / "shards") + "/", "bench/train/", recursive=True)
        options = storage_options(endpoint)
        parquet_urls = [f"s3://bench/train/train-{s:03d}.parquet" for s in range(len(sizes))]
        import boto3

        # WebDataset reads http(s) URLs with curl: presigned GETs of the same private objects.
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        tar_urls = [client.generate_presigned_url("get_object", ExpiresIn=3600, Params={
            "Bucket": "bench", "Key": f"train/train-{s:03d}.tar"}) for s in range(len(sizes))]
        hf_options = {k: options[k] for k in ("key", "secret", "client_kwargs")}
        print(f"{n} samples in {len(sizes)} shards (sizes {sizes.min()}..{sizes.max()}); "
              f"parquet {parquet_bytes / 1e6:.1f} MB, tar {tar_bytes / 1e6:.1f} MB; endpoint {endpoint}, "
              f"{args.latency * 1e3:g} ms a request")

        def shardwise_source(cache_dir: str, budget: int | None = None) -> ShardedSource:
            cache = ShardCache(root / cache_dir, budget_bytes=budget, storage_options=options)
            return ShardedSource(parquet_urls, cache=cache, index_dir=root / "index")

        def hf(rank: int, world_size: int, columns: list[str] | None = None) -> Any:
            ds = datasets.load_dataset("parquet", data_files={"train": parquet_urls}, split="train", streaming=True,
                                       storage_options=hf_options)
            if columns is not None:
                ds = ds.select_columns(columns)
            ds = ds.shuffle(seed=0, buffer_size=1000)
            return split_dataset_by_node(ds, rank=rank, world_size=world_size)

        def webdataset(rank: int, world_size: int) -> Any:
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
            return wds.WebDataset(tar_urls, nodesplitter=wds.split_by_node, shardshuffle=100, seed=0,
                                  empty_check=False).shuffle(1000)

        # -- steps per rank ----------------------------------------------------------------------
        source = shardwise_source("cache-steps")
        for world_size in (3, 4):
            ours = [steps(len(LocalitySampler(source, window=args.window, num_replicas=world_size, rank=r)))
                    for r in range(world_size)]
            theirs_hf = [steps(sum(1 for _ in hf(r, world_size, ["id"]))) for r in range(world_size)]
            theirs_wds = [steps(sum(1 for _ in webdataset(r, world_size))) for r in range(world_size)]
            for name, counts in (("shardwise", ours), ("HF datasets", theirs_hf), ("WebDataset", theirs_wds)):
                rows.append((f"steps per rank, W={world_size}", name, f"{min(counts)} / {max(counts)}"))
        os.environ.pop("RANK"), os.environ.pop("WORLD_SIZE")

        # -- one epoch, one rank: shuffle quality and samples/s ------------------------------------
        orders: dict[str, np.ndarray] = {}
        rates: dict[str, str] = {}
        fetched = ""
        for label, cache_dir in (("cold", "cache-epoch"), ("warm", "cache-epoch")):
            src = shardwise_source(cache_dir)
            sampler = LocalitySampler(src, window=args.window, num_replicas=1, rank=0, seed=0)
            loader = DataLoader(src, sampler=sampler, batch_size=BATCH, collate_fn=list_collate)
            ids, seconds = timed((row for batch in loader for row in batch), lambda row: row["id"])
            rates[f"shardwise {label}"] = f"{n / seconds:,.0f}"
            orders["shardwise"] = np.asarray(ids)
            if label == "cold":
                fetched = f"{src.cache.fetched_bytes / parquet_bytes:.3f}"
        # A node cache of two windows (the 2 x window largest shards): each shard still fetched once.
        shard_bytes = np.sort(np.asarray(shardwise_source("cache-epoch").file_sizes))
        budget = int(shard_bytes[-2 * args.window :].sum())
        src = shardwise_source("cache-budget", budget)
        sampler = LocalitySampler(src, window=args.window, num_replicas=1, rank=0, seed=0)
        loader = DataLoader(src, sampler=sampler, batch_size=BATCH, collate_fn=list_collate)
        ids, seconds = timed((row for batch in loader for row in batch), lambda row: row["id"])
        rates[f"shardwise cold, cache budget {budget / parquet_bytes:.0%} of the data"] = f"{n / seconds:,.0f}"
        src.cache.close()
        budget_fetched = f"{src.cache.fetched_bytes / parquet_bytes:.3f} (budget {budget / parquet_bytes:.0%})"
        ids, seconds = timed(hf(0, 1), lambda row: row["id"])
        rates["HF datasets"] = f"{n / seconds:,.0f}"
        orders["HF datasets"] = np.asarray(ids)
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
        ids, seconds = timed(webdataset(0, 1).decode(), lambda row: row["cls"])
        os.environ.pop("RANK"), os.environ.pop("WORLD_SIZE")  # the ranks below (and LitData's) must not see them
        rates["WebDataset"] = f"{n / seconds:,.0f}"
        orders["WebDataset"] = np.asarray(ids)
        orders["uniform (ShardedSampler)"] = np.asarray(list(ShardedSampler(n, num_replicas=1, rank=0, seed=0)))
        for window in (1, 2, 4, 16):
            sampler = LocalitySampler(sizes, window=window, num_replicas=1, rank=0, seed=0)
            orders[f"shardwise window={window}"] = np.asarray(list(sampler))
        for name, order in orders.items():
            if sorted(order.tolist()) != list(range(n)):
                raise RuntimeError(f"{name} did not read every sample exactly once in one epoch")
            quality = shuffle_quality(order, shard_of)
            shown = name if name != "shardwise" else f"shardwise window={args.window}"
            rows.append(("same-shard pairs / mean |id step|/n / Spearman", shown,
                         f"{quality['same_shard']:.3f} / {quality['id_step']:.3f} / {quality['spearman']:+.3f}"))
        for name, rate in rates.items():
            rows.append(("samples/s, one rank, num_workers=0", name, rate))
        rows.append(("bytes fetched / dataset (one epoch, cold)", "shardwise", fetched))
        rows.append(("bytes fetched / dataset (one epoch, cold, two-window budget)", "shardwise", budget_fetched))

        if not args.no_ranks:
            spec = {"urls": parquet_urls, "tar_urls": tar_urls, "options": options, "hf_options": hf_options,
                    "root": str(root), "window": args.window, "batch": BATCH, "workers": 2, "endpoint": endpoint}
            loaders = available(args.loaders.split(","))
            rows.extend(scratch_setup(spec, loaders, root, fs, sizes, args.window, shard_of, quality_text))
            rows.extend(rank_figures(spec, n, loaders, shard_of))

    rows.extend(scale_rows)
    width = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    print(f"| {'figure':<{width[0]}} | {'loader':<{width[1]}} | value |")
    print(f"|{'-' * (width[0] + 2)}|{'-' * (width[1] + 2)}|-------|")
    for figure, name, value in rows:
        print(f"| {figure:<{width[0]}} | {name:<{width[1]}} | {value} |")


if __name__ == "__main__":
    main()
