"""Lengths of an HF Dataset of token lists, from the Arrow offsets, against Trainer's per-row path.

Run (alone on the machine: the figures are timings)::

    python -m bench.bench_arrow                  # 1e7 rows, old path at 1e5
    python -m bench.bench_arrow --rows 1000000 --old-rows 10000
    python -m bench.bench_arrow --quick          # 1e5 rows, old path at 1e3, one repeat (a smoke test)

A Dataset of ``--rows`` rows of int32 token lists (lengths drawn from WikiText-2's paragraph
lengths of 1..128 tokens) is written with ``save_to_disk`` (4 Arrow files) in the temporary folder (free space checked
first; kept for reruns, ``--clean`` deletes it) and opened with ``load_from_disk``, memory-mapped.
Every measurement runs in a fresh process (``--phase``), as a rank would:

- ``cold``: a fresh index cache; ``shardwise.column(dataset, "input_ids", kind="length")`` computes
  the lengths from the list offsets and caches them; then ``BucketBatchSampler(lengths,
  batch_size=8)`` builds (and caches) its length index, and ``PackedBatchSampler(lengths,
  max_len=2048, rows_per_batch=8)`` its own. This is rank 0 of a node.
- ``warm``: the same cache, another process: ranks 1..W-1 of the node open both entries.
- ``trainer``: ``default_train_sampler(dataset, TrainingArguments(train_sampling_strategy=
  "group_by_length"))`` of ``shardwise.integrations.transformers``, before (the per-row
  ``_lengths`` this change replaced, kept here verbatim as the baseline) and after, on
  ``--old-rows`` rows (a ``select`` of the first rows: the per-row path takes ~30-110 s per 1e6
  rows, so it is measured on fewer rows and its per-row time is given), cold cache;
  ``trainer-after``: the after arm alone at ``--rows``.

Memory: anonymous private memory (``RssAnon``; the mapped Arrow files and cache files are
file-backed) sampled every 2 ms by a thread, peak minus the level before the call (after
``load_from_disk`` and the imports).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._lib.common import DATA, add_data_argument, module_command, status_bytes, wikitext_lengths
from bench._lib.common import ROOT as REPO

ROOT = Path(tempfile.gettempdir()) / "shardwise-bench-arrow"
MIB = 1 << 20


class PeakAnon:
    """The peak of this process's RssAnon above its level at start, sampled by a thread."""

    def __init__(self) -> None:
        self.base = status_bytes("RssAnon")
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, status_bytes("RssAnon"))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_bytes("RssAnon"))
        return (self.peak - self.base) / MIB


def _write(folder: Path, rows: int, data: Path = DATA, shards: int = 4, batch: int = 1 << 20) -> None:
    """A Dataset of ``rows`` token lists (int32 zeros; only the offsets matter) as ``shards`` Arrow files.

    ``save_to_disk`` of a tiny Dataset of the same features gives the folder layout (state.json,
    dataset_info.json, the files' schema); its files are then rewritten a batch at a time, so
    writing 1e7 rows takes a few hundred MiB of memory, not the whole table.
    """
    import datasets
    import pyarrow as pa

    real = wikitext_lengths(data)
    real = real[(real > 0) & (real <= 128)]
    lengths = np.random.default_rng(0).choice(real, size=rows).astype(np.int32)
    datasets.disable_progress_bar()
    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))})
    tiny = datasets.Dataset.from_dict({"input_ids": [[1]] * shards}, features=features)
    tiny.save_to_disk(str(folder), num_shards=shards)
    state = json.loads((folder / "state.json").read_text())
    state["_fingerprint"] = f"bench-arrow-{rows}"
    (folder / "state.json").write_text(json.dumps(state))
    zeros = pa.array(np.zeros(int(lengths.max()) * batch, dtype=np.int32))
    bounds = np.linspace(0, rows, shards + 1).astype(np.int64)
    for shard, entry in enumerate(state["_data_files"]):
        path = folder / entry["filename"]
        with pa.memory_map(str(path)) as source:
            schema = pa.ipc.open_stream(source).schema
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for start in range(int(bounds[shard]), int(bounds[shard + 1]), batch):
                part = lengths[start : min(start + batch, int(bounds[shard + 1]))]
                offsets = np.zeros(len(part) + 1, dtype=np.int32)
                np.cumsum(part, out=offsets[1:])
                values = zeros.slice(0, int(offsets[-1]))
                lists = pa.ListArray.from_arrays(pa.array(offsets), values)
                writer.write_batch(pa.record_batch([lists], schema=schema))
    np.save(folder.parent / f"{folder.name}-lengths.npy", lengths)


def _old_lengths(dataset: Any, args: Any, model_input_name: str) -> list[int]:
    """The baseline: the per-row _lengths of integrations/transformers.py before issue 21, verbatim."""
    column = getattr(args, "length_column_name", "length")
    names = getattr(dataset, "column_names", None)
    if names is not None and column in names:
        return [int(length) for length in dataset[column]]
    first = dataset[0]
    if model_input_name not in first:
        raise ValueError(model_input_name)
    return [len(dataset[i][model_input_name]) for i in range(len(dataset))]


def _phase(phase: str, folder: Path, cache: Path, rows: int) -> dict[str, Any]:
    os.environ["SHARDWISE_CACHE_DIR"] = str(cache)
    import datasets

    import shardwise

    datasets.disable_progress_bar()
    start = time.perf_counter()
    dataset = datasets.load_from_disk(str(folder))
    if rows < len(dataset):
        dataset = dataset.select(range(rows))  # contiguous: no indices mapping
    opened = time.perf_counter() - start
    expected = np.load(folder.parent / f"{folder.name}-lengths.npy", mmap_mode="r")[:rows]
    result: dict[str, Any] = {"phase": phase, "rows": len(dataset), "load_from_disk_s": opened}
    if phase in ("cold", "warm"):
        memory = PeakAnon()
        start = time.perf_counter()
        lengths = shardwise.column(dataset, "input_ids", kind="length")
        result["column_s"] = time.perf_counter() - start
        start = time.perf_counter()
        sampler = shardwise.BucketBatchSampler(lengths, batch_size=8, num_replicas=1, rank=0)
        result["sampler_s"] = time.perf_counter() - start
        result["anon_peak_mib"] = memory.stop()
        memory = PeakAnon()
        start = time.perf_counter()
        packed = shardwise.PackedBatchSampler(lengths, max_len=2048, rows_per_batch=8, num_replicas=1, rank=0)
        result["packed_s"] = time.perf_counter() - start
        result["packed_anon_peak_mib"] = memory.stop()
        if len(packed) == 0:
            raise SystemExit("PackedBatchSampler planned no batch")
        result["mapped"] = isinstance(lengths, np.memmap)
        if not np.array_equal(lengths, expected) or len(sampler) == 0:
            raise SystemExit("the Arrow lengths differ from the lengths written")
        return result
    from transformers import TrainingArguments

    from shardwise.integrations import trainer_sampling as integration  # default_train_sampler and its _lengths

    args = TrainingArguments(str(cache / "unused"), train_sampling_strategy="group_by_length",
                             per_device_train_batch_size=8, report_to="none", use_cpu=True)  # fmt: skip
    arms = (("before", _old_lengths), ("after", integration._lengths))
    for arm, function in arms if phase == "trainer" else arms[1:]:
        saved = integration._lengths
        integration._lengths = function  # the same default_train_sampler, with either _lengths
        try:
            memory = PeakAnon()
            start = time.perf_counter()
            sampler = integration.default_train_sampler(dataset, args)
            result[f"{arm}_s"] = time.perf_counter() - start
            result[f"{arm}_anon_peak_mib"] = memory.stop()
        finally:
            integration._lengths = saved
        if not np.array_equal(np.asarray(sampler.lengths), expected):  # type: ignore[attr-defined]
            raise SystemExit(f"{arm}: the sampler's lengths differ from the lengths written")
        shutil.rmtree(cache, ignore_errors=True)  # both arms start from a cold cache
    return result


def _run(phase: str, folder: Path, cache: Path, rows: int) -> dict[str, Any]:
    out = subprocess.run(module_command("bench.bench_arrow", "--phase", phase, "--folder", str(folder), "--cache",
                                        str(cache), "--rows", str(rows)), cwd=REPO, capture_output=True, text=True,
                         check=False, timeout=1800,
                         env={**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, default=1e7)
    parser.add_argument("--old-rows", type=float, default=1e5)
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm pairs (medians are shown)")
    parser.add_argument("--clean", action="store_true", help="delete the dataset written at the end")
    parser.add_argument("--quick", action="store_true", help="--rows 1e5 --old-rows 1e3 --repeats 1 (a smoke test)")
    add_data_argument(parser)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.quick:
        ns.rows, ns.old_rows, ns.repeats = 1e5, 1e3, 1
    rows = int(ns.rows)
    if ns.phase:
        print(json.dumps(_phase(ns.phase, Path(ns.folder), Path(ns.cache), rows)))
        return
    folder = ROOT / f"rows-{rows}"
    if not (folder / "state.json").exists():
        need = rows * 4 * 120  # ~55 int32 tokens a row on average, plus offsets, twice (write + save)
        free = shutil.disk_usage(tempfile.gettempdir()).free
        if free < need + (5 << 30):
            raise SystemExit(f"needs {need / 2**30:.1f} GiB free in {tempfile.gettempdir()} (+5 GiB margin), "
                             f"has {free / 2**30:.1f}")  # fmt: skip
        ROOT.mkdir(exist_ok=True)
        start = time.perf_counter()
        _write(folder, rows, ns.data)
        print(f"wrote {rows:,} rows to {folder} in {time.perf_counter() - start:.0f} s")
    size = sum(f.stat().st_size for f in folder.glob("*.arrow"))
    print(f"dataset: {rows:,} rows, {size / 2**30:.2f} GiB of Arrow files in {folder}")
    cold, warm = [], []
    for _ in range(ns.repeats):
        cache = Path(tempfile.mkdtemp(prefix="shardwise-bench-arrow-cache-"))
        try:
            cold.append(_run("cold", folder, cache, rows))
            warm.append(_run("warm", folder, cache, rows))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    cache = Path(tempfile.mkdtemp(prefix="shardwise-bench-arrow-cache-"))
    try:
        trainer = _run("trainer", folder, cache, int(ns.old_rows))
        full = _run("trainer-after", folder, cache, rows)  # the per-row arm would take minutes here
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return float(np.median([run[key] for run in runs]))

    print(f"\nlengths of {rows:,} rows (median of {ns.repeats} fresh processes each; load_from_disk "
          f"{med(cold, 'load_from_disk_s') * 1e3:.0f} ms, not included)")  # fmt: skip
    print(f"| {'rank':<28} | {'shardwise.column':>16} | {'BucketBatchSampler':>18} | {'total':>9} | {'peak anon':>9} |")
    print(f"|{'-' * 30}|{'-' * 18}:|{'-' * 20}:|{'-' * 11}:|{'-' * 11}:|")
    for label, runs in (("cold (rank 0 of the node)", cold), ("warm (ranks 1..W-1)", warm)):
        total = med(runs, "column_s") + med(runs, "sampler_s")
        print(f"| {label:<28} | {med(runs, 'column_s') * 1e3:>13.1f} ms | {med(runs, 'sampler_s') * 1e3:>15.1f} ms "
              f"| {total * 1e3:>6.1f} ms | {med(runs, 'anon_peak_mib'):>5.1f} MiB |")  # fmt: skip
    print("\nthen PackedBatchSampler(lengths, max_len=2048, rows_per_batch=8) on the same lengths (its own index):")
    for label, runs in (("cold (rank 0 of the node)", cold), ("warm (ranks 1..W-1)", warm)):
        packed_ms, packed_mib = med(runs, "packed_s") * 1e3, med(runs, "packed_anon_peak_mib")
        print(f"| {label:<28} | {packed_ms:>10.1f} ms | peak anon {packed_mib:.1f} MiB |")
    before, after = trainer["before_s"], trainer["after_s"]
    per_row = before / trainer["rows"]
    print(f"\nTrainer group_by_length: default_train_sampler over {trainer['rows']:,} rows, cold cache, fresh process")
    print("| arm                                  | time       | per row      | peak anon  |")
    print("|--------------------------------------|-----------:|-------------:|-----------:|")
    print(f"| before: len(dataset[i]['input_ids']) | {before:>8.2f} s | {per_row * 1e6:>9.1f} us "
          f"| {trainer['before_anon_peak_mib']:>6.1f} MiB |")  # fmt: skip
    print(f"| after: shardwise.column (Arrow)      | {after * 1e3:>7.1f} ms | {after / trainer['rows'] * 1e9:>9.1f} ns "
          f"| {trainer['after_anon_peak_mib']:>6.1f} MiB |")  # fmt: skip
    label = f"after, at {rows:,} rows"
    print(f"| {label:<36} | {full['after_s'] * 1e3:>7.1f} ms "
          f"| {full['after_s'] / rows * 1e9:>9.1f} ns | {full['after_anon_peak_mib']:>6.1f} MiB |")  # fmt: skip
    cold_total = med(cold, "column_s") + med(cold, "sampler_s")
    warm_total = med(warm, "column_s") + med(warm, "sampler_s")
    print(f"\nratios: before/after at {trainer['rows']:,} rows = {before / after:,.0f}x; "
          f"before extrapolated to {rows:,} rows ({per_row * rows:,.0f} s) / after at {rows:,} rows = "
          f"{per_row * rows / full['after_s']:,.0f}x; cold/warm = {cold_total / warm_total:.0f}x")  # fmt: skip
    if ns.clean:
        shutil.rmtree(folder, ignore_errors=True)
        (folder.parent / f"{folder.name}-lengths.npy").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
