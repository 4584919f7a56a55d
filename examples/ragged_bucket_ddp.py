"""Four DDP ranks read one memory-mapped ragged store through BucketBatchSampler + pad_collate.

The situation this answers: a dataset of 2-D arrays whose row counts vary (audio frames x
features, tokens x embedding), too big to load once per rank. It is written once as a
``RaggedArray`` store; every rank (and every DataLoader worker) maps the same files, so the node
holds one copy in its page cache. ``BucketBatchSampler`` groups samples of similar length into
batches of at most ``max_tokens`` padded rows, one global plan dealt to the ranks by position, so
every rank takes the same number of steps. ``PadCollate`` pads each batch and returns a mask.

Run it (4 spawned gloo ranks on this machine, 2 DataLoader workers each)::

    python examples/ragged_bucket_ddp.py

Under torchrun, ``train`` is all you need: drop ``run_distributed`` and call
``train(dist.get_rank(), dist.get_world_size(), path)`` after ``init_process_group``.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardwise import BucketBatchSampler, PadCollate, RaggedArray
from shardwise.tools.launch import run_distributed

FEATURES = 16
MAX_TOKENS = 2048


def write_store(path: str | Path, num_samples: int = 600, seed: int = 0) -> RaggedArray:
    """Write ``num_samples`` arrays of 1..300 rows x FEATURES; column 0 of every row holds the sample's index."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, num_samples)

    def samples():  # a generator: the writer never holds more than one sample
        for index, rows in enumerate(lengths):
            sample = rng.standard_normal((int(rows), FEATURES)).astype(np.float32)
            sample[:, 0] = index
            yield sample

    return RaggedArray.write(path, samples(), progress=sys.stderr.isatty())


def train(rank: int, world_size: int, path: str, max_tokens: int = MAX_TOKENS, epoch: int = 0) -> dict[str, Any]:
    """One epoch on this rank: map the store, bucket, pad, step in lockstep; report what was seen."""
    store = RaggedArray(path)  # maps the files: nothing is loaded
    sampler = BucketBatchSampler(store.lengths, max_tokens=max_tokens, seed=0)  # rank/world from the process group
    loader = DataLoader(
        store,
        batch_sampler=sampler,
        collate_fn=PadCollate(pad_to_multiple_of=8),
        num_workers=2,
    )
    sampler.set_epoch(epoch)
    batches, steps, padded_rows, real_rows = [], 0, 0, 0
    for data, lengths, mask in loader:  # data: (B, max_rows, FEATURES), mask: (B, max_rows)
        features = data * mask[..., None]  # a model would run here; padding is masked out
        loss = features[..., 1:].pow(2).sum() / mask.sum()
        dist.all_reduce(loss)  # stands for DDP's gradient all_reduce: a rank with an extra step would hang
        batches.append(data[:, 0, 0].long().tolist())  # column 0 is the sample index
        if not all((data[b, : lengths[b], 0] == data[b, 0, 0]).all() for b in range(len(lengths))):
            raise RuntimeError("a padded sample does not hold its own rows")
        steps += 1
        padded_rows += mask.numel()
        real_rows += int(lengths.sum())
    return {"rank": rank, "steps": steps, "len": len(sampler), "batches": batches, "rows": (real_rows, padded_rows)}


def _spawned_rank(rank: int, world_size: int, path: str) -> dict[str, Any]:
    # Make this rank what a torchrun rank is. run_distributed starts ranks as daemonic spawned
    # processes (so they die with the launcher): Python forbids daemonic processes to start
    # children such as DataLoader workers, and a spawned process spawns its own children too
    # (each worker would import torch again). torchrun's ranks are fresh interpreters, not
    # daemonic, that start workers with the platform default (fork on Linux before Python 3.14).
    process = multiprocessing.current_process()
    process.daemon = False
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)
    return train(rank, world_size, path)


def run(path: str | Path, world_size: int = 4, timeout: float = 240.0) -> list[dict[str, Any]]:
    """``train`` on ``world_size`` spawned gloo ranks of this machine."""
    return run_distributed(_spawned_rank, world_size, str(path), timeout=timeout)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="shardwise-example-") as tmp:
        store = write_store(Path(tmp) / "store")
        print(f"{store!r}: {store.nbytes / 2**20:.1f} MiB")
        reports = run(store.path)
    seen = sorted(i for report in reports for batch in report["batches"] for i in batch)
    print("rank  steps  samples  real rows / padded rows")
    for report in reports:
        real, padded = report["rows"]
        count = sum(len(b) for b in report["batches"])
        print(f"{report['rank']:>4}  {report['steps']:>5}  {count:>7}  {real:>9} / {padded}")
    repeats = len(seen) - len(set(seen))
    print(
        f"samples seen: {len(seen)}, distinct: {len(set(seen))} of {len(store)} "
        f"({repeats} repeated by the batches that pad the last step to equal lengths)"
    )


if __name__ == "__main__":
    main()
