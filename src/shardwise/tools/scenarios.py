"""The scenarios of ``shardwise demo``: each builds a DataLoader around one shardwise sampler.

A later sampler joins the demo by adding one :class:`Scenario` to :data:`SCENARIOS`. A scenario over
files (the ``LocalitySampler`` one, over local Parquet shards) writes them once, in the parent,
into a folder every rank reads (``files``); a scenario whose optional extra is missing is skipped
with a one-line note (``requires``). ``shardwise.tools.demo`` runs them on real ranks.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from .._core.schedule import BatchSizeSchedule
from ..samplers.bucket import BucketBatchSampler
from ..samplers.class_balanced import ClassBalancedBatchSampler
from ..samplers.locality import LocalitySampler
from ..samplers.mixture import MixtureSampler
from ..samplers.packed import PackedBatchSampler
from ..samplers.scheduled import ScheduledBatchSampler
from ..samplers.sharded import ShardedSampler
from ..samplers.two_stream import TwoStreamBatchSampler
from ..samplers.weighted import WeightedSampler
from ..samplers.wrappers import shard_batches

DEMO_SEED = 2026


class IndexDataset(Dataset[int]):
    """A map-style dataset whose item ``i`` is ``i``: what each rank drew is what it loaded."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


def _everything(size: int) -> set[int] | None:
    return set(range(size))


@dataclass(frozen=True)
class Scenario:
    """A sampler to demonstrate: ``build(size)`` returns the DataLoader and the shardwise sampler.

    ``tracked(size)`` is the set of indices that one epoch must cover with no index on two ranks
    (beyond the documented padding); ``None`` for samplers that draw with replacement.
    ``files(folder, size)``, if set, writes the scenario's data into ``folder`` once, before the
    ranks start; ``build`` is then called as ``build(size, folder)``. ``requires`` names the
    module of an optional extra without which the scenario is skipped, and ``install`` its hint.
    """

    name: str
    build: Callable[..., tuple[DataLoader[Any], Any]]
    summary: str
    tracked: Callable[[int], set[int] | None] = _everything
    files: Callable[[Path, int], None] | None = None
    requires: str | None = None
    install: str = ""
    data_size: Callable[[int], int] = lambda size: size
    """The samples the scenario's data holds for a demo ``size`` (the files of a scenario may hold fewer)."""
    why: str = ""
    """Why an epoch draws another number of samples than the data holds, or holds fewer than ``size``."""
    epochs_why: Callable[[int], str] | None = None
    """Why its batches or padding differ from one epoch to the next, for a demo ``size`` (``None``: the
    general reason, :data:`EPOCHS_WHY`)."""

    def missing(self) -> str | None:
        """The one-line note saying why this scenario cannot run here, or ``None``."""
        if self.requires is None or importlib.util.find_spec(self.requires) is not None:
            return None
        return f"skipped {self.name}: needs {self.requires}, which is not installed ({self.install})"


def sharded_scenario(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    sampler = ShardedSampler(dataset, seed=DEMO_SEED)
    return DataLoader(dataset, batch_size=32, sampler=sampler), sampler


def _any_batch_sampler(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    # A plain single-process batch sampler drawing from the global torch RNG, made distributed.
    batches = shard_batches(BatchSampler(RandomSampler(dataset), batch_size=32, drop_last=False), seed=DEMO_SEED)
    return DataLoader(dataset, batch_sampler=batches), batches


def _bucket(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    lengths = np.arange(size) * 7919 % 500 + 1  # a spread of lengths from 1 to 500 tokens
    sampler = BucketBatchSampler(lengths, max_tokens=4096, seed=DEMO_SEED)
    return DataLoader(dataset, batch_sampler=sampler), sampler


def _two_stream(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    labelled, unlabelled = range(size // 4, size), range(size // 4)
    sampler = TwoStreamBatchSampler(
        labelled, unlabelled, primary_batch_size=24, secondary_batch_size=8, drop_last=False, seed=DEMO_SEED
    )
    return DataLoader(dataset, batch_sampler=sampler), sampler


def _class_balanced(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    sampler = ClassBalancedBatchSampler(np.arange(size) % 20, classes_per_batch=4, samples_per_class=8, seed=DEMO_SEED)
    return DataLoader(dataset, batch_sampler=sampler), sampler


def _weighted(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    sampler = WeightedSampler(np.arange(size) % 5, num_samples=size, seed=DEMO_SEED)
    return DataLoader(dataset, batch_size=32, sampler=sampler), sampler


def _scheduled(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    # Batch size 32, then 16 from the middle of the first epoch on: every rank switches at the same step.
    schedule = BatchSizeSchedule.by_samples({0: 32, size // 2: 16})
    sampler = ScheduledBatchSampler(size, batch_size=schedule, seed=DEMO_SEED)
    return DataLoader(dataset, batch_sampler=sampler), sampler


def _mixture(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)  # three sources back to back: half, a third, the rest
    sizes = [size // 2, size // 3, size - size // 2 - size // 3]
    sampler = MixtureSampler(sizes, [0.2, 0.3, 0.5], stop="all_exhausted", seed=DEMO_SEED)
    return DataLoader(dataset, batch_size=32, sampler=sampler), sampler


def _packed(size: int) -> tuple[DataLoader[Any], Any]:
    dataset = IndexDataset(size)
    lengths = np.arange(size) * 7919 % 500 + 1  # the same spread of lengths as the bucket scenario
    sampler = PackedBatchSampler(lengths, max_len=1024, rows_per_batch=4, balance="attention", seed=DEMO_SEED)
    return DataLoader(dataset, batch_sampler=sampler), sampler


EPOCHS_WHY = ("each epoch's order makes another number of batches; when it is not a multiple of the ranks, "
              "the last step is padded with samples of the epoch drawn again, so that every rank takes as many "
              "steps (padding)")
"""Why a scenario's batches or padding differ between epochs, unless it says more (``Scenario.epochs_why``)."""


def _bucket_epochs(size: int) -> str:
    return ("a batch holds as many samples as fit 4,096 padded tokens, so each epoch's order makes another number "
            "of batches; when it is not a multiple of the ranks, the last step is padded by wrapping to the start of "
            "the plan, so that every rank takes as many steps (padding)")  # fmt: skip


def _scheduled_epochs(size: int) -> str:
    return (f"the schedule counts the samples of the run, not of the epoch: batch size 32 for the first {size // 2:,} "
            f"(half of epoch 0), then 16, so epoch 0 takes fewer, larger batches than the epochs after it")  # fmt: skip


SHARD_FRACTIONS = (0.0, 0.14, 0.31, 0.52, 0.6, 0.81, 1.0)
"""Where the six uneven Parquet shards of the ``LocalitySampler`` scenario split the ids."""
SHARDED_SIZE = 2_400
"""At most this many samples in the shards: a row read costs more than an index, the demo stays short."""


def _sharded_ids(size: int) -> set[int] | None:
    return set(range(min(size, SHARDED_SIZE)))


def _write_shards(folder: Path, size: int) -> None:
    """Six uneven Parquet shards whose ``id`` column holds the global sample id (row ``r`` of the shard)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bounds = [round(f * min(size, SHARDED_SIZE)) for f in SHARD_FRACTIONS]
    for shard, (start, stop) in enumerate(itertools.pairwise(bounds)):
        ids = np.arange(start, stop, dtype=np.int64)
        table = pa.table({"id": ids, "tokens": (ids * 7919 % 500 + 1).astype(np.int32)})
        pq.write_table(table, folder / f"part-{shard:05d}.parquet")


def _ids(samples: list[dict[str, Any]]) -> torch.Tensor:
    """Collate: the ``id`` column of the rows read, so what each rank reports is what it loaded."""
    return torch.tensor([sample["id"] for sample in samples], dtype=torch.int64)


def _source(folder: Path) -> Any:
    from ..data.sharded import ShardCache, ShardedSource

    return ShardedSource(str(folder / "shards"), columns=["id"], index_dir=folder / "index",
                         cache=ShardCache(folder / "cache"))  # fmt: skip


def _locality(size: int, folder: Path) -> tuple[DataLoader[Any], Any]:
    source = _source(folder)  # every rank opens the same shards and the index built once for the node
    sampler = LocalitySampler(source, window=2, seed=DEMO_SEED)
    return DataLoader(source, batch_size=32, sampler=sampler, collate_fn=_ids), sampler


def _locality_files(folder: Path, size: int) -> None:
    (folder / "shards").mkdir(parents=True)
    _write_shards(folder / "shards", size)
    _source(folder)  # reads the Parquet footers into the shared metadata index, once


SCENARIOS: list[Scenario] = [
    Scenario("ShardedSampler", sharded_scenario, "drop-in DistributedSampler, O(1) memory shuffle"),
    Scenario("shard_batches(BatchSampler)", _any_batch_sampler, "any batch sampler, dealt by position"),
    Scenario("BucketBatchSampler", _bucket, "length-aware batches under a 4096-token budget",
             epochs_why=_bucket_epochs),
    Scenario(
        "TwoStreamBatchSampler", _two_stream, "labelled pass + unlabelled stream",
        tracked=lambda size: set(range(size // 4, size)),
    ),
    Scenario("ClassBalancedBatchSampler", _class_balanced, "4 classes x 8 samples", tracked=lambda size: None),
    Scenario("WeightedSampler", _weighted, "weighted draws with replacement", tracked=lambda size: None),
    Scenario("ScheduledBatchSampler", _scheduled, "batch size 32 -> 16 mid-epoch, in lockstep",
             epochs_why=_scheduled_epochs),
    Scenario(
        "MixtureSampler", _mixture, "3 sources at 2:3:5, exact per block, until all are used up",
        tracked=lambda size: None,
        why="stop='all_exhausted' draws until every source is used up: the first, half the data at 20% of the "
            "draws, sets the epoch (2.5x the data), and the other sources repeat",
    ),
    Scenario("PackedBatchSampler", _packed, "documents packed into 4 rows of 1024 tokens, balanced by attention"),
    Scenario(
        "LocalitySampler(ShardedSource)", _locality, "6 local Parquet shards (<= 2,400 rows), shuffled 2 at a time",
        tracked=_sharded_ids, files=_locality_files, requires="pyarrow", install="pip install 'shardwise[demo]'",
        data_size=lambda size: min(size, SHARDED_SIZE),
        why=f"its Parquet shards hold at most {SHARDED_SIZE:,} rows (a row read costs more than an index)",
    ),
]
