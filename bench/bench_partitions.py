"""Shard partitions over S3: bytes each simulated node fetches per epoch, and the shuffle's quality, vs one partition.

Parquet shards (uneven counts) are served by moto's S3 server on 127.0.0.1 (``tests/s3_server.py``).
Several nodes are simulated on this machine: ``nodes * G`` ranks (``G = 2`` ranks a node, torchrun's
numbering: node ``k`` holds ranks ``kG .. kG + G - 1``), run rank after rank in this process, each
with its own ``ShardedSource`` and explicit ``num_replicas``/``rank``, and the ``ShardCache``
directory of its node (shared by the node's ranks, no byte budget, so the order in which ranks run
does not change what a node fetches). Every rank reads every sample of its epoch (``source[i]``),
with the plan's prefetch on.

Baseline: ``LocalitySampler(partitions=1)`` at the same world size (today's plan; every node reads
every window). ``drop_last=False`` pads the epoch's last step by wrapping within the partition
(NOTE [ Padding wrap ] in ``shardwise._core.plan``: before it wrapped to the plan's start, which
read one sample of another partition a rank, a whole shard fetched for it: 1.71x a node's share at
W=8); ``drop_last=True`` is shown too. Figures:

- bytes per node per epoch / the node's share (``share`` = dataset bytes x the node's samples / n),
  the worst node, for epoch 0 and then epoch 1 with the caches kept (a fixed layout fetches nothing more);
- shuffle quality against partitions=1 and a uniform permutation, of the global plan (all
  positions) and of rank 0's order: consecutive same-shard pairs, mean |id difference| / n,
  |position-id rank correlation|, each the mean over 10 epochs;
- scale: private memory (smaps_rollup Anonymous) and build time of a ``LocalitySampler`` with
  ``partitions=8, ranks_per_partition=8`` at 1e9 samples in 1e5 shards, in a fresh process.

Run: ``python -m bench.bench_partitions``; ``--quick``: 2,003 samples in 13 shards, 2 partitions, no scale
probe (a smoke test).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._lib.common import ROOT, module_command, shuffle_quality, uneven_sizes

G = 2  # ranks per node


EPOCHS = 10  # shuffle figures are averaged over this many epochs (one epoch's shard order is one draw)


def mean_quality(sampler: Any, n: int, world: int, shard_of: np.ndarray) -> dict[str, float]:
    """Shuffle figures of rank 0's order at ``world`` ranks (1: the global plan), mean of EPOCHS epochs."""
    found = []
    for epoch in range(EPOCHS):
        plan = sampler.permutation(epoch)
        found.append(shuffle_quality(plan(np.arange(0, n, world)), shard_of))
    return {k: float(np.mean([abs(q[k]) for q in found])) for k in found[0]}


def shown(quality: dict[str, float]) -> str:
    return f"{quality['same_shard']:.3f} / {quality['id_step']:.3f} / {quality['spearman']:.3f}"


def write_shards(root: Path, n: int, shards: int, seed: int) -> np.ndarray:
    """Parquet shards of ``n`` samples (id, 100-500 int32 tokens) in ``shards`` uneven shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sizes = uneven_sizes(n, shards, seed)
    rng = np.random.default_rng(seed + 1)
    first = 0
    for s, size in enumerate(sizes.tolist()):
        ids = np.arange(first, first + size)
        tokens = [rng.integers(0, 50_000, size=int(rng.integers(100, 500)), dtype=np.int32) for _ in ids]
        table = pa.table({"id": ids, "tokens": pa.array(tokens, type=pa.list_(pa.int32()))})
        pq.write_table(table, root / f"train-{s:03d}.parquet", row_group_size=256)
        first += size
    return sizes


def scale_probe() -> None:
    """Private memory, build time and draws/s of a LocalitySampler at 1e9 samples in 1e5 shards.

    ``--scale-probe PARTITIONS [MIXING]`` (``bench_shuffle_locality.py`` runs it with each mixing).
    """
    from bench._lib.common import smaps_rollup
    from shardwise import LocalitySampler

    before = smaps_rollup()["Anonymous"]
    sizes = np.random.default_rng(0).integers(5_000, 15_001, size=100_000)  # ~1e9 samples, uneven
    start = time.perf_counter()
    at = sys.argv.index("--scale-probe")
    partitions = int(sys.argv[at + 1])
    mixing = sys.argv[at + 2] if len(sys.argv) > at + 2 else "windows"
    sampler = LocalitySampler(sizes, window=8, mixing=mixing, partitions=partitions, ranks_per_partition=8,
                              num_replicas=64, rank=9, seed=0)  # fmt: skip
    units = iter(sampler)
    next(units)
    built = time.perf_counter() - start
    start = time.perf_counter()
    drawn = 1 + sum(1 for _, _ in zip(range(999_999), units, strict=False))
    seconds = time.perf_counter() - start
    grown = smaps_rollup()["Anonymous"] - before
    print(f"SCALE {int(sizes.sum())} {built:.3f} {drawn / seconds:.0f} {grown}")


def run_nodes(endpoint: str, urls: list[str], index: Path, caches: Path, nodes: int, partitions: int,
              window: int, epochs: int, drop_last: bool) -> list[list[int]]:  # fmt: skip
    """Bytes fetched by each node in each epoch: ``fetched[epoch][node]``."""
    from tests.s3_server import storage_options

    from shardwise import LocalitySampler, ShardCache, ShardedSource

    world = nodes * G
    sources, samplers = [], []
    for rank in range(world):
        directory = caches / f"P{partitions}-{drop_last}-node{rank // G}"
        cache = ShardCache(directory, storage_options=storage_options(endpoint))
        source = ShardedSource(urls, cache=cache, index_dir=index)
        sources.append(source)
        samplers.append(LocalitySampler(source, window=window, partitions=partitions, ranks_per_partition=G,
                                        num_replicas=world, rank=rank, seed=0, drop_last=drop_last))  # fmt: skip
    fetched = []
    for epoch in range(epochs):
        before = [s.cache.fetched_bytes for s in sources]
        for source, sampler in zip(sources, samplers, strict=True):
            sampler.set_epoch(epoch)
            for i in sampler:
                source[i]
            source.cache.close()  # the prefetch thread ends what it queued: counted in this epoch
        grown = [s.cache.fetched_bytes - b for s, b in zip(sources, before, strict=True)]
        fetched.append([sum(grown[k * G : (k + 1) * G]) for k in range(nodes)])
    return fetched


def main() -> None:
    if "--scale-probe" in sys.argv:
        scale_probe()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_003)
    parser.add_argument("--shards", type=int, default=37)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke-sized run: 2,003 samples in 13 shards, 2 partitions, no scale probe")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.shards = 2_003, 13

    probes = {} if args.quick else {
        p: subprocess.run(module_command("bench.bench_partitions", "--scale-probe", str(p)), cwd=ROOT,
                          capture_output=True, text=True, check=True, timeout=600).stdout.split("SCALE ")[1].split()
        for p in (1, 8)}  # fmt: skip
    from tests.s3_server import make_bucket, s3_endpoint, storage_options

    from shardwise import LocalitySampler, ShardCache, ShardedSource

    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp, s3_endpoint() as endpoint:
        root = Path(tmp)
        (root / "shards").mkdir()
        sizes = write_shards(root / "shards", args.samples, args.shards, seed=0)
        n = int(sizes.sum())
        shard_of = np.repeat(np.arange(len(sizes)), sizes)
        fs = make_bucket(endpoint, "bench")
        fs.put(str(root / "shards") + "/", "bench/train/", recursive=True)
        urls = [f"s3://bench/train/train-{s:03d}.parquet" for s in range(len(sizes))]
        index = root / "index"
        probe_source = ShardedSource(urls, cache=ShardCache(root / "probe", storage_options=storage_options(endpoint)),
                                     index_dir=index)  # fmt: skip
        total = int(probe_source.file_sizes.sum())
        print(f"{n} samples in {len(sizes)} shards ({sizes.min()}-{sizes.max()} a shard), {total / 2**20:.1f} MiB, "
              f"window={args.window}, G={G} ranks a node")  # fmt: skip
        uniforms = [shuffle_quality(np.random.default_rng(e).permutation(n), shard_of) for e in range(EPOCHS)]
        uniform = {k: float(np.mean([abs(q[k]) for q in uniforms])) for k in uniforms[0]}
        for partitions in (2,) if args.quick else (2, 4):
            nodes = partitions
            for p, drop_last in ((1, False), (partitions, False), (partitions, True)):
                fetched = run_nodes(endpoint, urls, index, root / "caches", nodes, p, args.window, 2, drop_last)
                sampler = LocalitySampler(sizes, window=args.window, partitions=p, ranks_per_partition=G,
                                          num_replicas=1, rank=0, seed=0)  # fmt: skip
                quality = mean_quality(sampler, n, 1, shard_of)
                local = mean_quality(sampler, n, nodes * G, shard_of)
                layout = sampler.partition_layout()
                counts = np.full(nodes, n / nodes) if layout is None else layout.quotas
                share = total * np.asarray(counts, dtype=np.float64) / n
                worst = max(f / s for f, s in zip(fetched[0], share, strict=True))
                label = f"W={nodes * G} ({nodes} nodes), partitions={p}, drop_last={drop_last}"
                rows.append((label, f"{worst:.3f}", f"{max(fetched[1]) / 2**20:.2f} MiB", shown(quality), shown(local)))
        rows.append(("uniform permutation (reference)", "", "", shown(uniform), ""))

    print()
    print(f"Shuffle figures: mean of epochs 0-{EPOCHS - 1}.")
    print("| run | bytes/node/epoch over node share (worst node, epoch 0) | bytes fetched by the worst node in epoch 1 "
          "| global plan: same-shard pairs / mean abs id step over n / abs Spearman(position, id) "
          "| rank 0's order, same figures |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    for p, probe in probes.items():
        print(f"Scale (fresh process): LocalitySampler(partitions={p}, ranks_per_partition=8, window=8), rank 9 of 64, "
              f"over {int(probe[0]):,} samples in 1e5 shards: first index after {float(probe[1]):.2f} s, "
              f"{int(probe[2]):,} indices/s, {int(probe[3]) / 2**20:.1f} MiB private memory added.")


if __name__ == "__main__":
    main()
