"""Samplers written the way users write them: broken ones (each with the check that must catch it) and sound ones.

Every factory is module-level, so ``shardwise.verify`` can call it in fresh processes. Factories
take ``rank``/``world_size`` keywords or read the launcher's environment, as user code does.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

import shardwise
from tests.classic import TwoStreamBatchSampler

N = 1_003  # not a multiple of any world size used in the tests
CASE_N = 401  # the conformance cases' size, not a multiple of any world size either (N: ~2.5x the time)


class Items(Dataset[int]):
    def __init__(self, size: int = N) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


# -- broken --------------------------------------------------------------------------------------


class RankSlice(Sampler[int]):
    """Shuffle with a shared seed, take every W-th index: ranks get different counts when n % W != 0."""

    def __init__(self, n: int, rank: int, world_size: int, seed: int = 0) -> None:
        self.n, self.rank, self.world_size, self.seed, self.epoch = n, rank, world_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g)[self.rank :: self.world_size].tolist())

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world_size))


def rank_sliced(rank: int, world_size: int) -> DataLoader[int]:
    """-> equal_steps: 993 samples on 4 ranks: 249, 248, 248, 248 indices, so 32 or 31 batches of 8."""
    return DataLoader(Items(993), batch_size=8, sampler=RankSlice(993, rank, world_size))


def unsharded_random() -> DataLoader[int]:
    """-> overlap (and global_rng): every rank shuffles the whole dataset on its own."""
    return DataLoader(Items(), batch_size=8, shuffle=True)


class GlobalNumpyTwoStream(TwoStreamBatchSampler):
    """The classic two-stream sampler on global np.random, 'sharded' by slicing its batches."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(np.arange(0, 200), np.arange(200, N), 8, 4)
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[Any]:
        batches = list(super().__iter__())
        return iter(batches[self.rank :: self.world_size][: len(batches) // self.world_size])

    def __len__(self) -> int:
        return super().__len__() // self.world_size


def two_stream_global_numpy(rank: int, world_size: int) -> GlobalNumpyTwoStream:
    """-> global_rng: each rank's permutation comes from its own global numpy state."""
    return GlobalNumpyTwoStream(rank, world_size)


class FixedSeedBatches(Sampler[list[int]]):
    """A sharded batch sampler whose set_epoch only records the epoch: the shuffle uses the seed alone."""

    def __init__(self, n: int, batch_size: int, rank: int, world_size: int, seed: int = 0) -> None:
        self.n, self.batch_size, self.rank, self.world_size, self.seed = n, batch_size, rank, world_size, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch  # stored, never used

    def _batches(self) -> list[list[int]]:
        order = np.random.default_rng(self.seed).permutation(self.n)
        batches = [order[i : i + self.batch_size].tolist() for i in range(0, self.n, self.batch_size)]
        per_rank = len(batches) // self.world_size
        return batches[self.rank :: self.world_size][:per_rank]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def batch_sampler_ignores_set_epoch(rank: int, world_size: int) -> DataLoader[int]:
    """-> epoch_order: set_epoch is reached but does not change the shuffle."""
    return DataLoader(Items(), batch_sampler=FixedSeedBatches(N, 8, rank, world_size))


class SkipFirst(Sampler[int]):
    """A wrapper (skip the first index of every shard) that forgets to forward set_epoch."""

    def __init__(self, inner: DistributedSampler[int]) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.inner))

    def __len__(self) -> int:
        return len(self.inner)


def wrapper_not_forwarding(rank: int, world_size: int) -> DataLoader[int]:
    """-> epoch_order: the DistributedSampler inside never sees the epoch."""
    inner = DistributedSampler(Items(), num_replicas=world_size, rank=rank, seed=3)
    return DataLoader(Items(), batch_size=8, sampler=SkipFirst(inner))


class Overstated(DistributedSampler[int]):
    """len() counts the whole dataset instead of this rank's shard."""

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


def len_overstates(rank: int, world_size: int) -> Overstated:
    """-> len_matches."""
    return Overstated(Items(), num_replicas=world_size, rank=rank)


class ByName(Sampler[int]):
    """A plan built from a set of file names: iteration order follows hash(), i.e. PYTHONHASHSEED."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.names = {f"shard-{i:05d}.tar" for i in range(N)}

    def __iter__(self) -> Iterator[int]:
        order = [int(name[6:11]) for name in self.names]
        per_rank = len(order) // self.world_size
        return iter(order[self.rank :: self.world_size][:per_rank])

    def __len__(self) -> int:
        return len(self.names) // self.world_size


def hash_order(rank: int, world_size: int) -> ByName:
    """-> determinism."""
    return ByName(rank, world_size)


def local_rank_two_nodes() -> DataLoader[int]:
    """-> overlap: the rank comes from LOCAL_RANK, which repeats on every node."""
    world_size = int(os.environ["WORLD_SIZE"])
    sampler = DistributedSampler(Items(), num_replicas=world_size, rank=int(os.environ["LOCAL_RANK"]), seed=1)
    return DataLoader(Items(), batch_size=8, sampler=sampler)


class ForgetfulResume(DistributedSampler[int]):
    """state_dict saves the epoch only: a mid-epoch resume replays the epoch from its start."""

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]


def lossy_resume(rank: int, world_size: int) -> DataLoader[int]:
    """-> resume: repeats what was trained before the checkpoint."""
    return DataLoader(Items(), batch_size=8, sampler=ForgetfulResume(Items(), num_replicas=world_size, rank=rank))


class ClockSeeded(DistributedSampler[int]):
    """Seeded from the wall clock at construction: every process (and every build) differs."""

    def __init__(self, dataset: Dataset[int], **kwargs: Any) -> None:
        super().__init__(dataset, seed=time.perf_counter_ns() % 1_000_003, **kwargs)


def wall_clock_seed(rank: int, world_size: int) -> ClockSeeded:
    """-> determinism."""
    return ClockSeeded(Items(), num_replicas=world_size, rank=rank)


class OffByOne(DistributedSampler[int]):
    """Shifts every index by one: the last one is past the end of the dataset."""

    def __iter__(self) -> Iterator[int]:
        return (i + 1 for i in super().__iter__())


def off_by_one(rank: int, world_size: int) -> OffByOne:
    """-> index_range."""
    return OffByOne(Items(), num_replicas=world_size, rank=rank, shuffle=False)


LENGTHS = (np.arange(N) * 7919 % 500 + 1).astype(np.int64)


class SortedChunks(Sampler[list[int]]):
    """Batches of 8 in length order, rank r takes the r-th contiguous chunk: one rank gets every long sample."""

    def __init__(self, rank: int, world_size: int) -> None:
        order = np.argsort(LENGTHS, kind="stable")
        per_rank = len(order) // world_size
        mine = order[rank * per_rank : (rank + 1) * per_rank]
        self.batches = [mine[i : i + 8].tolist() for i in range(0, per_rank - per_rank % 8, 8)]
        self.epoch = 0
        self.lengths = LENGTHS  # verify judges token balance from a sampler's own lengths

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng(self.epoch)
        return iter([self.batches[i] for i in rng.permutation(len(self.batches))])

    def __len__(self) -> int:
        return len(self.batches)


def token_imbalance(rank: int, world_size: int) -> SortedChunks:
    """-> balance (with lengths)."""
    return SortedChunks(rank, world_size)


class EpochOnItself(Sampler[list[int]]):
    """A correct sharded batch sampler whose set_epoch is on itself only, with no ``.sampler``: Lightning misses it."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.inner = DistributedSampler(Items(), num_replicas=world_size, rank=rank, seed=5)
        self._batches = BatchSampler(self.inner, 8, drop_last=False)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


def set_epoch_only_on_batch_sampler(rank: int, world_size: int) -> DataLoader[int]:
    """-> set_epoch_paths (warning: reached by Accelerate, not by Lightning or Composer)."""
    return DataLoader(Items(), batch_sampler=EpochOnItself(rank, world_size))


class PerRankPosition(DistributedSampler[int]):
    """Resumes mid-epoch on the same world size, but claims elasticity and saves a per-rank position."""

    elastic = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0
        self.yielded = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())[self.start :]
        self.start = 0
        for index in indices:
            self.yielded += 1
            yield index

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.yielded = 0
        super().set_epoch(epoch)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.start, self.yielded = state["epoch"], state["yielded"], state["yielded"]


def elastic_claim_broken(rank: int, world_size: int) -> DataLoader[int]:
    """-> elastic_resume: the same-size resume is right, another world size loses and repeats samples."""
    sampler = PerRankPosition(Items(), num_replicas=world_size, rank=rank, seed=2)
    return DataLoader(Items(), batch_size=8, sampler=sampler)


BROKEN: dict[str, str] = {
    "rank_sliced": "equal_steps",
    "unsharded_random": "overlap",
    "two_stream_global_numpy": "global_rng",
    "batch_sampler_ignores_set_epoch": "epoch_order",
    "wrapper_not_forwarding": "epoch_order",
    "len_overstates": "len_matches",
    "hash_order": "determinism",
    "local_rank_two_nodes": "overlap",
    "lossy_resume": "resume",
    "wall_clock_seed": "determinism",
    "off_by_one": "index_range",
    "token_imbalance": "balance",
    "set_epoch_only_on_batch_sampler": "set_epoch_paths",
    "elastic_claim_broken": "elastic_resume",
}
"""Factory name -> the check that must catch it."""


# -- sound ---------------------------------------------------------------------------------------


def torch_distributed_sampler(rank: int, world_size: int) -> DataLoader[int]:
    """torch's own DistributedSampler in a DataLoader."""
    return DataLoader(Items(), batch_size=8, sampler=DistributedSampler(Items(), num_replicas=world_size, rank=rank))


def torch_distributed_sampler_from_group() -> DistributedSampler[int]:
    """torch's DistributedSampler asking torch.distributed for rank and world size (no arguments)."""
    return DistributedSampler(Items(), seed=7)


def sharded_env() -> DataLoader[int]:
    """A ShardedSampler resolving rank, world size and seed from the launcher's environment."""
    return DataLoader(Items(), batch_size=8, sampler=shardwise.ShardedSampler(Items()))


def sharded_large() -> shardwise.ShardedSampler:
    """100k samples, for the speed check."""
    return shardwise.ShardedSampler(100_000, seed=1)


def shardwise_case(name: str, rank: int, world_size: int) -> Any:
    """Each case of the conformance harness, built for this rank (use with functools.partial)."""
    from tests.conformance import CASES

    case = next(c for c in CASES if c.name == name)
    return case.make(max(CASE_N, case.min_n), num_replicas=world_size, rank=rank, seed=11)


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
