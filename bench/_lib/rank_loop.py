"""One rank of ``bench_sharded_sources.py``'s multi-process figures: a real process with 2 DataLoader workers.

``rank_main(rank, world_size, spec)`` runs under ``shardwise.tools.launch.run_distributed`` (gloo,
spawned processes). It reads the shards of ``spec["urls"]`` from the S3 endpoint with one loader,
used as its documentation says:

- ``shardwise``: ``ShardedSource`` + ``LocalitySampler`` in a ``DataLoader``; resume through
  ``sampler.state_dict()`` / ``load_state_dict()`` (one state for every rank, any world size);
- ``hf``: ``load_dataset(streaming=True).shuffle(buffer_size=1000)`` + ``split_dataset_by_node`` in
  torchdata's ``StatefulDataLoader`` (the datasets docs' way to resume with workers); resume
  through the loader's ``state_dict()`` / ``load_state_dict()``, rank r loading rank r's state
  (``spec["workers"] = 0`` as well: with 2 workers over a shuffled stream loading fails);
- ``webdataset``: ``WebDataset(nodesplitter=split_by_node, shardshuffle=100).shuffle(1000)``; it has
  no mid-epoch resume, so a resumed run restarts the epoch;
- ``litdata``: ``StreamingDataset(shuffle=True)`` over the same samples ``optimize``d into LitData's
  chunks, in a ``StreamingDataLoader``; resume through the loader's ``state_dict()`` /
  ``load_state_dict()`` (rank 0's on every rank, as Lightning restores it). It runs in a scratch
  venv (``bench/_lib/litdata_venv.py``);
- ``streaming``: MosaicML Streaming's ``StreamingDataset(remote=s3, local=node cache, shuffle=True,
  shuffle_algo="py1e", batch_size=32)`` over the same samples written as MDS shards, in a
  ``StreamingDataLoader``; resume through the loader's ``state_dict()`` / ``load_state_dict()``
  (rank 0's on every rank). It runs in its own scratch venv (``bench/_lib/streaming_venv.py``).

With ``spec["stop"]`` the rank records the ids of its first ``stop`` batches and the loader's state
after them, reads on to the end of the epoch (timed: cold), reads a second epoch (timed: warm) and
a third (untimed: memory read every 8th batch).
With ``spec["state"]`` it resumes from that state and reads to the end of the epoch. A thread
samples the anonymous memory (``Pss_Anon`` of ``smaps_rollup``) of the rank
and every process under it (its DataLoader workers) every 0.5 s, and the third epoch every 8th batch
(a reading costs ~17 ms of system time a process, so the timed epochs are spared it); the peak is
returned.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any


def private_bytes(pid: int) -> int:
    """Anonymous memory of one process, shared pages split among their sharers (``Pss_Anon``); 0 if it has exited.

    Summed over a rank and its forked workers this counts every anonymous page of the group once:
    ``Private_*`` would count none of the pages the workers share copy-on-write with the rank.
    """
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss_Anon:"):
                    total += int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    return total


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (from ``/proc/<pid>/task/*/children``), depth first."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                for child in children.read().split():
                    found.append(int(child))
                    found.extend(descendants(int(child)))
        except FileNotFoundError:
            continue
    return found


class PeakMemory:
    """The peak, over time, of the private memory of this process plus every process under it."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval, self.peak, self.start = interval, 0, self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        pid = os.getpid()
        return private_bytes(pid) + sum(private_bytes(child) for child in descendants(pid))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Read now (also called by the reading loop, so that short epochs are seen while workers live)."""
        self.peak = max(self.peak, self.now())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return max(self.peak, self.start)


def list_collate(batch: list[Any]) -> list[Any]:
    return batch


def in_memory_rows(paths: list[str]) -> list[dict[str, Any]]:
    """Every row of the Parquet shards ``paths``, in order, as ``ShardedSource(output_format="numpy")`` gives it."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for path in paths:
        table = pq.read_table(path)
        tokens = table["tokens"].combine_chunks()
        values = tokens.values.to_numpy()
        offsets = tokens.offsets.to_numpy()
        ids = table["id"].to_numpy()
        rows.extend({"id": ids[i], "tokens": values[offsets[i] : offsets[i + 1]].copy()} for i in range(len(ids)))
    return rows


def _loader(rank: int, world_size: int, spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``(loader, set_epoch, id of a row)`` for ``spec["loader"]``, resumed from ``spec["state"]`` if given."""
    from torch.utils.data import DataLoader

    name, batch, workers, state = spec["loader"], spec["batch"], spec["workers"], spec.get("state")
    # Workers fork, as under torchrun (a spawned rank would otherwise spawn them: seconds of start-up each).
    context = "fork" if workers else None
    if name == "shardwise":
        from shardwise import LocalitySampler, ShardCache, ShardedSource

        cache = ShardCache(Path(spec["root"]) / spec["cache"], storage_options=spec["options"],
                           prefetch_threads=spec.get("prefetch_threads", 4), budget_bytes=spec.get("budget"))
        # Rows as numpy arrays, as LitData yields them (lists would cost ~6x more to cross from workers).
        source = ShardedSource(spec["urls"], cache=cache, index_dir=Path(spec["root"]) / "index",
                               open_shards=(spec.get("window") or 10) + 2, output_format="numpy",
                               decode=spec.get("decode", "node"))
        plan = {key: spec[key] for key in ("window", "mixing") if spec.get(key) is not None}  # else the defaults
        sampler = LocalitySampler(source, seed=0, **plan)
        if state is not None:
            sampler.load_state_dict(state)
        loader = DataLoader(source, sampler=sampler, batch_size=batch, num_workers=workers, collate_fn=list_collate,
                            multiprocessing_context=context)
        loader.state_dict = sampler.state_dict  # type: ignore[attr-defined]  # what a checkpoint saves
        return loader, sampler.set_epoch, lambda row: row["id"]
    if name == "memory":  # the floor: the same rows held in memory, torch's DistributedSampler, the same loader
        from torch.utils.data import DistributedSampler

        rows = in_memory_rows(spec["local_shards"])
        plain = DistributedSampler(rows, num_replicas=world_size, rank=rank, seed=0)
        loader = DataLoader(rows, sampler=plain, batch_size=batch, num_workers=workers, collate_fn=list_collate,
                            multiprocessing_context=context)
        loader.state_dict = lambda: None  # type: ignore[attr-defined]  # the floor is not resumed
        return loader, plain.set_epoch, lambda row: row["id"]
    if name == "hf":
        import datasets
        from datasets.distributed import split_dataset_by_node
        from torchdata.stateful_dataloader import StatefulDataLoader

        datasets.disable_progress_bars()
        ds = datasets.load_dataset("parquet", data_files={"train": spec["urls"]}, split="train", streaming=True,
                                   storage_options=spec["hf_options"])
        ds = split_dataset_by_node(ds.shuffle(seed=0, buffer_size=1000), rank=rank, world_size=world_size)
        loader = StatefulDataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=list_collate,
                                    multiprocessing_context=context)
        if state is not None:
            loader.load_state_dict(state[rank])
        return loader, ds.set_epoch, lambda row: row["id"]
    if name == "webdataset":
        import webdataset as wds

        # split_by_node reads RANK / WORLD_SIZE, which torchrun sets (the DataLoader workers see them too).
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)

        ds = wds.WebDataset(spec["tar_urls"], nodesplitter=wds.split_by_node, shardshuffle=100, seed=0,
                            empty_check=False).shuffle(1000).decode()
        loader = DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=list_collate,
                            multiprocessing_context=context)
        loader.state_dict = lambda: None  # type: ignore[attr-defined]  # no mid-epoch state: restart the epoch
        return loader, lambda epoch: None, lambda row: int(row["cls"])
    if name == "litdata":  # runs in the scratch venv (bench/_lib/litdata_venv.py)
        import litdata

        ds = litdata.StreamingDataset(spec["litdata_url"], shuffle=True, seed=0,
                                      cache_dir=str(Path(spec["root"]) / "litdata-cache"),
                                      storage_options={"endpoint_url": spec["endpoint"]})
        loader = litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=list_collate,
                                             multiprocessing_context=context)
        if state is not None:
            loader.load_state_dict(state)
        return loader, ds.set_epoch, lambda row: int(row["id"])
    if name == "streaming":  # runs in its scratch venv (bench/_lib/streaming_venv.py, which builds it)
        from bench._lib.streaming_loader import streaming_loader

        return streaming_loader(rank, world_size, spec, context)
    raise ValueError(f"loader should be 'shardwise', 'hf', 'webdataset', 'litdata' or 'streaming', "
                     f"but got loader={name!r}")


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that ended (the DataLoader workers of an epoch run out)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _together() -> None:
    """Wait for every rank (as a training step's all-reduce would): each epoch starts on all ranks at once."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _step_together(spec: dict[str, Any]) -> Any:
    """With ``spec["lockstep"]``: a function that waits for every rank after each step, as DDP's gradient all-reduce
    does (a one-element all-reduce); else one that does nothing (the ranks read at their own pace)."""
    if not spec.get("lockstep"):
        return lambda: None
    import torch
    import torch.distributed as dist

    token = torch.zeros(1)
    return lambda: dist.all_reduce(token)


def rank_main(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One rank's report: ids read (before the stop / after the resume), state, steps, rates, peak memory."""
    memory = PeakMemory()
    loader, set_epoch, get_id = _loader(rank, world_size, spec)
    report: dict[str, Any] = {"rank": rank}
    ids: list[int] = []
    _together()
    cpu = cpu_seconds()
    began = start = time.perf_counter()
    steps, first = 0, 0
    step_together = _step_together(spec)
    for batch in loader:
        ids.extend(int(get_id(row)) for row in batch)
        step_together()
        steps += 1
        if steps == 1:  # rates are timed from the first batch: the workers' start-up is not in them
            start, first = time.perf_counter(), len(ids)
            report["startup_cold"] = start - began  # the start-up, apart: iter(loader) to the first batch
        if steps == spec.get("stop"):
            report["before"], report["state"] = list(ids), loader.state_dict()
    ended = time.perf_counter()
    report["cpu_cold"] = cpu_seconds() - cpu
    # the whole epoch, start-up included (a cold loader may fetch much before its first batch)
    report.update(ids=ids, steps=steps, cold=(len(ids) - first) / (ended - start), epoch_cold=ended - began)
    report.setdefault("before", list(ids))
    report.setdefault("state", loader.state_dict())
    if spec.get("warm"):
        set_epoch(1)
        read = 0
        _together()  # no rank's warm epoch overlaps another's cold one
        cpu = cpu_seconds()
        began = time.perf_counter()
        for step, batch in enumerate(loader):
            if step == 0:
                start = time.perf_counter()
                report["startup_warm"] = start - began
            else:
                read += len(batch)
        ended = time.perf_counter()
        report.update(warm=read / (ended - start), epoch_warm=ended - began, cpu_warm=cpu_seconds() - cpu)
        # The timed epochs above read memory only every 0.5 s (a reading costs ~17 ms of a process's
        # time: every 8th batch, it was about half of a rank's time). A third, untimed epoch reads it
        # every 8th batch as well, for a peak that short epochs do not hide.
        if spec.get("memory_epoch", True):
            set_epoch(2)
            for step, _ in enumerate(loader):
                if step % 8 == 0:
                    memory.sample()
    report["peak"], report["base"] = memory.stop(), memory.start
    return report
