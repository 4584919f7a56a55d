"""Crash and resume: what was trained before the last checkpoint plus what the resumed job trains is the plan.

The suite runs real gloo ranks (``run_distributed``). Job 1 (2 ranks) trains every case in turn:
each rank appends what it trained at every step to its own log file, rank 0 writes the
checkpoint atomically (``torch.save`` to a temporary file, then ``os.replace``), and the case
crashes: mid-epoch (checkpoints every 2 steps, crash at step 5) or at the epoch boundary (one
checkpoint just after the last batch of epoch 0, after the epoch's loop, or after the user's
``set_epoch(1)``; crash two steps into epoch 1). The last case of each job is a real crash: rank 1
kills itself with ``SIGKILL`` and the job dies (rank 0 fails in its next all_reduce); the earlier
cases stop both ranks at the crash step, which leaves the same files behind. Job 2 (3 ranks, a
new process group) loads rank 0's last checkpoint of every case and trains to the end of epoch 1;
one set of 3 ranks runs the job 2 of both tests (mid-epoch, then epoch boundary), one after the other.

A case is a sampler kind, a loader (plain ``DataLoader``: the recipe saves ``sampler.state_dict()``;
torchdata's ``StatefulDataLoader``: the recipe saves ``loader.state_dict()``) and 0 or 2 workers.
Every rank logs samples; the assertions run in the test process against the global plan (what
one process yields), allowing only the documented padding: at most ``W - 1`` units at each
epoch end.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

import shardwise
from shardwise.tools.launch import run_distributed
from shardwise.tools.scenarios import IndexDataset
from tests.lockstep import worker_context

pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")]

N = 64
TWO_STREAM_N, PRIMARY = 96, 32
EPOCHS = 2
BATCH = 4
KINDS = [
    "ShardedSampler", "WeightedSampler", "shard", "shard_batches", "TwoStreamBatchSampler", "BucketBatchSampler",
    "ClassBalancedBatchSampler", "ScheduledBatchSampler", "MixtureSampler", "PackedBatchSampler",
]  # fmt: skip
INDEX_KINDS = {"ShardedSampler", "WeightedSampler", "shard", "MixtureSampler"}
LOADERS = [("plain", 0), ("stateful", 0), ("plain", 2), ("stateful", 2)]
POINTS = ["mid", "end_in_loop", "end_after_loop", "next_epoch"]


def make(kind: str, **world: Any) -> Any:
    """A shardwise sampler (index: units are ints) or batch sampler of ``kind``."""
    seeded: dict[str, Any] = {"seed": 11, **world}
    rng = np.random.default_rng(3)
    makers: dict[str, Any] = {
        "ShardedSampler": lambda: shardwise.ShardedSampler(N, **seeded),
        "WeightedSampler": lambda: shardwise.WeightedSampler(rng.random(N) + 0.1, num_samples=N, **seeded),
        "shard": lambda: shardwise.shard(RandomSampler(range(N)), **seeded),
        "shard_batches": lambda: shardwise.shard_batches(BatchSampler(RandomSampler(range(N)), BATCH, False),
                                                         **seeded),
        "TwoStreamBatchSampler": lambda: shardwise.TwoStreamBatchSampler(
            range(PRIMARY), range(PRIMARY, TWO_STREAM_N), primary_batch_size=2, secondary_batch_size=2,
            drop_last=False, **seeded),
        "BucketBatchSampler": lambda: shardwise.BucketBatchSampler(rng.integers(1, 30, N), max_tokens=60, **seeded),
        "ClassBalancedBatchSampler": lambda: shardwise.ClassBalancedBatchSampler(
            np.arange(N) % 4, classes_per_batch=2, samples_per_class=2, **seeded),
        "ScheduledBatchSampler": lambda: shardwise.ScheduledBatchSampler(
            N, batch_size=shardwise.BatchSizeSchedule.by_samples({0: 2, 32: 4}), **seeded),
        "MixtureSampler": lambda: shardwise.MixtureSampler([40, 24], [0.5, 0.5], num_samples=N, **seeded),
        "PackedBatchSampler": lambda: shardwise.PackedBatchSampler(rng.integers(1, 30, N), max_len=48,
                                                                   rows_per_batch=2, **seeded),
    }  # fmt: skip
    return makers[kind]()


def build(kind: str, path: str, workers: int, **world: Any) -> tuple[Any, Any]:
    """``(sampler, loader)`` for one case; index samplers go under ``batch_size=4``."""
    sampler = make(kind, **world)
    data = IndexDataset(TWO_STREAM_N if kind == "TwoStreamBatchSampler" else N)
    loader_class: Any = DataLoader
    if path == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader_class = StatefulDataLoader
    # A spawned rank would spawn its workers too (seconds each); torchrun ranks fork them (lockstep.worker_context).
    settings: dict[str, Any] = {"num_workers": workers, "multiprocessing_context": worker_context() if workers else None}
    if kind in INDEX_KINDS:
        return sampler, loader_class(data, sampler=sampler, batch_size=BATCH, **settings)
    return sampler, loader_class(data, batch_sampler=sampler, **settings)


def plan(kind: str) -> Counter[int]:
    """Samples of the global plan of epochs 0 and 1 (what one process yields)."""
    sampler = make(kind, num_replicas=1, rank=0)
    samples: Counter[int] = Counter()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for unit in sampler:
            samples.update([int(unit)] if kind in INDEX_KINDS else [int(i) for i in unit])
    return samples


def largest_unit(kind: str) -> int:
    """Samples in the largest unit: what one padded unit can repeat."""
    if kind in INDEX_KINDS:
        return 1
    sampler = make(kind, num_replicas=1, rank=0)
    return max(len(unit) for epoch in range(EPOCHS) for unit in (sampler.set_epoch(epoch) or sampler))


def name_of(case: tuple[str, str, int, str]) -> str:
    return "-".join(map(str, case))


def save_atomically(obj: Any, path: Path) -> None:
    temporary = path.with_suffix(".tmp")
    torch.save(obj, temporary)
    os.replace(temporary, path)


# -- what runs on each rank ----------------------------------------------------------------------


def _train_case(case: tuple[str, str, int, str], rank: int, directory: Path, *, log: Any, kill: bool) -> None:
    """Job 1: train one case from scratch until its crash step, checkpointing by its policy."""
    import torch.distributed as dist

    kind, path, workers, point = case
    name = name_of(case)
    sampler, loader = build(kind, path, workers)
    crash = 5 if point == "mid" else None
    step = 0

    def checkpoint(epoch: int) -> None:
        if rank == 0:
            state = sampler.state_dict() if path == "plain" else loader.state_dict()
            save_atomically({"epoch": epoch, "step": step, "state": state}, directory / f"{name}.ckpt")

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        if epoch == 1 and point == "next_epoch":
            checkpoint(epoch)
        if epoch == 1 and crash is None:
            crash = step + 2
        last = len(loader)
        for index, batch in enumerate(loader):
            step += 1
            if step == crash and kill and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            log.write(json.dumps({"case": name, "step": step, "samples": [int(i) for i in batch]}) + "\n")
            log.flush()
            dist.all_reduce(torch.ones(1))  # the step's gradient all_reduce: the ranks stay in lockstep
            if step == crash:
                return
            if (point == "mid" and step % 2 == 0) or (point == "end_in_loop" and epoch == 0 and index + 1 == last):
                checkpoint(epoch)
        if epoch == 0 and point == "end_after_loop":
            checkpoint(epoch + 1)  # the recipe: the epoch to start from after this checkpoint


def _first_job(rank: int, world_size: int, directory: str, cases: list[tuple[str, str, int, str]]) -> None:
    warnings.filterwarnings("ignore")
    with open(Path(directory) / f"first.rank{rank}.jsonl", "a") as log:
        for number, case in enumerate(cases):
            _train_case(case, rank, Path(directory), log=log, kill=number == len(cases) - 1)
    raise RuntimeError("the last case should have been killed")


def _resume_case(case: tuple[str, str, int, str], rank: int, directory: Path, *, log: Any) -> None:
    """Job 2: load rank 0's last checkpoint and train to the end of the last epoch."""
    import torch.distributed as dist

    kind, path, workers, _ = case
    name = name_of(case)
    sampler, loader = build(kind, path, workers)
    saved = torch.load(directory / f"{name}.ckpt", weights_only=False)
    (sampler if path == "plain" else loader).load_state_dict(saved["state"])
    for epoch in range(saved["epoch"], EPOCHS):
        sampler.set_epoch(epoch)
        for batch in loader:
            log.write(json.dumps({"case": name, "samples": [int(i) for i in batch]}) + "\n")
            dist.all_reduce(torch.ones(1))


def _second_job(rank: int, world_size: int, jobs: list[tuple[str, list[tuple[str, str, int, str]]]]) -> None:
    """Job 2 of every (directory, cases) of ``jobs``, in turn."""
    warnings.filterwarnings("ignore")
    for directory, cases in jobs:
        with open(Path(directory) / f"second.rank{rank}.jsonl", "w") as log:
            for case in cases:
                _resume_case(case, rank, Path(directory), log=log)


# -- accounting ----------------------------------------------------------------------------------


def _records(directory: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(f"{prefix}.rank*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def account(directory: Path, cases: list[tuple[str, str, int, str]]) -> dict[str, tuple[int, int, int]]:
    """Per case: ``(lost, repeated, padding allowed)`` samples over epochs 0 and 1."""
    first, second = _records(directory, "first"), _records(directory, "second")
    out = {}
    for case in cases:
        name = name_of(case)
        saved_at = torch.load(directory / f"{name}.ckpt", weights_only=False)["step"]
        trained: Counter[int] = Counter()
        for record in first:
            if record["case"] == name and record["step"] <= saved_at:
                trained.update(record["samples"])
        for record in second:
            if record["case"] == name:
                trained.update(record["samples"])
        expected = plan(case[0])
        # Epoch ends after the crash are at 3 ranks (2 padded units at most), one before it at 2.
        padding = (2 + (1 if case[3] == "mid" else 0) + 2) * largest_unit(case[0])
        out[name] = (sum((expected - trained).values()), sum((trained - expected).values()), padding)
    return out


def crash_and_resume(jobs: dict[str, tuple[Path, list[tuple[str, str, int, str]]]]) -> dict[str, dict[str, Any]]:
    """Per job (directory, cases): job 1 (2 ranks, killed); then job 2 of every job on ONE set of 3 new ranks, one
    job after the other (starting 3 ranks and their fork servers is most of a job 2). The accounting per case."""
    for directory, cases in jobs.values():
        # Job 1 must die of the SIGKILL of its last case, not of anything earlier.
        with pytest.raises(RuntimeError, match=r"rank 1 of 2 failed in _first_job:\nrank 1 exited with code -9"):
            run_distributed(_first_job, 2, str(directory), cases, timeout=240, collective_timeout=30)
        last = {record["case"] for record in _records(directory, "first")[-1:]}
        assert last == {name_of(cases[-1])}, last
    resumes = [(str(directory), cases) for directory, cases in jobs.values()]
    run_distributed(_second_job, 3, resumes, timeout=400, collective_timeout=30)
    return {name: account(directory, cases) for name, (directory, cases) in jobs.items()}


def _cases(points: list[str]) -> list[tuple[str, str, int, str]]:
    """Every kind with every loader; the points take turns (each point still meets every kind and loader kind).

    The killed (last) case has workers, so SIGKILL also takes a rank with live DataLoader workers.
    """
    pairs = [(path, workers, kind) for path, workers in LOADERS for kind in KINDS]
    return [(kind, path, workers, points[i % len(points)]) for i, (path, workers, kind) in enumerate(pairs)]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The two crash tests' jobs: mid-epoch, and at the epoch boundary (40 cases each)."""
    return crash_and_resume({
        "mid": (tmp_path_factory.mktemp("mid"), _cases(["mid"])),
        # the three checkpoint points take turns over every (kind, loader, workers).
        "boundary": (tmp_path_factory.mktemp("boundary"), _cases(["end_in_loop", "end_after_loop", "next_epoch"])),
    })  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_crash_mid_epoch_resumes_at_another_world_size_with_nothing_lost_or_repeated(
    crashed: dict[str, dict[str, Any]],
) -> None:
    """SIGKILL mid-epoch, resume at 3 ranks: every sampler, both loaders, 0 and 2 workers, only padding repeats."""
    result = crashed["mid"]
    assert len(result) == len(KINDS) * len(LOADERS)
    bad = {name: counts for name, counts in result.items() if counts[0] or counts[1] > counts[2]}
    assert not bad, bad


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_crash_after_an_epoch_boundary_checkpoint_resumes_with_nothing_lost_or_repeated(
    crashed: dict[str, dict[str, Any]],
) -> None:
    """Checkpoint after the last batch, after the loop or after set_epoch(1); SIGKILL in epoch 1; resume exact."""
    result = crashed["boundary"]
    assert len(result) == len(KINDS) * len(LOADERS)
    bad = {name: counts for name, counts in result.items() if counts[0] or counts[1] > counts[2]}
    assert not bad, bad


# -- one process: the two silent losses of issue #16, and the shapes a loader can take -----------


def _local(kind: str, *, rank: int = 0) -> Any:
    return make(kind, num_replicas=2, rank=rank)


def _loader(kind: str, sampler: Any, **settings: Any) -> Any:
    data = IndexDataset(TWO_STREAM_N if kind == "TwoStreamBatchSampler" else N)
    if kind in INDEX_KINDS:
        return DataLoader(data, sampler=sampler, batch_size=settings.pop("batch_size", BATCH), **settings)
    return DataLoader(data, batch_sampler=sampler, **settings)


def _lists(batches: Any) -> list[list[int]]:
    return [[int(i) for i in batch] for batch in batches]


def _head(loader: Any, count: int) -> list[list[int]]:
    """The first ``count`` batches of a new pass over ``loader``, then the loop is left (its iterator dropped)."""
    head = []
    for batch in loader:
        head.append([int(i) for i in batch])
        if len(head) == count:
            break
    return head


@pytest.mark.parametrize("kind", ["ShardedSampler", "BucketBatchSampler", "ScheduledBatchSampler"])
@pytest.mark.parametrize("persistent", [False, True])
def test_sampler_state_after_k_batches_of_a_loader_with_workers_resumes_at_batch_k_plus_1(
    kind: str, persistent: bool
) -> None:
    """Plain DataLoader, 2 workers, prefetch 3: sampler.state_dict() after k trained batches resumes at k+1."""
    settings = {"num_workers": 2, "prefetch_factor": 3, "persistent_workers": persistent}
    whole = _lists(_loader(kind, _local(kind)))
    sampler = _local(kind)
    head = []
    for batch in _loader(kind, sampler, **settings):
        head.append([int(i) for i in batch])
        if len(head) == 2:
            state = sampler.state_dict()  # inside the loop: the iterator and its workers are alive
            break
    after_break = sampler.state_dict()  # the loop left, the iterator is gone
    resumed = _local(kind)
    resumed.load_state_dict(state)
    assert state == after_break
    assert head + _lists(_loader(kind, resumed, **settings)) == whole


@pytest.mark.parametrize("kind", ["ShardedSampler", "BucketBatchSampler"])
def test_leaving_a_loop_stops_the_loader_workers_without_a_garbage_collection(kind: str) -> None:
    """A loop left with ``break`` frees its loader iterator at once, so its worker processes exit.

    A pass used to keep the frame that pulled its first unit, whose ``self`` is the loader iterator:
    a reference cycle that kept every iterator's workers alive until a garbage collection (ranks
    running many loops accumulated them).
    """
    import gc
    import multiprocessing
    import time

    gc.disable()
    try:
        for _ in range(3):
            sampler = _local(kind)
            loader = _loader(kind, sampler, num_workers=2, multiprocessing_context="fork")
            for index, _batch in enumerate(loader):
                if index == 1:
                    break
            del loader, sampler, _batch
        deadline = time.monotonic() + 20
        while multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()


def test_a_loop_left_after_k_batches_saves_batch_k_plus_1_and_iterating_again_starts_the_epoch() -> None:
    """Breaking out after k batches: the state resumes at batch k+1 (not after the prefetched ones); a new pass
    without a loaded state is the whole epoch, as with torch's sampler (NOTE [ A new pass starts its epoch ])."""
    sampler = _local("ShardedSampler")
    loader = _loader("ShardedSampler", sampler, num_workers=2)
    whole = _lists(_loader("ShardedSampler", _local("ShardedSampler")))
    head = _head(loader, 3)
    state = sampler.state_dict()
    assert _lists(loader) == whole
    resumed = _local("ShardedSampler")
    resumed.load_state_dict(state)
    assert head + _lists(_loader("ShardedSampler", resumed, num_workers=2)) == whole


def test_a_loaded_state_survives_a_loader_iterator_whose_workers_only_prefetched() -> None:
    """A loader iterator built after load_state_dict and dropped before its first batch moves nothing: the next resumes."""
    saved = _local("ShardedSampler")
    loader = _loader("ShardedSampler", saved)
    whole = _lists(_loader("ShardedSampler", _local("ShardedSampler")))
    head = _head(loader, 2)
    resumed = _local("ShardedSampler")
    resumed.load_state_dict(saved.state_dict())
    loader = _loader("ShardedSampler", resumed, num_workers=2)
    dropped = iter(loader)  # its workers draw batches 3.. from the sampler; the loop receives none
    del dropped
    assert head + _lists(loader) == whole


def test_a_drop_last_loader_completes_the_epoch_and_the_next_pass_advances() -> None:
    """With DataLoader(drop_last=True) the dropped tail is not a lost position: the epoch completes, the next begins."""
    sampler = _local("ShardedSampler")
    loader = _loader("ShardedSampler", sampler, num_workers=2, batch_size=5, drop_last=True)
    first = _lists(loader)
    state = sampler.state_dict()
    assert state["epoch"] == 0 and state["consumed"] >= N
    second = _lists(loader)
    assert sampler.state_dict()["epoch"] == 1 and first != second


def test_state_warns_when_a_wrapping_batch_sampler_hides_what_was_trained() -> None:
    """Workers drawing through a user's batch sampler that wraps the shardwise one: state_dict() warns, naming the fix."""

    class Regroup(BatchSampler):
        """Batches of a size that changes: shardwise cannot map a count of them to units."""

        def __iter__(self) -> Any:
            units, size = iter(self.sampler), 3
            while batch := [*itertools.islice(units, size)]:
                yield batch
                size = 8 - size

    sampler = _local("ShardedSampler")
    loader = DataLoader(IndexDataset(N), batch_sampler=Regroup(sampler, 4, False), num_workers=2)
    iterator = iter(loader)
    next(iterator)
    with pytest.warns(UserWarning, match="StatefulDataLoader"):
        sampler.state_dict()
    del iterator


@pytest.mark.parametrize("finished", [True, False])
@pytest.mark.parametrize("kind", ["ShardedSampler", "TwoStreamBatchSampler"])
def test_stateful_loader_state_at_the_end_of_an_epoch_resumes_the_next_epoch_from_its_start(
    kind: str, finished: bool
) -> None:
    """StatefulDataLoader, 2 workers, state after the last batch (iterator finished or not): epoch 1 is whole."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def stateful(sampler: Any) -> Any:
        data = IndexDataset(TWO_STREAM_N if kind == "TwoStreamBatchSampler" else N)
        if kind in INDEX_KINDS:
            return StatefulDataLoader(data, sampler=sampler, batch_size=BATCH, num_workers=2)
        return StatefulDataLoader(data, batch_sampler=sampler, num_workers=2)

    sampler = _local(kind)
    loader = stateful(sampler)
    epoch0 = []
    for batch in loader:
        epoch0.append(batch)
        if not finished and len(epoch0) == len(loader):
            state = loader.state_dict()  # just after the last batch, before StopIteration
    if finished:
        state = loader.state_dict()
    reference = _local(kind)
    reference.set_epoch(1)
    resumed = _local(kind)
    loader = stateful(resumed)
    loader.load_state_dict(state)
    rest = []
    if not finished:
        resumed.set_epoch(0)
        rest = _lists(loader)  # the rest of epoch 0: nothing
    resumed.set_epoch(1)
    assert rest == [] and _lists(loader) == _lists(_loader(kind, reference))


def test_sampler_state_read_directly_while_a_stateful_loader_with_workers_drives_it_is_exact() -> None:
    """sampler.state_dict() under a StatefulDataLoader with workers counts trained batches too."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    sampler = _local("BucketBatchSampler")
    loader = StatefulDataLoader(IndexDataset(N), batch_sampler=sampler, num_workers=2)
    whole = _lists(_loader("BucketBatchSampler", _local("BucketBatchSampler")))
    head = _head(loader, 2)
    resumed = _local("BucketBatchSampler")
    resumed.load_state_dict(sampler.state_dict())
    assert head + _lists(_loader("BucketBatchSampler", resumed)) == whole


# -- Lightning: ckpt_path= mid-epoch and at the epoch end, with and without workers ---------------


def _lightning_loader(name: str, workers: int) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tests.integrations import test_lightning as lt

    sampler = lt.make(name)
    data = IndexDataset(lt.TWO_STREAM_N if name == "TwoStreamBatchSampler" else lt.N)
    settings: dict[str, Any] = {"num_workers": workers, "multiprocessing_context": worker_context() if workers else None}
    if name in lt.INDEX:
        return StatefulDataLoader(data, sampler=sampler, batch_size=4, **settings)
    return StatefulDataLoader(data, batch_sampler=sampler, **settings)


def _lightning_resumes(rank: int, world_size: int, directory: str, combos: list[tuple[str, int, str]]) -> Any:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.integrations import test_lightning as lt

    lt._join_as_ddp(rank)
    out = {}
    for name, workers, point in combos:
        first = lt._module(lambda: _lightning_loader(name, workers), in_hook=True)
        filename = f"{name}-{workers}-{point}"
        if point == "mid":
            saver = ModelCheckpoint(dirpath=directory, filename=filename, every_n_train_steps=2, save_top_k=1,
                                    monitor=None)  # fmt: skip
            lt._trainer(max_epochs=2, enable_checkpointing=True, callbacks=[saver], max_steps=2).fit(first)
        else:
            saver = ModelCheckpoint(dirpath=directory, filename=filename, save_on_train_epoch_end=True, save_top_k=1,
                                    monitor=None)  # fmt: skip
            lt._trainer(max_epochs=1, enable_checkpointing=True, callbacks=[saver]).fit(first)
        second = lt._module(lambda: _lightning_loader(name, workers), in_hook=True)
        lt._trainer(max_epochs=2).fit(second, ckpt_path=os.path.join(directory, filename + ".ckpt"))
        out[filename] = first.seen + second.seen
    return out


LIGHTNING_COMBOS = [(name, workers, point) for name in ("ShardedSampler", "TwoStreamBatchSampler")
                    for workers in (0, 2) for point in ("mid", "end")]  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_lightning_checkpoints_mid_epoch_and_at_epoch_end_resume_exactly_with_and_without_workers(
    lightning_ranks: dict[str, Any],
) -> None:
    """Trainer(ckpt_path=) from a mid-epoch and an epoch-end checkpoint, 0 and 2 workers: the uninterrupted run.

    _lightning_resumes runs in the pair of ranks of tests/integrations/test_lightning.py (tests/conftest.py)."""
    from tests.integrations import test_lightning as lt

    ranks = [rank["crash_resume"] for rank in lightning_ranks["ranks"]]
    for name, workers, point in LIGHTNING_COMBOS:
        for rank in (0, 1):
            whole = [(epoch, batch) for epoch in (0, 1) for batch in lt.expected(name, rank, epoch)]
            assert ranks[rank][f"{name}-{workers}-{point}"] == whole, (name, workers, point, rank)


# -- Accelerate: save_state/load_state mid-epoch and at the epoch end, with and without workers ---


def _accelerate_runs(rank: int, world_size: int, directory: str, combos: list[tuple[int, str]]) -> Any:
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29512")  # fmt: skip
    warnings.filterwarnings("ignore")
    from accelerate import Accelerator, DataLoaderConfiguration

    from shardwise.integrations.accelerate import prepare_data_loader

    def loader(workers: int) -> tuple[Any, Any]:
        """A new Accelerator (as in a new process) and its prepared loader."""
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        settings: dict[str, Any] = {"num_workers": workers, "multiprocessing_context": worker_context() if workers else None}
        sampler = shardwise.BucketBatchSampler(np.arange(N) % 13 + 1, batch_size=BATCH, seed=7)
        data = DataLoader(IndexDataset(N), batch_sampler=sampler, **settings)
        return accelerator, prepare_data_loader(accelerator, data)

    out = {}
    for workers, point in combos:
        state_dir = os.path.join(directory, f"{workers}-{point}")
        accelerator, first = loader(workers)
        trained, start = [], 0
        for epoch in range(EPOCHS):
            first.set_epoch(epoch)
            for step, batch in enumerate(first):
                trained.append([epoch, *map(int, batch)])
                if epoch == 0 and ((point == "mid" and step == 2) or (point == "end_in_loop" and step + 1 == len(first))):
                    accelerator.save_state(state_dir)
            if epoch == 0 and point == "end_after_loop":
                accelerator.save_state(state_dir)
                start = 1
        kept = len([t for t in trained if t[0] == 0]) if point != "mid" else 3
        # Every rank writes the same dl_state_dict.bin (Accelerate's save_state, one node): a rank
        # must not load it while another still writes it. Training's collectives order that; this
        # loop has none, so a barrier does (a rank once read a half-written file under load).
        accelerator.wait_for_everyone()
        accelerator, second = loader(workers)
        accelerator.load_state(state_dir)
        resumed = []
        for epoch in range(start, EPOCHS):
            second.set_epoch(epoch)
            resumed += [[epoch, *map(int, batch)] for batch in second]
        out[f"{workers}-{point}"] = (trained, trained[:kept] + resumed)
    accelerator.wait_for_everyone()
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_accelerate_save_state_mid_epoch_and_at_epoch_end_resumes_exactly_with_and_without_workers(
    tmp_path: Path,
) -> None:
    """save_state mid-epoch, after the last batch or after the loop; load_state into a new loader: the same batches."""
    combos = [(workers, point) for workers in (0, 2) for point in ("mid", "end_in_loop", "end_after_loop")]
    ranks = run_distributed(_accelerate_runs, 2, str(tmp_path), combos, timeout=180)
    for rank in ranks:
        for key, (whole, resumed) in rank.items():
            assert resumed == whole, key
