"""How the node cache downloads a shard from S3: ways to copy one object to a local file, side by side.

37 objects of 1 MB (the bench's mean Parquet shard) on moto's S3 server on 127.0.0.1
(``tests/s3_server.py``), copied one after the other to local files, in one process, each way in
turn, for ``--rounds`` rounds (interleaved, so that a slow moment of this shared machine falls on
all of them):

- ``open + read``: ``fs.open(url)`` read in 4 MiB blocks (the cache's way before this bench);
- ``get_file``: ``fs.get_file(url, path)`` (the cache's way now);
- ``cat_file``: ``fs.cat_file(url)`` written out;
- ``boto3``: ``get_object`` through boto3 (what s3fs runs on, without fsspec);
- ``ShardCache.path``: the whole cache path (lock, get_file, size check, fsync, rename), fresh cache.

Prints ms per shard (median over rounds) and the ratio to ``open + read``.

Then the prefetch threads (``ShardCache(prefetch_threads=k)``): one cache follows a plan of all
the shards, and the seconds until every shard is in it are timed, for k = 1, 2, 4, 8 in turn
(interleaved over the rounds, a fresh cache each time), against servers that answer each request
after 0, 30 and 100 ms (``s3_endpoint(latency=...)``: a sleep, as a real store's time to a first
byte). Prints the median seconds, MB/s and the ratio to one thread. ``--prefetch-only`` skips the
first table.

Run: ``python -m bench.bench_download``; ``--quick``: 8 shards, one round (a smoke test).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

BUCKET = "downloads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=37)
    parser.add_argument("--bytes", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefetch-only", action="store_true", help="only the prefetch threads' table")
    parser.add_argument("--quick", action="store_true", help="a smoke-sized run: 8 shards, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.shards, args.rounds = 8, 1
    if not args.prefetch_only:
        copy_table(args)
    prefetch_table(args)


def _put_shards(endpoint: str, shards: int, size: int) -> list[str]:
    from tests.s3_server import make_bucket

    fs = make_bucket(endpoint, BUCKET)
    rng = np.random.default_rng(0)
    urls = []
    for s in range(shards):
        fs.pipe(f"{BUCKET}/shard-{s}.bin", rng.bytes(size))
        urls.append(f"s3://{BUCKET}/shard-{s}.bin")
    return urls


def prefetch_table(args: argparse.Namespace) -> None:
    """Seconds until a cache following a plan of every shard holds them all, by prefetch threads and latency."""
    from tests.s3_server import s3_endpoint, storage_options

    from shardwise.data.sharded import ShardCache

    threads = (1, 2, 4, 8)
    print(f"\n{args.shards} objects of {args.bytes:,} bytes, one ShardCache following them all; "
          f"median of {args.rounds}")
    print("| latency a request | prefetch_threads | s until all arrived | MB/s | / 1 thread |")
    print("|---|---|---|---|---|")
    for latency in (0.0, 0.03, 0.1):
        with tempfile.TemporaryDirectory() as tmp, s3_endpoint(latency) as endpoint:
            urls = _put_shards(endpoint, args.shards, args.bytes)
            shards = [(url, args.bytes, None) for url in urls]
            times: dict[int, list[float]] = {k: [] for k in threads}
            for round_ in range(args.rounds):
                for k in threads:
                    cache = ShardCache(Path(tmp) / f"cache-{round_}-{k}", prefetch_threads=k,
                                       storage_options=storage_options(endpoint))  # fmt: skip
                    names = [cache.directory / cache.name(url) for url in urls]
                    began = time.perf_counter()
                    cache.follow(shards)
                    deadline = began + 120
                    while not all(name.exists() for name in names):
                        if time.perf_counter() > deadline:
                            raise TimeoutError(f"prefetch_threads={k}: not every shard arrived within 120 s")
                        time.sleep(0.002)
                    times[k].append(time.perf_counter() - began)
                    cache.close()
            base = statistics.median(times[1])
            for k in threads:
                median = statistics.median(times[k])
                print(f"| {latency * 1e3:g} ms | {k} | {median:.2f} | {args.shards * args.bytes / median / 1e6:.0f} | "
                      f"{median / base:.2f} |")


def copy_table(args: argparse.Namespace) -> None:
    """ms a shard for each way of copying one object to a local file."""
    import boto3
    import fsspec
    from tests.s3_server import CREDENTIALS, s3_endpoint, storage_options

    from shardwise.data.sharded import ShardCache

    with tempfile.TemporaryDirectory() as tmp, s3_endpoint() as endpoint:
        urls = _put_shards(endpoint, args.shards, args.bytes)
        s3 = fsspec.filesystem("s3", **storage_options(endpoint))
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

        def read_loop(url: str, out: str) -> None:
            with s3.open(url, "rb") as source, open(out, "wb") as target:
                while block := source.read(4 << 20):
                    target.write(block)

        def cat_file(url: str, out: str) -> None:
            with open(out, "wb") as target:
                target.write(s3.cat_file(url))

        def boto(url: str, out: str) -> None:
            body = client.get_object(Bucket=BUCKET, Key=url.split("/", 3)[3])["Body"].read()
            with open(out, "wb") as target:
                target.write(body)

        ways: dict[str, Callable[[str, str], object]] = {
            "open + read": read_loop, "get_file": s3.get_file, "cat_file": cat_file, "boto3": boto,
        }
        times: dict[str, list[float]] = {name: [] for name in [*ways, "ShardCache.path"]}
        for round_ in range(args.rounds):
            for name, copy in ways.items():
                began = time.perf_counter()
                for i, url in enumerate(urls):
                    copy(url, os.path.join(tmp, f"{name}-{round_}-{i}"))
                times[name].append((time.perf_counter() - began) / len(urls))
            cache = ShardCache(Path(tmp) / f"cache-{round_}", storage_options=storage_options(endpoint))
            began = time.perf_counter()
            for url in urls:
                cache.path(url, args.bytes)
            times["ShardCache.path"].append((time.perf_counter() - began) / len(urls))

    base = statistics.median(times["open + read"])
    print(f"{args.shards} objects of {args.bytes:,} bytes on moto S3, one at a time; median of {args.rounds} rounds")
    print("| way | ms a shard | / open + read |")
    print("|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1e3:.1f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
