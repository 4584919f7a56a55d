"""Sharded data on S3: the in-memory floor, the shuffle by layout, shardwise beside HF datasets, WebDataset and others.

Every run (``--quick`` too), on moto's S3 server on 127.0.0.1 (``tests/s3_server.py``):

- **The in-memory floor** (``sharded_figures.floor_rows``): rank 0 of W=2 real gloo ranks, 2
  forked DataLoader workers each, batch 32, reads one epoch cold (an empty node cache) and one
  warm, with ``ShardedSource`` + ``LocalitySampler`` (defaults; rows as numpy) over 41 uneven
  Parquet shards (row groups of 256) of ``--floor-samples`` samples of 100-499 int32 tokens. The
  floor is torch's ``DistributedSampler`` over the same rows held in memory, same loader, same
  run; each epoch starts on both ranks at once. Printed: shardwise's epoch as a fraction of the
  floor's (seconds, start-up included), both epochs' seconds and the seconds to the first batch.
  ``--floor-format arrow``: the same rows as uncompressed Arrow IPC shards, which need no decode;
  ``--floor-format local``: the Parquet shards read from local disk (no S3); ``--decode worker``:
  ``ShardedSource(decode="worker")`` (each worker decodes each Parquet shard it opens).
  ``--bytes-repeat N``: the 4-ranks-a-node bytes figure N times more (min / median / max; the
  ranks race for the budget, so one run can miss what most runs show); ``--no-floor``: only those.
- **Bytes a node fetches** (``sharded_figures.bytes_rows``): 1, 2 and 4 ranks a node, 2 workers
  each, one cold epoch of a quarter of ``--floor-samples`` under the documented minimum budget, each
  rank at its own pace; then ``decode="worker"`` with the ranks in lockstep (a one-element
  all-reduce a step, as DDP's gradient sync holds them) at 2 and 4 ranks, and at its own pace at 4.
  Each with the requests the node sent per shard (``LIST`` / ``HEAD`` / ``GET``, start-up included,
  the index already built): what object storage bills and throttles.
- **The sampler** (``sharded_figures.sampler_rows``): its CPU a index in the main process, over a
  source that listens to the plan as ``ShardedSource`` does, over the counts alone, and torch's
  ``DistributedSampler``'s, in this process (rank 0 of W=2, batch 32, best of 5 epochs).
- **The shuffle by layout** (``sharded_figures.shuffle_rows``): one epoch's global order of the
  default plan, of the window plan (window 8, the default before plan 2) and of a uniform
  shuffle, on 41 even shards, 41 shards cut at uniform random points and 53 shards spread 1:1000:
  consecutive samples from one shard, mean |id step| over n, and the pairs over a uniform shuffle's.

The rest (not with ``--quick``): the same samples as Parquet shards (shardwise, HF datasets) and
WebDataset tars, ``--samples`` in ``--shards`` uneven shards, each loader used as its documentation
says:

- shardwise: ``ShardedSource(s3 URLs)`` + ``LocalitySampler`` in a ``DataLoader`` (``shardwise-streams``:
  ``mixing="streams"``, the default; ``shardwise-worker``: ``decode="worker"``, each DataLoader worker
  decoding the Parquet shards it reads; ``shardwise-1thread``: ``ShardCache(prefetch_threads=1)``);
- HF datasets: ``load_dataset("parquet", streaming=True)`` + ``.shuffle(buffer_size=1000)`` +
  ``split_dataset_by_node``;
- WebDataset: ``WebDataset(presigned http URLs, nodesplitter=split_by_node, shardshuffle=100).shuffle(1000)``.

Figures in process (ranks simulated by ``RANK``/``WORLD_SIZE`` or explicit rank arguments): steps
per rank (min/max) at W = 3 and 4 (batch 32); the shuffle of one epoch's order; samples/s of one
rank with ``num_workers=0``, cold and warm; bytes shardwise fetched over the dataset's size.
Figures with ranks as real processes, 2 forked workers each (``rank_figures``, ``rank_loop``):
steps per rank at W=3; samples lost and repeated when W=3 ranks stop 40% into the epoch and resume
at W=3 and at W=2, each loader resumed its documented way; samples/s per rank, cold and warm; the
seconds to the first batch and of the whole epoch; peak anonymous memory (``Pss_Anon``) of a rank
plus its workers; the shuffle of the order the W=3 ranks read, step by step.

LitData and MosaicML Streaming join these when their scratch venvs exist (``scratch_venvs``: the
interpreter ``$SHARDWISE_LITDATA_PYTHON``, else ``<temporary folder>/scratch-venv/bin/python``, and
``$SHARDWISE_STREAMING_PYTHON``, else ``<temporary folder>/scratch-venv-streaming/bin/python``;
``litdata_venv.py`` and ``streaming_venv.py`` run there). Streaming reads the same rows as MDS
shards of about the mean shard's bytes with ``StreamingDataset(shuffle_algo="py1e")``, three rows:
its defaults; ``cache_limit`` = the bytes of the window's largest MDS shards; and that with
``shuffle_block_size`` = the window's samples. It imports torchvision, which PyPI ships for
another torch than this repository's, so its venv has torch 2.14.1 (CPU use)::

    python3 -m venv "$TMPDIR/scratch-venv-streaming"
    "$TMPDIR/scratch-venv-streaming/bin/pip" install --no-deps mosaicml-streaming==0.13.0
    "$TMPDIR/scratch-venv-streaming/bin/pip" install torch==2.14.1 torchvision==0.29.1 'numpy<2.2' \\
        boto3 zstd xxhash python-snappy Brotli tqdm 'transformers<5' catalogue pyarrow

Either venv missing: that loader is left out with one printed line.

Run: ``python -m bench.bench_sharded_sources`` (~15 min on 2 cores); ``--quick``: the floor at
20,000 samples, one round, and the shuffle (< 1 min).
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

from bench._lib.common import ROOT, module_command, shuffle_quality, uneven_sizes
from bench._lib.rank_figures import NAMES, launch, quality_text, rank_figures
from bench._lib.scratch_venvs import available, scratch_setup
from bench._lib.sharded_figures import bytes_rows, bytes_spread, floor_rows, sampler_rows, shuffle_rows

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

    from bench._lib.common import smaps_rollup
    from shardwise import LocalitySampler

    before = smaps_rollup()["Anonymous"]
    sizes = np.full(100_000, 10_000, dtype=np.int64)  # 1e9 samples
    sampler = LocalitySampler(sizes, window=8, num_replicas=8, rank=3, seed=0)
    start = time.perf_counter()
    drawn = sum(1 for _ in itertools.islice(iter(sampler), 1_000_000))
    seconds = time.perf_counter() - start
    grown = smaps_rollup()["Anonymous"] - before
    print(f"SCALE {drawn} {seconds:.3f} {grown}")


def main() -> None:
    if "--scale-probe" in sys.argv:
        scale_probe()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke-sized run (< 2 min): the shuffle by layout and the in-memory floor at "
                             "20,000 samples, one round; no loader comparison")
    parser.add_argument("--samples", type=int, default=6_000)
    parser.add_argument("--shards", type=int, default=37)
    parser.add_argument("--window", type=int, default=None,
                        help="LocalitySampler window (shards mixed together; default: the sampler's)")
    parser.add_argument("--floor-samples", type=int, default=None,
                        help="samples of the in-memory floor figures, in 41 uneven shards (default 200,000; quick: "
                             "20,000)")
    parser.add_argument("--floor-format", choices=("parquet", "arrow", "local"), default="parquet",
                        help="the floor figures' shards: Parquet on S3, the same rows as Arrow IPC files on S3 (no "
                             "decode: what the decode costs a cold epoch), or the Parquet files on local disk")
    parser.add_argument("--decode", choices=("node", "worker"), default="node",
                        help="ShardedSource(decode=) of the floor figures: Parquet decoded once a node, or by each "
                             "worker for each shard it opens")
    parser.add_argument("--bytes-repeat", type=int, default=1,
                        help="runs of the 4-ranks-a-node bytes figure (its spread: the ranks race for the budget)")
    parser.add_argument("--no-floor", action="store_true", help="skip the in-memory floor (the bytes figures only)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the floor figures, each the floor then shardwise (default 2; quick: 1)")
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
    args.floor_samples = args.floor_samples or (20_000 if args.quick else 200_000)
    args.rounds = args.rounds or (1 if args.quick else 2)
    print(f"bench_sharded_sources.py {' '.join(sys.argv[1:])}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows: list[tuple[str, str, str]] = shuffle_rows(args.floor_samples, args.window)
    rows.extend(sampler_rows(args.floor_samples, 41))
    from tests.s3_server import Gauge

    gauge = Gauge()
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp, s3_server(args.latency, gauge) as endpoint:
        from tests.s3_server import make_bucket, storage_options

        spec = {"root": tmp, "options": storage_options(endpoint), "window": args.window, "batch": BATCH,
                "workers": 2, "endpoint": endpoint}
        fs = make_bucket(endpoint, "bench")
        if not args.no_floor:
            rows.extend(floor_rows({**spec, "decode": args.decode}, fs, args.floor_samples, 41, args.rounds, launch,
                                   args.floor_format))
        rows.extend(bytes_rows(spec, fs, gauge, args.floor_samples // 4, 41, launch))
        # decode="worker": the ranks stepping together as in training, then each at its own pace (they drift apart)
        for name, extra, counts in (("worker-lockstep", {"lockstep": True}, (2, 4)), ("worker-own-pace", {}, (4,))):
            (Path(tmp) / name).mkdir()
            rows.extend(bytes_rows({**spec, **extra, "decode": "worker", "root": str(Path(tmp) / name)}, fs, gauge,
                                   args.floor_samples // 4, 41, launch, ranks=counts))
        if args.bytes_repeat > 1:
            rows.append(bytes_spread(spec, fs, gauge, args.floor_samples // 4, 41, launch, args.bytes_repeat))
    if args.quick:
        print_table(rows)
        return
    rows.extend(compare(args))
    print_table(rows)


def print_table(rows: list[tuple[str, str, str]]) -> None:
    width = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    print(f"| {'figure':<{width[0]}} | {'loader':<{width[1]}} | value |")
    print(f"|{'-' * (width[0] + 2)}|{'-' * (width[1] + 2)}|-------|")
    for figure, name, value in rows:
        print(f"| {figure:<{width[0]}} | {name:<{width[1]}} | {value} |")


def s3_server(latency: float, gauge: Any = None) -> Any:
    from tests.s3_server import s3_endpoint

    return s3_endpoint(latency, gauge)


def compare(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The loaders side by side (the module docstring): steps, shuffle, rates, bytes, ranks, resume, scale."""
    import subprocess

    window = args.window or 10  # LocalitySampler's default
    probe = subprocess.run(module_command("bench.bench_sharded_sources", "--scale-probe"), cwd=ROOT,
                           capture_output=True, text=True, check=True, timeout=600).stdout.split("SCALE ")[1].split()
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
            ours = [steps(len(LocalitySampler(source, window=window, num_replicas=world_size, rank=r)))
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
            sampler = LocalitySampler(src, window=window, num_replicas=1, rank=0, seed=0)
            loader = DataLoader(src, sampler=sampler, batch_size=BATCH, collate_fn=list_collate)
            ids, seconds = timed((row for batch in loader for row in batch), lambda row: row["id"])
            rates[f"shardwise {label}"] = f"{n / seconds:,.0f}"
            orders["shardwise"] = np.asarray(ids)
            if label == "cold":
                fetched = f"{src.cache.fetched_bytes / parquet_bytes:.3f}"
        # A node cache of two windows (the 2 x window largest shards): each shard still fetched once.
        shard_bytes = np.sort(np.asarray(shardwise_source("cache-epoch").file_sizes))
        budget = int(shard_bytes[-2 * window :].sum())
        src = shardwise_source("cache-budget", budget)
        sampler = LocalitySampler(src, window=window, num_replicas=1, rank=0, seed=0)
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
        for mixed in (1, 2, 4, 16):
            sampler = LocalitySampler(sizes, window=mixed, num_replicas=1, rank=0, seed=0)
            orders[f"shardwise window={mixed}"] = np.asarray(list(sampler))
        for name, order in orders.items():
            if sorted(order.tolist()) != list(range(n)):
                raise RuntimeError(f"{name} did not read every sample exactly once in one epoch")
            quality = shuffle_quality(order, shard_of)
            shown = name if name != "shardwise" else f"shardwise window={window}"
            rows.append(("same-shard pairs / mean |id step|/n / Spearman", shown,
                         f"{quality['same_shard']:.3f} / {quality['id_step']:.3f} / {quality['spearman']:+.3f}"))
        for name, rate in rates.items():
            rows.append(("samples/s, one rank, num_workers=0", name, rate))
        rows.append(("bytes fetched / dataset (one epoch, cold)", "shardwise", fetched))
        rows.append(("bytes fetched / dataset (one epoch, cold, two-window budget)", "shardwise", budget_fetched))

        if not args.no_ranks:
            spec = {"urls": parquet_urls, "tar_urls": tar_urls, "options": options, "hf_options": hf_options,
                    "root": str(root), "window": window, "batch": BATCH, "workers": 2, "endpoint": endpoint}
            loaders = available(args.loaders.split(","))
            rows.extend(scratch_setup(spec, loaders, root, fs, sizes, window, shard_of, quality_text))
            rows.extend(rank_figures(spec, n, loaders, shard_of))

    rows.extend(scale_rows)
    return rows

if __name__ == "__main__":
    main()
