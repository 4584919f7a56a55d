"""The figures of issue 30's targets, for ``bench_sharded_sources.py``: the in-memory floor and the shuffle by layout.

- ``floor_rows``: rank 0 of W=2 real gloo ranks, 2 forked DataLoader workers each, reads one epoch
  cold (an empty node cache) and one warm (the next epoch, the cache full) with ``ShardedSource`` +
  ``LocalitySampler`` (the defaults; rows as numpy) from the S3 endpoint; the floor, measured in the
  same run with the same loader, is torch's ``DistributedSampler`` over the same rows held in memory
  (``rank_loop.in_memory_rows``). The fraction is the floor's epoch seconds over shardwise's, start-up
  included (iter(loader) to the last batch); the seconds to the first batch are shown apart. Where the
  ranks report their CPU seconds an epoch (``cpu_cold``, ``cpu_warm``: the rank and its workers),
  those and their fraction are shown too (wall seconds move with the machine's other load), and
  the CPU seconds this process (moto's server) spent while shardwise's ranks ran.
- ``shuffle_rows``: one epoch's global order (the same at every world size) of the default plan,
  of the window plan (``mixing="windows"``, the default before plan 2) and of a uniform shuffle, on
  even shards, on uniform random cuts (``common.uneven_sizes``) and on sizes spread 1:1000
  (log-uniform): consecutive samples from one shard and mean |id step| / n (uniform: 1/3).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._lib.common import shuffle_quality, uneven_sizes

EPOCHS = 2  # orders averaged per shuffle figure
BATCH = 32  # the loaders' batch (bench_sharded_sources.BATCH)


def spread_sizes(n: int, shards: int, spread: float = 1000.0, seed: int = 0) -> np.ndarray:
    """``shards`` shard sizes spread ``1:spread`` (log-uniform), about ``n`` samples in all."""
    scale = np.exp(np.random.default_rng(seed).uniform(0, np.log(spread), shards))
    sizes: np.ndarray = np.maximum(1, (scale / scale.sum() * n).astype(np.int64))
    return sizes


def shuffle_rows(n: int, window: int | None) -> list[tuple[str, str, str]]:
    """Same-shard pairs / mean |id step| / n of the default plan, the window plan and a uniform order, by layout."""
    from shardwise import LocalitySampler

    layouts = {"41 even shards": np.full(41, n // 41, dtype=np.int64), "41 shards, random cuts": uneven_sizes(n, 41),
               "53 shards spread 1:1000": spread_sizes(n, 53)}
    plan = {} if window is None else {"window": window}
    rows = []
    for layout, sizes in layouts.items():
        shard_of = np.repeat(np.arange(len(sizes)), sizes)
        total = int(sizes.sum())
        orders: dict[str, list[np.ndarray]] = {"uniform": [], "shardwise default": [], "windows, window=8": []}
        for epoch in range(EPOCHS):
            orders["uniform"].append(np.random.default_rng(epoch).permutation(total))
            for name, options in (("shardwise default", plan),
                                  ("windows, window=8", {"window": 8, "mixing": "windows"})):
                sampler = LocalitySampler(sizes, num_replicas=1, rank=0, seed=0, **options)
                sampler.set_epoch(epoch)
                orders[name].append(np.fromiter(sampler, dtype=np.int64, count=len(sampler)))
        uniform = np.mean([shuffle_quality(order, shard_of)["same_shard"] for order in orders["uniform"]])
        for name, found in orders.items():
            same = np.mean([shuffle_quality(order, shard_of)["same_shard"] for order in found])
            step = np.mean([shuffle_quality(order, shard_of)["id_step"] for order in found])
            rows.append((f"same-shard pairs / mean |id step|/n / x uniform's pairs, {layout}", name,
                         f"{same:.3f} / {step:.3f} / {same / uniform:.2f}x"))
    return rows


def write_floor_shards(root: Path, n: int, shards: int) -> list[Path]:
    """Parquet shards of ``n`` samples (id, 100-499 int32 tokens; row groups of 256) in ``shards`` uneven shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    paths, first = [], 0
    for s, size in enumerate(uneven_sizes(n, shards).tolist()):
        lengths = rng.integers(100, 500, size=size)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = pa.array(rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.int32))
        tokens = pa.ListArray.from_arrays(pa.array(offsets), values)
        paths.append(root / f"floor-{s:03d}.parquet")
        pq.write_table(pa.table({"id": np.arange(first, first + size), "tokens": tokens}), paths[-1],
                       row_group_size=256)
        first += size
    return paths


def as_arrow(paths: list[Path]) -> list[Path]:
    """An uncompressed Arrow IPC file (one record batch) of each Parquet shard, beside it: the same rows, no decode."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrows = []
    for path in paths:
        table = pq.read_table(path).combine_chunks()
        arrows.append(path.with_suffix(".arrow"))
        with pa.OSFile(str(arrows[-1]), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    return arrows


class _Listening:
    """Sample counts of uneven shards, and a source's ear for the plan (``follow_plan``) that does nothing."""

    def __init__(self, sizes: np.ndarray) -> None:
        self.shard_sizes = sizes

    def __len__(self) -> int:
        return int(self.shard_sizes.sum())

    def follow_plan(self, permutation: Any, positions: np.ndarray) -> None:
        pass


def sampler_rows(n: int, shards: int, epochs: int = 5) -> list[tuple[str, str, str]]:
    """The sampler's CPU a index in the main process (rank 0 of W=2, ``BatchSampler(32)``, best of ``epochs``):
    ``LocalitySampler`` over a listening source (what a ``ShardedSource`` is to it) and over the counts alone,
    against torch's ``DistributedSampler`` over ``n`` samples."""
    from torch.utils.data import BatchSampler, DistributedSampler

    from shardwise import LocalitySampler

    sizes = uneven_sizes(n, shards)
    samplers = {"shardwise, listening source": LocalitySampler(_Listening(sizes), seed=0, num_replicas=2, rank=0),
                "shardwise, counts alone": LocalitySampler(sizes, seed=0, num_replicas=2, rank=0),
                "DistributedSampler": DistributedSampler(range(n), num_replicas=2, rank=0, seed=0)}
    rows = []
    for name, sampler in samplers.items():
        best = math.inf
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            began = time.process_time()
            count = sum(len(batch) for batch in BatchSampler(sampler, BATCH, drop_last=False))
            best = min(best, time.process_time() - began)
        rows.append((f"sampler CPU a index in the main process, rank 0 of W=2, {n:,} samples in {shards} shards, "
                     f"BatchSampler({BATCH}), best of {epochs} epochs", name, f"{best / count * 1e6:.2f} us"))
    return rows


def floor_rows(spec: dict[str, Any], fs: Any, n: int, shards: int, rounds: int,
               launch: Any, fmt: str = "parquet") -> list[tuple[str, str, str]]:
    """Rank 0 of W=2 (2 workers): shardwise's cold and warm epochs as fractions of the in-memory floor, ``rounds`` x.

    ``launch(world_size, spec)``: the ranks' reports (``bench_sharded_sources.launch``). ``fmt``: the
    shards shardwise reads, ``"parquet"`` (on S3, decoded as ``spec["decode"]`` says), ``"arrow"`` (the
    same rows as uncompressed Arrow IPC files on S3, read as downloaded: what a cold epoch costs
    without the decode) or ``"local"`` (the Parquet files where they were written); the floor holds
    the same rows either way.
    """
    root = Path(spec["root"])
    paths = write_floor_shards(root / "floor", n, shards)
    served = as_arrow(paths) if fmt == "arrow" else paths
    urls = [str(p) for p in paths]
    if fmt != "local":
        for path in served:
            fs.put(str(path), f"bench/floor/{path.name}")
        urls = [f"s3://bench/floor/{p.name}" for p in served]
    base = {**spec, "urls": urls, "local_shards": [str(p) for p in paths], "warm": True, "memory_epoch": False}
    figures: dict[str, list[float]] = {}
    for round_ in range(rounds):  # interleaved: the floor, then shardwise from an empty cache
        floor = launch(2, {**base, "loader": "memory"})[0]
        served = time.process_time()  # this process's CPU while the ranks run: moto's server, mostly
        ours = launch(2, {**base, "loader": "shardwise", "cache": f"cache-floor-{fmt}-{round_}"})[0]
        figures.setdefault("server cpu", []).append(time.process_time() - served)
        for label in ("cold", "warm"):
            if f"cpu_{label}" in ours and f"cpu_{label}" in floor:  # ranks that report their CPU (rank_loop)
                figures.setdefault(f"cpu {label}", []).append(ours[f"cpu_{label}"])
                figures.setdefault(f"floor cpu {label}", []).append(floor[f"cpu_{label}"])
                figures.setdefault(f"cpu fraction {label}", []).append(floor[f"cpu_{label}"] / ours[f"cpu_{label}"])
            figures.setdefault(f"fraction {label}", []).append(floor[f"epoch_{label}"] / ours[f"epoch_{label}"])
            figures.setdefault(f"first {label}", []).append(ours[f"startup_{label}"])
            figures.setdefault(f"floor first {label}", []).append(floor[f"startup_{label}"])
            figures.setdefault(f"epoch {label}", []).append(ours[f"epoch_{label}"])
            figures.setdefault(f"floor epoch {label}", []).append(floor[f"epoch_{label}"])
    kind = {"parquet": "Parquet", "arrow": "Arrow IPC", "local": "local Parquet"}[fmt]
    decode = f", decode={spec['decode']!r}" if fmt != "arrow" and spec.get("decode", "node") != "node" else ""
    what = f"rank 0 of W=2, 2 workers, {n:,} samples in {shards} {kind} shards{decode}, {rounds} round(s)"

    def shown(key: str, form: str) -> str:
        values = figures[key]
        return (form.format(np.median(values)) + (f" ({form.format(min(values))}..{form.format(max(values))})"
                                                   if len(values) > 1 else ""))

    def side_by_side(figure: str, key: str) -> list[tuple[str, str, str]]:  # shardwise's, then the floor's
        return [(figure, "shardwise", shown(key, "{:.2f}")),
                (figure, "in-memory floor", shown(f"floor {key}", "{:.2f}"))]

    rows = []
    for label in ("cold", "warm"):
        rows.append((f"epoch, {label}: fraction of the in-memory floor (median, min..max), {what}", "shardwise",
                     shown(f"fraction {label}", "{:.2f}")))
        rows += side_by_side(f"epoch seconds, {label}, iter(loader) to the last batch", f"epoch {label}")
        rows += side_by_side(f"seconds to the first batch, {label}", f"first {label}")
        if f"cpu {label}" in figures:  # robust to the machine's other load, where the seconds are not
            rows += side_by_side(f"epoch CPU seconds, {label}, rank 0 + its workers", f"cpu {label}")
            rows.append((f"epoch, {label}: the floor's CPU over shardwise's (median, min..max)", "shardwise",
                         shown(f"cpu fraction {label}", "{:.2f}")))
    rows.append(("CPU seconds of the S3 server (this process) during shardwise's ranks, both epochs", "moto",
                 shown("server cpu", "{:.2f}")))
    return rows


def bytes_rows(spec: dict[str, Any], fs: Any, gauge: Any, n: int, shards: int, launch: Any,
               ranks: tuple[int, ...] = (1, 2, 4), kept_shards: int | None = None) -> list[tuple[str, str, str]]:
    """Bytes one node fetches in an epoch over the dataset's, ``ranks`` ranks a node (2 workers each), one cache.

    The cache's ``budget_bytes`` is the documented minimum: the ``window + 6`` largest shards as the
    cache keeps them (decoded; with ``decode="worker"``, the Parquet files), or the ``kept_shards``
    largest. Bytes are counted by the S3 server (``gauge.sent``: every GET body, the ranks' and their
    workers'), after the index is built, less the folder listings each rank reads at start-up (``gauge.listed``).
    ``spec["decode"]``: ``ShardedSource(decode=)``; ``spec["lockstep"]``: the ranks wait for each other
    after every step, as DDP's gradient all-reduce makes them (else each reads at its own pace, and
    they drift apart: a harder case for a shared cache, whose working set is then the shards of the
    slowest rank and of the fastest).
    """
    from shardwise import ShardCache, ShardedSource

    try:
        from shardwise.samplers.locality import WINDOW
    except ImportError:  # a release before plan 2 (window 8), measured side by side
        WINDOW = 8

    root = Path(spec["root"])
    paths = write_floor_shards(root / "bytes", n, shards)
    for path in paths:
        fs.put(str(path), f"bench/bytes/{path.name}")
    urls = [f"s3://bench/bytes/{p.name}" for p in paths]
    probe = ShardedSource(urls, cache=ShardCache(root / "probe-bytes", storage_options=spec["options"]),
                          index_dir=root / "index")
    if spec.get("decode", "node") == "node":
        for first in (np.cumsum(probe.shard_sizes) - probe.shard_sizes).tolist():
            probe[int(first)]  # every shard decoded once: the sizes the cache keeps
        kept = sorted(p.stat().st_size for p in (root / "probe-bytes").iterdir() if p.suffix == ".arrow")
    else:  # decode="worker": the cache keeps the Parquet files, whose sizes the index holds
        kept = sorted(probe.file_sizes.tolist())
    window = spec.get("window") or WINDOW
    count_kept = kept_shards or window + 6
    budget = int(sum(kept[-count_kept:]))
    total = int(probe.file_sizes.sum())
    rows = []
    pace = "the ranks in lockstep (an all-reduce a step)" if spec.get("lockstep") else "each rank at its own pace"
    for count in ranks:
        before, asked = gauge.sent - gauge.listed, dict(gauge.requests)
        launch(count, {**spec, "loader": "shardwise", "urls": urls, "cache": f"cache-bytes-{count}", "budget": budget,
                       "warm": False, "memory_epoch": False})
        setting = (f"{count} rank(s) a node, 2 workers each, decode={spec.get('decode', 'node')!r}, {pace}, budget = "
                   f"the {count_kept} largest kept shards ({budget / total:.0%} of the Parquet)")
        rows.append((f"bytes one node fetches in an epoch / the dataset, {setting}",
                     "shardwise", f"{(gauge.sent - gauge.listed - before) / total:.3f}"))
        rows.append(requests_row(gauge, asked, shards, f"one cold epoch, start-up included, {setting}"))
    return rows


def requests_row(gauge: Any, before: dict[str, int], shards: int, what: str) -> tuple[str, str, str]:
    """The requests the S3 server answered since ``before`` (``gauge.requests`` then), per shard of the node:
    what storage bills and throttles (``LIST``: a listing, a GET of the bucket)."""
    spent = {method: gauge.requests[method] - before.get(method, 0) for method in ("LIST", "HEAD", "GET")}
    return (f"requests one node sends per shard ({shards} shards): LIST / HEAD / GET, {what}", "shardwise",
            " / ".join(f"{spent[method] / shards:.2f}" for method in ("LIST", "HEAD", "GET")))


def bytes_spread(spec: dict[str, Any], fs: Any, gauge: Any, n: int, shards: int, launch: Any,
                 runs: int) -> tuple[str, str, str]:
    """:func:`bytes_rows` at 4 ranks a node, ``runs`` times (each its own cache): min / median / max, and the runs
    over 1.05."""
    root = Path(spec["root"])
    figures = []
    for run in range(runs):
        (root / f"spread-{run}").mkdir()
        row = bytes_rows({**spec, "root": str(root / f"spread-{run}")}, fs, gauge, n, shards, launch, ranks=(4,))[0]
        figures.append(float(row[2]))
    return (f"bytes one node fetches in an epoch / the dataset, 4 ranks a node, {runs} runs: min / median / max "
            "(runs over 1.05)", "shardwise",
            f"{min(figures):.3f} / {np.median(figures):.3f} / {max(figures):.3f} ({sum(f > 1.05 for f in figures)})")
