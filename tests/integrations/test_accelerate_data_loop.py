"""Accelerate's own distributed data-loop checks, run on 2 gloo ranks with shardwise samplers through the helper.

Adapted from accelerate 1.15's ``test_utils/scripts/test_distributed_data_loop.py`` (even batch sizes, even_batches
disabled, ``gather_for_metrics`` over every element with and without shuffling, through a batch sampler and with
workers, stateful resume by ``load_state_dict`` and by ``save_state``) and ``test_script.py``'s custom sampler check
(the user's sampler is the one the prepared loader samples with), plus what shardwise adds: an index sampler's state
resumed at another world size, and the refusals that name their fix. One distributed run (a few seconds); each test
reads its check.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

import shardwise
from shardwise.tools.launch import run_distributed
from tests.lockstep import worker_context

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),  # torchdata 0.11 on torch 2.13
]

NUM_ELEMENTS, BATCH_SIZE, NUM_WORKERS = 22, 4, 2  # accelerate's script: 22, 4, 4 workers
RESUME_N, RESUME_BATCH = 24, 3


class DummyDataset(Dataset[dict[str, int]]):
    """accelerate's: each element its index and a label."""

    def __len__(self) -> int:
        return NUM_ELEMENTS

    def __getitem__(self, index: int) -> dict[str, int]:
        return {"index": index, "label": index % 2}


def _gathered(accelerator: Any, loader: Any) -> list[int]:
    """accelerate's test_data_loader: every index gather_for_metrics returns over one epoch."""
    seen: list[int] = []
    for batch in loader:
        index, _ = accelerator.gather_for_metrics((batch["index"], batch["label"]))
        seen += index.tolist()
    return seen


def _resume_loader(accelerator: Any) -> Any:
    from shardwise.integrations.accelerate import prepare_data_loader

    sampler = shardwise.ShardedSampler(RESUME_N, seed=5)
    return prepare_data_loader(accelerator, DataLoader(list(range(RESUME_N)), sampler=sampler, batch_size=RESUME_BATCH))


def _checks(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29517")  # fmt: skip
    warnings.filterwarnings("ignore")
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.state import AcceleratorState

    from shardwise.integrations.accelerate import prepare_data_loader

    def refusal(accelerator: Any, loader: Any) -> str:
        try:
            prepare_data_loader(accelerator, loader)
        except ValueError as error:
            return str(error)
        return "accepted"

    def sequential_batches(n: int, size: int) -> Any:
        return shardwise.shard_batches(BatchSampler(SequentialSampler(range(n)), size, False))

    out: dict[str, Any] = {}
    # Without cpu=True, Accelerate runs each process of this CPU job as a world of 1 beside the group of 2.
    out["world"] = refusal(Accelerator(), DataLoader(range(8), sampler=shardwise.ShardedSampler(8), batch_size=2))
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True)
    out["split"] = refusal(Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True)),
                           DataLoader(range(8), sampler=shardwise.ShardedSampler(8), batch_size=4))  # fmt: skip

    # test_default_ensures_even_batch_sizes / test_can_disable_even_batches: each rank's batch sizes.
    def sizes(acc: Any, loader: DataLoader[Any]) -> list[int]:
        return [len(batch) for batch in prepare_data_loader(acc, loader)]

    uneven = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))

    def index(n: int, size: int) -> DataLoader[Any]:
        return DataLoader(range(n), sampler=shardwise.ShardedSampler(n, shuffle=False), batch_size=size)

    out["sizes"] = {
        "index-3-1": sizes(accelerator, index(3, 1)),
        "index-7-2": sizes(accelerator, index(7, 2)),
        "batches-7-2": sizes(accelerator, DataLoader(range(7), batch_sampler=sequential_batches(7, 2))),
        "uneven-batches-7-2": sizes(uneven, DataLoader(range(7), batch_sampler=sequential_batches(7, 2))),
        "uneven-index-3-1": sizes(uneven, index(3, 1)),
    }

    # test_data_loader: gather_for_metrics returns every element once; custom_sampler_check: the sampler is kept.
    workers = {"num_workers": NUM_WORKERS, "multiprocessing_context": worker_context()}
    dataset = DummyDataset()
    gathered, kept = {}, {}
    for name, shuffle, settings in (("shuffle=False", False, {}), ("shuffle=True", True, {}),
                                    ("workers", True, workers)):  # fmt: skip
        sampler = shardwise.ShardedSampler(dataset, shuffle=shuffle, seed=3)
        loader = prepare_data_loader(accelerator, DataLoader(dataset, sampler=sampler, batch_size=BATCH_SIZE,
                                                             **settings))  # fmt: skip
        gathered[name], kept[name] = _gathered(accelerator, loader), loader.sampler is sampler
        out[f"total_batch_size-{name}"] = loader.total_batch_size
    batches = shardwise.shard_batches(BatchSampler(RandomSampler(dataset), BATCH_SIZE, drop_last=False), seed=3)
    loader = prepare_data_loader(accelerator, DataLoader(dataset, batch_sampler=batches))
    gathered["batch_sampler"], kept["batch_sampler"] = _gathered(accelerator, loader), loader.batch_sampler is batches
    out["gathered"], out["kept"] = gathered, kept

    # test_stateful_dataloader(_save_state) with an index sampler, saved mid-epoch 1 (load_state_dict, save_state).
    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    resume = {}
    for how in ("load_state_dict", "save_state", "save_state, no set_epoch"):
        first = Accelerator(cpu=True, dataloader_config=config)
        loader = _resume_loader(first)
        loader.set_epoch(0)
        list(loader)
        loader.set_epoch(1)
        rest, state = [], None
        for step, batch in enumerate(loader):
            if step == 1:
                if how.startswith("save_state"):
                    first.save_state(os.path.join(directory, "state"))
                else:
                    state = loader.state_dict()
            if step > 1:
                rest.append(batch.tolist())
        first.wait_for_everyone()  # every rank has written its loader state before any reads it
        second = Accelerator(cpu=True, dataloader_config=config)
        again = _resume_loader(second)
        if how.startswith("save_state"):
            second.load_state(os.path.join(directory, "state"))
        else:
            again.load_state_dict(state)
        if how != "save_state, no set_epoch":
            again.set_epoch(1)  # the docs' recipe; without it the loaded epoch continues
        resume[how] = (rest, [batch.tolist() for batch in again])
        second.wait_for_everyone()  # every rank has loaded before the next round writes
    out["resume"] = resume

    # Last, as it aborted the process group before: gather at every step, a short last batch in the plan.
    loader = prepare_data_loader(accelerator, DataLoader(range(7), batch_sampler=sequential_batches(7, 2)))
    out["short"] = [accelerator.gather_for_metrics(batch).tolist() for batch in loader]
    accelerator.wait_for_everyone()
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    directory = tmp_path_factory.mktemp("accelerate-loop")
    return run_distributed(_checks, 2, str(directory), timeout=150), directory


def test_gather_for_metrics_returns_every_element_once(ranks: tuple[list[dict[str, Any]], Path]) -> None:
    """accelerate's test_data_loader: 22 elements over 2 ranks, batch 4, shuffled or not, workers, a batch sampler."""
    for rank in ranks[0]:
        for name, seen in rank["gathered"].items():
            assert sorted(seen) == list(range(NUM_ELEMENTS)), name
        for name in ("shuffle=False", "shuffle=True", "workers"):
            assert rank[f"total_batch_size-{name}"] == 2 * BATCH_SIZE


def test_the_users_sampler_is_the_one_the_prepared_loader_samples_with(
    ranks: tuple[list[dict[str, Any]], Path],
) -> None:
    """accelerate's custom_sampler_check: prepare keeps the sampler (index or batch) the loader was built with."""
    for rank in ranks[0]:
        assert all(rank["kept"].values()), rank["kept"]


def test_every_rank_has_the_same_batch_sizes_and_even_batches_false_keeps_a_short_batch(
    ranks: tuple[list[dict[str, Any]], Path],
) -> None:
    """accelerate's even-batch checks: even_batches=True gives one shape a step; False keeps shard_batches' short one."""
    first, second = (rank["sizes"] for rank in ranks[0])
    assert first["index-3-1"] == second["index-3-1"] == [1, 1]
    assert first["index-7-2"] == second["index-7-2"] == [2, 2]
    assert first["batches-7-2"] == second["batches-7-2"] == [2, 2]
    assert (first["uneven-batches-7-2"], second["uneven-batches-7-2"]) == ([2, 2], [2, 1])
    # Accelerate gives rank 1 one batch fewer here ([1, 1], [1]); shardwise gives every rank the same steps.
    assert first["uneven-index-3-1"] == second["uneven-index-3-1"] == [1, 1]


def test_a_short_last_batch_is_gathered_not_aborted(ranks: tuple[list[dict[str, Any]], Path]) -> None:
    """shard_batches' short last batch: completed on its rank, gathered, and gather_for_metrics drops the padding."""
    for rank in ranks[0]:
        assert rank["short"] == [[0, 1, 2, 3], [4, 5, 6]]


def test_index_sampler_resumes_mid_epoch_through_accelerate(ranks: tuple[list[dict[str, Any]], Path]) -> None:
    """accelerate's stateful resume checks, an index sampler saved mid-epoch 1: the resumed rest is the rest."""
    for rank in ranks[0]:
        for how, (rest, resumed) in rank["resume"].items():
            assert resumed == rest and len(rest) == 2, how


def test_index_sampler_state_resumes_at_another_world_size(ranks: tuple[list[dict[str, Any]], Path]) -> None:
    """save_state at 2 ranks after 2 steps of epoch 1, load_state in 1 process: every sample of the epoch once."""
    from accelerate import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    loader = _resume_loader(accelerator)
    accelerator.load_state(str(ranks[1] / "state"))
    loader.set_epoch(1)
    resumed = [i for batch in loader for i in batch.tolist()]
    trained = []
    for rank in (0, 1):  # what each rank trained of epoch 1 before the save: its first two batches
        sampler = shardwise.ShardedSampler(RESUME_N, seed=5, num_replicas=2, rank=rank)
        sampler.set_epoch(1)
        trained += list(sampler)[: 2 * RESUME_BATCH]
    assert sorted(trained + resumed) == list(range(RESUME_N))


def test_refusals_name_their_fix(ranks: tuple[list[dict[str, Any]], Path]) -> None:
    """An Accelerator of 1 process beside a group of 2 names cpu=True; split_batches=True names the per-rank batch."""
    for rank in ranks[0]:
        assert "sees 2 ranks (torch.distributed)" in rank["world"] and "Accelerator(cpu=True)" in rank["world"]
        assert "split_batches=True" in rank["split"] and "batch_size=2 for 4 over 2 processes" in rank["split"]


def test_split_batches_and_a_world_mismatch_are_refused_in_one_process() -> None:
    """The same refusals at construction in one process (a sampler pinned by arguments is the user's choice)."""
    from accelerate import Accelerator, DataLoaderConfiguration

    from shardwise.integrations.accelerate import prepare_data_loader

    split = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    with pytest.raises(ValueError, match=r"keep Accelerator's split_batches=False"):
        prepare_data_loader(
            split,
            DataLoader(range(8), batch_sampler=shardwise.BucketBatchSampler([1] * 8, batch_size=2, num_replicas=1)),
        )
    pinned = shardwise.ShardedSampler(8, num_replicas=2, rank=0)
    assert len(prepare_data_loader(Accelerator(cpu=True), DataLoader(range(8), sampler=pinned, batch_size=2))) == 2


def test_gather_for_metrics_warns_where_the_padding_cannot_be_cut_exactly() -> None:
    """An index plan of 22 on 3 ranks pads inside two ranks' last batches: reading the remainder there warns once."""
    from accelerate import Accelerator

    from shardwise.integrations.accelerate import prepare_data_loader

    accelerator = Accelerator(cpu=True)
    sampler = shardwise.ShardedSampler(22, num_replicas=3, rank=0, shuffle=False)
    loader = prepare_data_loader(accelerator, DataLoader(range(22), sampler=sampler, batch_size=3))
    assert loader.total_batch_size == 9  # 8 samples a rank: batches of 3, 3, 2
    batches = iter(loader)
    next(batches)
    accelerator.gather_for_metrics(next(batches))  # not the last step: nothing to cut, no warning
    next(batches)
    with pytest.warns(RuntimeWarning, match=r"inside the batches of ranks \[1, 2\].*drop_last=True"):
        assert accelerator.gradient_state.end_of_dataloader and accelerator.gradient_state.remainder == -1
    assert accelerator.gradient_state.remainder == -1  # once
    list(batches)
    pinned = shardwise.ShardedSampler(22, num_replicas=3, rank=0, shuffle=False, drop_last=True)
    loader = prepare_data_loader(accelerator, DataLoader(range(22), sampler=pinned, batch_size=4))
    for _batch in loader:
        assert accelerator.gradient_state.remainder == 0  # no padding: the whole step, no warning


def test_the_prepared_loader_pickles() -> None:
    """accelerate's test_pickle_accelerator, for the loader: a pickled prepared loader yields the same batches."""
    import pickle

    from accelerate import Accelerator

    from shardwise.integrations.accelerate import prepare_data_loader

    sampler = shardwise.ShardedSampler(8, seed=1)
    loader = prepare_data_loader(Accelerator(cpu=True), DataLoader(list(range(8)), sampler=sampler, batch_size=2))
    again = pickle.loads(pickle.dumps(loader))
    assert [b.tolist() for b in again] == [b.tolist() for b in loader] and again.total_batch_size == 2
