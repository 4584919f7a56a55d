"""TwoStreamBatchSampler: batch layout, the endless secondary stream, drop_last, warnings, bad input, real ranks."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Sampler

from shardwise import StateMismatchError, TwoStreamBatchSampler
from shardwise.samplers.two_stream import SMALL_STREAM
from shardwise.tools.launch import run_distributed
from tests.lockstep import lockstep_epochs
from tests.memcap import first_units_under_cap

PRIMARY = np.arange(100, 130)  # 30 labelled
SECONDARY = np.arange(0, 7)  # 7 unlabelled: small, so a pass spans many secondary cycles


def make(**kw) -> TwoStreamBatchSampler:
    options = {"primary_batch_size": 4, "secondary_batch_size": 3, "num_replicas": 1, "rank": 0, "seed": 5}
    options.update(kw)
    return TwoStreamBatchSampler(PRIMARY, SECONDARY, **options)


def test_each_batch_is_primary_then_secondary() -> None:
    """A batch is primary_batch_size primary indices followed by secondary_batch_size secondary ones."""
    sampler = make()
    batches = list(sampler)
    assert len(batches) == len(sampler) == 30 // 4
    for batch in batches:
        assert len(batch) == sampler.batch_size == 7
        assert set(batch[:4]) <= set(PRIMARY.tolist())
        assert set(batch[4:]) <= set(SECONDARY.tolist())
    assert isinstance(sampler, Sampler)


def test_one_epoch_is_one_pass_over_the_primary_indices() -> None:
    """drop_last=True: distinct primary indices, only the short group left out; False: every one once."""
    dropped = [i for batch in make() for i in batch[:4]]
    assert len(dropped) == len(set(dropped)) == 28
    kept_sampler = make(drop_last=False)
    kept = list(kept_sampler)
    assert len(kept) == len(kept_sampler) == 8
    assert [len(batch) for batch in kept] == [7] * 7 + [2 + 3]
    assert sorted(i for batch in kept for i in batch if i >= 100) == PRIMARY.tolist()


def test_secondary_stream_cycles_are_fresh_shuffles() -> None:
    """Every cycle of the secondary stream is a permutation of the secondary indices; cycles differ."""
    stream = [i for batch in make(secondary_batch_size=5) for i in batch[4:]]
    cycles = [stream[k : k + 7] for k in range(0, len(stream) - 6, 7)]
    assert len(cycles) >= 4
    assert all(sorted(cycle) == SECONDARY.tolist() for cycle in cycles)
    assert len({tuple(cycle) for cycle in cycles}) > 1


def test_large_secondary_sets_use_keyed_permutations_per_cycle() -> None:
    """Above SMALL_STREAM secondary indices a cycle is a keyed permutation: still a full shuffle."""
    secondary = np.arange(1_000, 1_000 + SMALL_STREAM + 5)
    sampler = TwoStreamBatchSampler(
        PRIMARY, secondary, primary_batch_size=2, secondary_batch_size=700, num_replicas=1, rank=0
    )
    stream = [i for batch in sampler for i in batch[2:]]
    assert sorted(stream[: len(secondary)]) == secondary.tolist()
    assert stream[: len(secondary)] != secondary.tolist()


def test_secondary_stream_restarts_each_epoch_with_a_new_order() -> None:
    """Each epoch starts a new stream (a full first cycle) in a new order, and a new primary order."""
    sampler = make(secondary_batch_size=7)
    first, second = list(sampler), list(sampler)
    assert sorted(first[0][4:]) == sorted(second[0][4:]) == SECONDARY.tolist()
    assert first != second
    assert [b[:4] for b in first] != [b[:4] for b in second]


def test_primary_indices_are_disjoint_across_ranks_and_lengths_equal() -> None:
    """Ranks take batches r, r+W, ...: disjoint primary indices, the same number of batches."""
    for world_size in (2, 3, 4):
        seen: list[int] = []
        lengths = set()
        for rank in range(world_size):
            sampler = make(num_replicas=world_size, rank=rank)
            batches = list(sampler)
            lengths.add(len(batches))
            seen += [i for batch in batches for i in batch[:4]]
        assert len(lengths) == 1
        assert len(seen) == len(set(seen))


def test_plan_does_not_depend_on_world_size() -> None:
    """The global plan read at W=3 (interleaving ranks) equals the plan at W=1."""
    plan = list(make(drop_last=False))
    per_rank = [list(make(drop_last=False, num_replicas=3, rank=r)) for r in range(3)]
    interleaved = [per_rank[k % 3][k // 3] for k in range(3 * len(per_rank[0]))]
    assert interleaved[: len(plan)] == plan
    assert interleaved[len(plan) :] == plan[: len(interleaved) - len(plan)]  # padding wraps to the start


def test_secondary_batch_size_zero_needs_no_secondary_indices() -> None:
    """secondary_batch_size=0 gives primary-only batches and accepts empty secondary indices."""
    sampler = TwoStreamBatchSampler(PRIMARY, [], primary_batch_size=8, secondary_batch_size=0, num_replicas=1, rank=0)
    assert sampler.batch_size == 8
    assert all(len(batch) == 8 for batch in sampler)


def test_many_secondary_cycles_per_batch() -> None:
    """A secondary part longer than the secondary set wraps through several cycles inside one batch."""
    sampler = TwoStreamBatchSampler(
        PRIMARY, [3, 4], primary_batch_size=2, secondary_batch_size=9, num_replicas=1, rank=0, drop_last=False
    )
    for batch in sampler:
        assert Counter(batch[2:]) in (Counter({3: 5, 4: 4}), Counter({3: 4, 4: 5}))


def test_overlapping_streams_warn() -> None:
    """Primary and secondary indices that overlap are allowed, with a UserWarning naming the overlap."""
    with pytest.warns(UserWarning, match="share 2 indices"):
        sampler = TwoStreamBatchSampler(
            [1, 2, 3, 4], [3, 4, 5], primary_batch_size=2, secondary_batch_size=1, num_replicas=1, rank=0
        )
    assert len(list(sampler)) == 2


def test_works_as_a_dataloader_batch_sampler() -> None:
    """DataLoader(batch_sampler=...) yields tensors of batch_size items."""
    dataset = torch.arange(200)
    loader = DataLoader(dataset, batch_sampler=make())
    batches = list(loader)
    assert len(batches) == 7
    assert all(batch.shape == (7,) for batch in batches)


def test_state_resumes_and_refuses_other_data() -> None:
    """A mid-epoch state resumes the same batches; a state of other indices is refused by name."""
    sampler = make()
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(3)]
    state = sampler.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == list(make())
    other = TwoStreamBatchSampler(PRIMARY + 1, SECONDARY, primary_batch_size=4, secondary_batch_size=3, seed=5)
    with pytest.raises(StateMismatchError, match="primary_digest"):
        other.load_state_dict(state)
    with pytest.raises(StateMismatchError, match="secondary_batch_size"):
        make(secondary_batch_size=2).load_state_dict(state)


def test_pickles_mid_epoch_and_repr_shows_configuration() -> None:
    """Pickling carries the state (its next pass starts the epoch, loading it resumes); repr names sizes, batch
    sizes, drop_last, seed and world."""
    sampler = make()
    iterator = iter(sampler)
    next(iterator)
    clone = pickle.loads(pickle.dumps(sampler))
    assert list(clone) == list(make())
    clone = pickle.loads(pickle.dumps(sampler))
    clone.load_state_dict(sampler.state_dict())
    assert list(clone) == list(make())[1:]
    text = repr(make())
    for part in ("primary=30", "secondary=7", "primary_batch_size=4", "secondary_batch_size=3", "drop_last=True"):
        assert part in text


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"primary_indices": [[1, 2]]}, ValueError, "primary_indices should be a 1-D sequence"),
        ({"primary_indices": []}, ValueError, "primary_indices should hold at least one index"),
        ({"primary_indices": [1.0, 2.0]}, TypeError, "primary_indices should hold integer indices"),
        ({"primary_indices": [True, False]}, TypeError, "primary_indices should hold integer indices"),
        ({"primary_indices": [3, -1]}, ValueError, r"non-negative indices, but got primary_indices\[1\]=-1"),
        ({"secondary_indices": [0.5]}, TypeError, "secondary_indices should hold integer indices"),
        ({"secondary_indices": [-2]}, ValueError, "secondary_indices should hold non-negative"),
        ({"secondary_indices": []}, ValueError, "secondary_indices should hold at least one index when"),
        ({"primary_batch_size": 0}, ValueError, "primary_batch_size should be a positive integer"),
        ({"primary_batch_size": True}, TypeError, "primary_batch_size should be an integer"),
        ({"primary_batch_size": 5}, ValueError, "primary_batch_size should be at most the 4 primary indices"),
        ({"secondary_batch_size": -1}, ValueError, "secondary_batch_size should be a non-negative integer"),
        ({"secondary_batch_size": 1.5}, TypeError, "secondary_batch_size should be an integer"),
        ({"drop_last": 1}, TypeError, "drop_last should be True or False"),
        ({"seed": -3}, ValueError, "seed should be a non-negative integer"),
        ({"num_replicas": 0}, ValueError, "num_replicas"),
    ],
)
def test_bad_input_is_refused_naming_the_parameter(kwargs: dict, error: type, match: str) -> None:
    """Every bad argument fails at construction with a message naming it."""
    options = {
        "primary_indices": [0, 1, 2, 3],
        "secondary_indices": [7, 8],
        "primary_batch_size": 2,
        "secondary_batch_size": 1,
    }
    options.update(kwargs)
    with pytest.raises(error, match=match):
        TwoStreamBatchSampler(options.pop("primary_indices"), options.pop("secondary_indices"), **options)


def _two_stream_main(rank: int, world_size: int) -> list[list[list[int]]]:
    sampler = TwoStreamBatchSampler(PRIMARY, SECONDARY, primary_batch_size=3, secondary_batch_size=2, seed=11)
    loader = DataLoader(torch.arange(200), batch_sampler=sampler)
    return lockstep_epochs(loader, sampler)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [3])
def test_real_ranks_step_together_with_disjoint_primary(world_size: int) -> None:
    """On W gloo ranks: equal steps, disjoint primary indices, and together exactly the W=1 plan."""
    reports = run_distributed(_two_stream_main, world_size, timeout=180)
    for epoch in range(2):
        steps = {len(report[epoch]) for report in reports}
        assert steps == {30 // 3 // world_size}
        primary = [i for report in reports for batch in report[epoch] for i in batch[:3]]
        assert len(primary) == len(set(primary))
        single = TwoStreamBatchSampler(
            PRIMARY, SECONDARY, primary_batch_size=3, secondary_batch_size=2, seed=11, num_replicas=1, rank=0
        )
        single.set_epoch(epoch)
        plan = list(single)
        for rank, report in enumerate(reports):
            assert report[epoch] == plan[rank::world_size][: len(report[epoch])]


def test_builds_and_iterates_over_memmaps_under_a_memory_cap(tmp_path) -> None:
    """1e7 memory-mapped indices: a process capped at 64 MiB of private memory checks the overlap and iterates."""
    n = 10**7
    values = np.arange(n, dtype=np.int64)
    for name, part in (("primary", values[values % 10 == 3]), ("secondary", values[values % 10 != 3])):
        np.save(tmp_path / f"{name}.npy", part)
    del values, part
    options = {"primary_batch_size": 16, "secondary_batch_size": 48, "num_replicas": 8, "rank": 3, "seed": 1}
    load = f"""
        import warnings
        warnings.simplefilter("error")  # the lists are disjoint: no overlap warning
        primary = np.load({str(tmp_path / "primary.npy")!r}, mmap_mode="r")
        secondary = np.load({str(tmp_path / "secondary.npy")!r}, mmap_mode="r")
    """
    make = f"shardwise.TwoStreamBatchSampler(primary, secondary, cache_dir={str(tmp_path / 'cache')!r}, **{options!r})"
    first = first_units_under_cap(load, make, n=n, first=3, skip=3_000)
    lists = [np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in ("primary", "secondary")]
    with pytest.warns(RuntimeWarning, match="private memory"):
        uncached = TwoStreamBatchSampler(*lists, cache_dir=False, **options)
    batches = iter(uncached)
    assert first == str([next(batches) for _ in range(3)])


def test_pickles_memory_mapped_lists_by_reference(tmp_path) -> None:
    """A sampler over memory-mapped index lists pickles as file names (a small blob) and yields the same batches."""
    np.save(tmp_path / "primary.npy", np.arange(0, 2**18, 2))
    np.save(tmp_path / "secondary.npy", np.arange(1, 2**18, 2))
    lists = [np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in ("primary", "secondary")]
    sampler = TwoStreamBatchSampler(*lists, primary_batch_size=64, secondary_batch_size=64, cache_dir=tmp_path / "c")
    blob = pickle.dumps(sampler)
    assert len(blob) < 20_000
    assert list(pickle.loads(blob)) == list(sampler)


def test_docstring_example_runs() -> None:
    """The module's Example sections run as written."""
    import doctest

    from shardwise.samplers import two_stream as _two_stream

    assert doctest.testmod(_two_stream, optionflags=doctest.ELLIPSIS).failed == 0
