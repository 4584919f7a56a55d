"""torchdata ``StatefulDataLoader``: a state saved mid-epoch, loaded by a new loader in a new process."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardwise

pytestmark = [
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
    pytest.mark.timeout(120),
]

N = 96


def _loader(kind: str, num_workers: int, context: str | None = None) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    world = {"num_replicas": 2, "rank": 1, "seed": 5}
    extra: dict[str, Any] = {"num_workers": num_workers, "multiprocessing_context": context}
    data = list(range(N))
    if kind == "index":
        return StatefulDataLoader(data, sampler=shardwise.ShardedSampler(N, **world), batch_size=4, **extra)
    sampler = shardwise.TwoStreamBatchSampler(range(24), range(24, N), primary_batch_size=2, secondary_batch_size=2,
                                              **world)  # fmt: skip
    return StatefulDataLoader(data, batch_sampler=sampler, **extra)


def _batches(loader: Any, count: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append([int(i) for i in batch])
        if count is not None and len(out) == count:
            break
    return out


CASES = [(kind, workers) for kind in ("index", "batch") for workers in (0, 2)]


def _continue(states: list[dict[str, Any]], queue: Any) -> None:
    import warnings

    from tests.lockstep import worker_context

    warnings.filterwarnings("ignore")
    out = []
    for (kind, num_workers), state in zip(CASES, states, strict=True):
        # A spawned process spawns its workers by default, each importing torch again (~5 s a loader): fork them
        # (or use a fork server that has imported torch, where fork is unsafe: lockstep.worker_context).
        loader = _loader(kind, num_workers, worker_context() if num_workers else None)
        loader.load_state_dict(state)
        rest = _batches(loader)
        out.append((rest, _batches(loader)))  # the rest of this epoch, then the whole next epoch
    queue.put(out)


def test_state_mid_epoch_continues_in_a_new_process() -> None:
    """A new loader in a new process, loading the mid-epoch state, yields exactly the uninterrupted rest and then
    the next epoch: index and batch samplers, 0 and 2 workers (one new process for the four cases)."""
    expected, heads, states = [], [], []
    for kind, num_workers in CASES:
        whole = _loader(kind, num_workers)
        expected.append((_batches(whole), _batches(whole)))
        first = _loader(kind, num_workers)
        heads.append(_batches(first, 3))
        states.append(first.state_dict())
        del first, whole
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_continue, args=(states, queue))
    process.start()
    resumed = queue.get(timeout=90)
    process.join(timeout=30)
    for case, head, (epoch0, epoch1), (rest, next_epoch) in zip(CASES, heads, expected, resumed, strict=True):
        assert head + rest == epoch0, case
        assert next_epoch == epoch1 != epoch0, case


def test_sampler_state_inside_the_loader_state_is_o1() -> None:
    """The loader state carries the sampler's small global state, not a list of indices."""
    loader = _loader("batch", 0)
    _batches(loader, 2)
    state = loader.state_dict()["_index_sampler_state"]
    assert state["consumed"] == 2 * 2 and state["epoch"] == 0
    assert len(repr(state)) < 1000


def test_to_stateful_keeps_sampling_and_resumes() -> None:
    """to_stateful(loader) keeps the shardwise sampler and makes the loader resumable."""
    from shardwise.integrations.torchdata import to_stateful

    sampler = shardwise.ShardedSampler(N, num_replicas=2, rank=0, seed=3)
    plain = DataLoader(list(range(N)), sampler=sampler, batch_size=4)
    loader = to_stateful(plain)
    assert loader.sampler is sampler and loader.batch_size == 4
    head = _batches(loader, 2)
    state = loader.state_dict()
    again = to_stateful(DataLoader(list(range(N)), sampler=shardwise.ShardedSampler(N, num_replicas=2, rank=0, seed=3),
                                   batch_size=4))  # fmt: skip
    again.load_state_dict(state)
    expected = np.array(list(shardwise.ShardedSampler(N, num_replicas=2, rank=0, seed=3))).reshape(-1, 4).tolist()
    assert head + _batches(again) == expected


def test_one_settings_list_covers_every_dataloader_keyword() -> None:
    """The one list of settings kept on a rebuild names every DataLoader keyword but the sampling ones."""
    import inspect

    from shardwise.integrations.loader_settings import SETTINGS

    sampling = {"dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}
    expected = [name for name in inspect.signature(DataLoader).parameters if name not in sampling]
    assert [s.name for s in SETTINGS] == expected


def test_to_stateful_keeps_every_setting_of_the_list() -> None:
    """to_stateful copies each setting the list marks stateful (in_order: StatefulDataLoader's default)."""
    import torch

    from shardwise.integrations.loader_settings import SETTINGS
    from shardwise.integrations.torchdata import to_stateful

    generator = torch.Generator()
    plain = DataLoader(list(range(N)), sampler=shardwise.ShardedSampler(N, num_replicas=1, rank=0), batch_size=4,
                       num_workers=2, timeout=7.0, prefetch_factor=3, persistent_workers=True, generator=generator,
                       in_order=False, collate_fn=list)  # fmt: skip
    stateful = to_stateful(plain)
    for setting in SETTINGS:
        want = getattr(plain, setting.name) if setting.stateful else True
        assert getattr(stateful, setting.name) == want, setting.name
    assert to_stateful(plain, in_order=False).in_order is False


# -- docs/torchdata.md's recipe with persistent workers (issue 45, item 6) -----------------------


def _recipe_loader(kind: str, world: tuple[int, int]) -> tuple[Any, Any]:
    """A sampler and a persistent-workers loader whose epoch (4 batches a rank) fits the prefetch window (2 x 2)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    size, rank = world
    n = 8 * size
    where = {"num_replicas": size, "rank": rank, "seed": 11}
    settings: dict[str, Any] = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True}
    sampler: Any
    if kind == "index":
        sampler = shardwise.ShardedSampler(n, **where)
        return sampler, StatefulDataLoader(list(range(n)), sampler=sampler, batch_size=2, **settings)
    if kind == "shard_batches":
        from torch.utils.data import BatchSampler, RandomSampler

        sampler = shardwise.shard_batches(BatchSampler(RandomSampler(range(n)), 2, drop_last=False), **where)
    else:
        sampler = shardwise.BucketBatchSampler(np.arange(n) % 3 + 1, batch_size=2, **where)
    return sampler, StatefulDataLoader(list(range(n)), batch_sampler=sampler, **settings)


def _recipe(kind: str, world: tuple[int, int], epochs: range, state: dict[str, Any] | None) -> tuple[Any, Any]:
    """docs/torchdata.md's loop: set_epoch each epoch, the loader's state saved after the loop (as epoch + 1)."""
    sampler, loader = _recipe_loader(kind, world)
    if state is not None:
        loader.load_state_dict(state)
    drawn = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        drawn.append(_batches(loader))
        state = loader.state_dict()
    return drawn, state


@pytest.mark.parametrize("world", [(1, 0), (3, 2)], ids=["W1", "W3-rank2"])
@pytest.mark.parametrize("kind", ["index", "shard_batches", "bucket"])
def test_recipe_with_persistent_workers_resumes_at_the_next_epoch(kind: str, world: tuple[int, int]) -> None:
    """A state saved after epoch 0 resumes at epoch 1, then 2, when the epoch fits the prefetch window.

    torchdata restores a finished state in an iterator that prefetches the next epoch and, with
    persistent workers, restarts that same iterator: the epoch it only prefetched is not trained.
    """
    whole, _ = _recipe(kind, world, range(3), None)
    head, state = _recipe(kind, world, range(1), None)
    rest, _ = _recipe(kind, world, range(1, 3), state)
    assert head + rest == whole
    assert whole[1] != whole[2]


# -- another world size after snapshot_every_n_steps > 1 (issue 45, item 7) -----------------------

STEPS_N = 48  # 8 steps a rank at W=3 (batch 2)


def _snapshot_loader(context: str | None = None, **world: Any) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tests.lockstep import worker_context

    sampler = shardwise.ShardedSampler(STEPS_N, seed=4, **world)
    return StatefulDataLoader(list(range(STEPS_N)), sampler=sampler, batch_size=2, num_workers=2,
                              snapshot_every_n_steps=3, multiprocessing_context=context or worker_context())  # fmt: skip


def _save_after_5_and_6() -> tuple[list[int], dict[str, Any], dict[str, Any]]:
    """The saving job's three ranks in lockstep here (their workers fork from this process, which runs no process
    group): six steps; rank 0's loader state after step 5 (2 steps past a snapshot) and after step 6."""
    loaders = [_snapshot_loader("fork", num_replicas=3, rank=rank) for rank in range(3)]
    trained: list[int] = []
    states = []
    for step, batches in enumerate(zip(*loaders, strict=True), start=1):
        trained += [int(i) for batch in batches for i in batch]
        states.append(loaders[0].state_dict())
        if step == 6:
            break
    return trained, states[4], states[5]


def _resume(rank: int, world_size: int, replayed: dict[str, Any], at_snapshot: dict[str, Any]) -> tuple[str, list[int]]:
    """Job 2: load the state past a snapshot (the refusal's message), then the one at a snapshot and train the rest."""
    import torch
    import torch.distributed as dist

    loader = _snapshot_loader()
    loader.load_state_dict(replayed)
    with pytest.raises(shardwise.StateMismatchError) as refused:
        iter(loader)
    loader = _snapshot_loader()
    loader.load_state_dict(at_snapshot)
    trained = []
    for batch in loader:
        dist.all_reduce(torch.ones(1))
        trained += [int(i) for i in batch]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, trained)
    return str(refused.value), [i for part in gathered for i in part]


def test_a_snapshot_replayed_at_another_world_size_is_refused_and_one_at_its_step_resumes_exactly() -> None:
    """3 -> 2 real gloo ranks: a state 2 steps past torchdata's snapshot (replayed at W=2: 4 samples repeated) is
    refused, naming the fix; a state at a snapshot step (nothing replayed) resumes with every sample once."""
    from shardwise.tools.launch import run_distributed

    trained, after_5, after_6 = _save_after_5_and_6()
    message, rest = run_distributed(_resume, 2, after_5, after_6)[0]
    assert "world_size=3" in message and "snapshot_every_n_steps=1" in message and "repeat" in message
    assert sorted(trained + rest) == list(range(STEPS_N))
