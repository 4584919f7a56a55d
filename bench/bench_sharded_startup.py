"""A ShardedSource's start-up on S3: the node's first (the index built) and every later one (the index checked).

moto's S3 server on 127.0.0.1 (``tests/s3_server.py``) answers every request after ``--latency``
seconds (real object stores: 10-100 ms to a first byte; moto on loopback: well under 1 ms). It
holds ``--shards`` small Parquet shards in one folder. Each phase runs in a fresh process, timed
from before ``ShardedSource(...)`` to after it (imports excluded):

- cold: an empty index cache: every shard's identity, then every footer read (``metadata.read_metadata``);
- warm: the same index cache (what every other rank of the node, and every restart, pays): the
  identities only (``metadata.stat_shards``).

Printed: seconds and the server's requests by method (``LIST``: a listing), for the code in this
checkout and, with ``--before SRC``, for another ``src`` directory side by side (``git archive
<commit> src | tar -x -C DIR``, then ``--before DIR/src``), with the ratio before/now.

Run: ``python -m bench.bench_sharded_startup --shards 400 --latency 0.02 --before before-abc1234/src`` (~1 min);
``--quick``: 40 shards, 5 ms a request.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
from shardwise.data.sharded import ShardCache, ShardedSource
spec = json.loads(sys.argv[1])
start = time.perf_counter()
source = ShardedSource(spec["urls"], cache=ShardCache(spec["cache"], storage_options=spec["options"]),
                       index_dir=spec["index"])
print(json.dumps({"seconds": time.perf_counter() - start, "samples": len(source)}))
"""


def phase(src: Path, spec: dict[str, Any], gauge: Any) -> dict[str, Any]:
    """One construction in a fresh process on the code in ``src``: its seconds and the requests it made."""
    before = dict(gauge.requests)
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode:
        raise RuntimeError(f"the start-up child failed:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    report["requests"] = {method: count - before.get(method, 0) for method, count in gauge.requests.items()
                          if count - before.get(method, 0)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke-sized run: 40 shards, 5 ms a request (~15 s)")
    parser.add_argument("--shards", type=int, default=None, help="shards in the folder (default 400; quick: 40)")
    parser.add_argument("--latency", type=float, default=None,
                        help="seconds before the server answers a request (default 0.02; quick: 0.005)")
    parser.add_argument("--before", type=Path, default=None, metavar="SRC", help="another src directory, side by side")
    args = parser.parse_args()
    args.shards = args.shards or (40 if args.quick else 400)
    args.latency = args.latency if args.latency is not None else (0.005 if args.quick else 0.02)
    if args.before is not None and not (args.before / "shardwise").is_dir():
        parser.error(f"--before {args.before}: no shardwise package in it")
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tests.s3_server import Gauge, make_bucket, s3_endpoint, storage_options

    print(f"bench_sharded_startup.py {' '.join(sys.argv[1:])}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    codes = {"now": ROOT / "src", **({"before": args.before.resolve()} if args.before is not None else {})}
    gauge = Gauge()
    rows: list[tuple[str, str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp, s3_endpoint(args.latency, gauge) as endpoint:
        fs = make_bucket(endpoint, "bench")
        local = Path(tmp) / "shards"
        local.mkdir()
        for s in range(args.shards):
            pq.write_table(pa.table({"id": list(range(10 * s, 10 * s + 10))}), local / f"{s:05d}.parquet")
        fs.put(str(local) + "/", "bench/startup/", recursive=True)
        urls = [f"s3://bench/startup/{s:05d}.parquet" for s in range(args.shards)]
        for name, src in codes.items():
            spec = {"urls": urls, "options": storage_options(endpoint), "cache": f"{tmp}/cache-{name}",
                    "index": f"{tmp}/index-{name}"}
            rows.append((name, "cold (index built)", phase(src, spec, gauge)))
            rows.append((name, "warm (index checked)", phase(src, spec, gauge)))
    print(f"\n{args.shards} shards in one folder, {args.latency * 1000:g} ms a request\n")
    print("| code | phase | seconds | requests | before / now |")
    print("|---|---|---|---|---|")
    seconds = {(name, what): report["seconds"] for name, what, report in rows}
    for name, what, report in rows:
        ratio = f"{seconds[('before', what)] / report['seconds']:.1f}x" if name == "now" and "before" in codes else ""
        requests = ", ".join(f"{count} {method}" for method, count in sorted(report["requests"].items()))
        print(f"| {name} | {what} | {report['seconds']:.2f} | {requests} | {ratio} |")


if __name__ == "__main__":
    main()
