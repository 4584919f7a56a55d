"""ClassBalancedBatchSampler: P x K layout, what an epoch covers, small classes, quotas, bad input, real ranks."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardwise import ClassBalancedBatchSampler, SmallClasses, StateMismatchError
from shardwise._core.class_buckets import group_by_class
from shardwise._core.class_index import count_classes
from shardwise._core.classes import EpochLayout, keyed_shuffle
from shardwise.samplers.class_balanced import class_quotas
from shardwise.tools.launch import run_distributed
from tests.lockstep import lockstep_epochs
from tests.memcap import first_units_under_cap

RNG = np.random.default_rng(2024)
LABELS = RNG.integers(0, 20, 2_000)  # 20 classes of about 100


def make(labels=LABELS, **kw) -> ClassBalancedBatchSampler:
    options = {"classes_per_batch": 4, "samples_per_class": 3, "num_replicas": 1, "rank": 0, "seed": 1}
    options.update(kw)
    return ClassBalancedBatchSampler(labels, **options)


def groups(batch: list[int], samples_per_class: int) -> list[list[int]]:
    return [batch[k : k + samples_per_class] for k in range(0, len(batch), samples_per_class)]


def test_every_batch_has_p_distinct_classes_of_k_distinct_samples() -> None:
    """A batch is P consecutive groups of K indices; a group shares a label, labels differ across groups."""
    sampler = make()
    batches = list(sampler)
    assert len(batches) == len(sampler) == 2_000 // 12
    for batch in batches:
        assert len(batch) == sampler.batch_size == 12
        labels = [set(LABELS[group].tolist()) for group in groups(batch, 3)]
        assert all(len(label) == 1 for label in labels)
        assert len(set.union(*labels)) == 4
        assert len(set(batch)) == 12


def test_classes_meet_many_other_classes_within_an_epoch() -> None:
    """Row swaps mix the layout: in one epoch each of 20 classes shares batches with most others."""
    partners: dict[int, set[int]] = {}
    for batch in make():
        classes = set(LABELS[batch].tolist())
        for label in classes:
            partners.setdefault(label, set()).update(classes - {label})
    assert min(len(others) for others in partners.values()) >= 12


def test_an_epoch_sees_each_sample_about_once() -> None:
    """An epoch has N // (P*K) batches; almost every sample appears, none more than twice."""
    counts = Counter(i for batch in make() for i in batch)
    assert sum(counts.values()) == (2_000 // 12) * 12
    assert len(counts) >= 0.95 * 2_000
    assert max(counts.values()) <= 2


def test_classes_take_part_in_proportion_to_their_size() -> None:
    """Class c gets n_c / K groups per epoch, rounded up or down (within one group)."""
    labels = np.repeat(np.arange(6), [30, 60, 90, 120, 150, 150])
    sampler = make(labels, classes_per_batch=3, samples_per_class=5)
    uses = Counter(int(labels[batch[k]]) for batch in sampler for k in range(0, 15, 5))
    for label, size in enumerate([30, 60, 90, 120, 150, 150]):
        assert abs(uses[label] - size / 5) <= 1


def test_a_class_too_large_for_its_share_appears_once_per_batch() -> None:
    """A class holding more than 1/P of the data is capped at one group per batch; others share the rest."""
    labels = np.concatenate([np.zeros(900, dtype=int), np.repeat(np.arange(1, 11), 10)])
    sampler = make(labels, classes_per_batch=2, samples_per_class=2)
    batches = list(sampler)
    assert len(batches) == 1_000 // 4
    assert all(0 in labels[batch].tolist() for batch in batches)
    assert all(len(set(labels[batch].tolist())) == 2 for batch in batches)


def test_a_rare_class_takes_part_in_proportion_over_epochs() -> None:
    """A class whose share is a fraction of a group appears in about that fraction of epochs."""
    labels = np.array([0] * 40 + [1] * 40 + [2])
    sampler = make(labels, classes_per_batch=2, samples_per_class=4)
    appearances = sum(80 in {i for batch in _epoch(sampler, epoch) for i in batch} for epoch in range(400))
    share = (81 // 8) * 2 / 81  # slots per epoch x class share: 0.247 groups
    assert abs(appearances / 400 - share) < 0.07


def test_small_classes_replace_repeats_their_samples() -> None:
    """small_classes='replace' keeps a class smaller than K, repeating its samples within the group."""
    labels = np.array([0] * 10 + [1] * 10 + [2] * 2)
    sampler = make(labels, classes_per_batch=2, samples_per_class=4, small_classes="replace")
    assert sampler.small_classes is SmallClasses.REPLACE
    found = [group for epoch in range(30) for batch in _epoch(sampler, epoch) for group in groups(batch, 4)]
    small = [group for group in found if group[0] >= 20]
    assert small
    assert all(Counter(group) == Counter({20: 2, 21: 2}) for group in small)
    assert all(len(set(group)) == 4 for group in found if group[0] < 20)


def _epoch(sampler: ClassBalancedBatchSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_small_classes_exclude_leaves_them_out() -> None:
    """small_classes='exclude' never draws a class with fewer than K samples."""
    labels = np.array([0] * 10 + [1] * 10 + [2] * 3)
    sampler = make(labels, classes_per_batch=2, samples_per_class=4, small_classes=SmallClasses.EXCLUDE)
    drawn = {i for epoch in range(10) for batch in _epoch(sampler, epoch) for i in batch}
    assert drawn == set(range(20))
    assert sampler.classes.tolist() == [0, 1]


def test_string_labels_are_classes() -> None:
    """String labels work like integer labels."""
    labels = ["cat", "dog", "eel", "cat", "dog", "eel", "cat", "dog", "eel"]
    sampler = make(labels, classes_per_batch=3, samples_per_class=2)
    for batch in sampler:
        assert {labels[i] for i in batch} == {"cat", "dog", "eel"}


def test_epochs_differ_and_seeds_reproduce() -> None:
    """Orders differ between epochs; the same (seed, epoch) gives the same plan."""
    sampler = make()
    first, second = list(sampler), list(sampler)
    assert first != second
    assert list(make()) == first
    assert list(make(seed=2)) != first


def test_ranks_take_whole_batches_disjointly() -> None:
    """Rank r of W takes whole batches r, r+W, ...; together one epoch's plan, the same length on all."""
    plan = list(make(drop_last=True))
    per_rank = [list(make(drop_last=True, num_replicas=3, rank=r)) for r in range(3)]
    assert len({len(batches) for batches in per_rank}) == 1
    assert [per_rank[k % 3][k // 3] for k in range(3 * len(per_rank[0]))] == plan[: 3 * len(per_rank[0])]


def test_state_resumes_and_refuses_other_labels() -> None:
    """A mid-epoch state resumes exactly; a state from other labels is refused by name."""
    sampler = make()
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(5)]
    state = sampler.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == list(make())
    with pytest.raises(StateMismatchError, match="labels_digest"):
        make(np.roll(LABELS, 1)).load_state_dict(state)


def test_pickle_drops_the_cached_plan_and_repr_shows_configuration() -> None:
    """A pickled sampler does not carry its cached epoch plan, and yields the same batches."""
    sampler = make()
    expected = list(sampler)
    sampler.set_epoch(0)
    blob = pickle.dumps(sampler)
    assert len(blob) < 40_000
    assert list(pickle.loads(blob)) == expected
    text = repr(sampler)
    for part in ("labels=2000", "classes=20", "classes_per_batch=4", "samples_per_class=3", "small_classes='replace'"):
        assert part in text


def test_works_as_a_dataloader_batch_sampler() -> None:
    """DataLoader(batch_sampler=...) yields P*K items per batch."""
    loader = DataLoader(torch.arange(2_000), batch_sampler=make())
    assert all(batch.shape == (12,) for batch in loader)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=30),
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=1, max_value=50),
)
def test_quotas_sum_up_are_capped_and_proportional(sizes: list[int], per_batch: int, batches: int) -> None:
    """Quotas sum to B*P, never exceed B, and an uncapped class is within one slot of its exact share."""
    per_batch = min(per_batch, len(sizes))
    array = np.array(sizes, dtype=np.int64)
    words = np.arange(len(sizes) + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    quota = class_quotas(array, batches * per_batch, batches, words)
    assert int(quota.sum()) == batches * per_batch
    assert int(quota.max()) <= batches
    assert int(quota.min()) >= 0
    uncapped = quota < batches
    if uncapped.all():
        share = batches * per_batch * array / array.sum()
        assert np.all(np.abs(quota - share) < 1)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=400), min_size=2, max_size=25),
    st.integers(min_value=2, max_value=25),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=2**32),
)
def test_layout_rows_hold_distinct_classes_and_each_slot_once(sizes: list[int], per_batch: int, k: int, seed: int) -> None:
    """Every batch of the computed layout holds P distinct classes; together the cells are each class's quota of uses."""
    array = np.array(sizes, dtype=np.int64)
    per_batch = min(per_batch, len(sizes))
    batches = max(1, int(array.sum()) // (per_batch * k))
    layout = EpochLayout(array, classes_per_batch=per_batch, num_batches=batches, seed=seed, epoch=1)
    cls, use = layout.cells(np.arange(batches))
    assert cls.shape == (batches, per_batch)
    assert all(len(set(row)) == per_batch for row in cls.tolist())
    uses: dict[int, list[int]] = {}
    for c, u in zip(cls.ravel().tolist(), use.ravel().tolist(), strict=True):
        uses.setdefault(c, []).append(u)
    assert all(sorted(found) == list(range(len(found))) for found in uses.values())
    assert max(len(found) for found in uses.values()) <= batches


def test_keyed_shuffle_is_a_bijection_of_each_domain() -> None:
    """Many permutations of different sizes and keys in one call: each maps [0, n) onto itself."""
    sizes = np.repeat(np.arange(1, 200), np.arange(1, 200))
    positions = np.concatenate([np.arange(n) for n in range(1, 200)])
    tweaks = (sizes * 7919).astype(np.uint64)
    out = keyed_shuffle(positions, sizes, tweaks, np.arange(6, dtype=np.uint64) + 99)
    for n in (1, 2, 3, 50, 199):
        part = out[sizes == n]
        assert sorted(part.tolist()) == list(range(n))
    assert not np.array_equal(out, positions)


def test_class_index_groups_samples_in_chunks() -> None:
    """The chunked counting sort groups every index by class, in dataset order, for dense, sparse and string labels."""
    import shardwise._core.class_index as core

    rng = np.random.default_rng(5)
    cases = [  # (labels, chunk): consecutive classes, a sparse table, a search, strings; 32- and 64-bit sort keys,
        # per-class starts from a table (classes <= chunk) and from the runs (more classes than a chunk)
        (rng.integers(0, 30, 5_000), 1 << 10),
        (rng.choice([3, 7, 100, 5_000, 77_777], 5_000), 1 << 10),
        (rng.integers(0, 40, 5_000) * 2**33, 1 << 10),
        (rng.choice(["x", "yy", "z"], 999), 1 << 10),
        (rng.integers(0, 3_000, 5_000), 1 << 10),
        (rng.integers(0, 100_000, 150_000), 1 << 16),
        (rng.integers(0, 1 << 15, 150_000), 1 << 20),
        (np.sort(rng.integers(-500, 3_000, 5_000))[::-1], 1 << 10),  # the counted range widens chunk by chunk
        (np.concatenate([rng.integers(0, 10, 2_500), [2**22 - 1, 2**22]]), 1 << 10),  # past DENSE_SPAN at the end
    ]
    for labels, chunk in cases:
        old = core.CHUNK
        core.CHUNK = chunk  # several chunks
        try:
            classes, counts = count_classes(labels)
            members = np.empty(len(labels), dtype=np.int64)
            group_by_class(labels, classes, counts, members)
        finally:
            core.CHUNK = old
        expected_classes, inverse = np.unique(labels, return_inverse=True)
        assert classes.tolist() == expected_classes.tolist()
        assert np.array_equal(members, np.argsort(inverse, kind="stable"))
        assert counts.tolist() == np.bincount(inverse).tolist()


@pytest.mark.parametrize(
    ("labels", "kwargs", "error", "match"),
    [
        ([[0, 1], [1, 0]], {}, ValueError, "labels should be a 1-D sequence"),
        ([], {}, ValueError, "labels should hold at least one label"),
        ([0.5, 1.5, 2.5], {}, TypeError, "labels should hold integers or strings"),
        ([True, False, True], {}, TypeError, "labels should hold integers or strings"),
        ([object(), object()], {}, TypeError, "labels should hold integers or strings"),
        ([0, 0, 1, 1], {"classes_per_batch": 3}, ValueError, r"classes_per_batch should be at most .* \(2\)"),
        ([0, 0, 1, 1, 2], {"small_classes": "exclude", "classes_per_batch": 3}, ValueError, "usable classes with at least samples_per_class=2"),
        ([0, 0, 1, 1, 2], {"small_classes": "error"}, ValueError, "class 2 with 1"),
        ([0, 0, 1, 1], {"small_classes": "sometimes"}, ValueError, "small_classes should be one of 'replace', 'exclude', 'error'"),
        ([0, 0, 1, 1], {"classes_per_batch": 0}, ValueError, "classes_per_batch should be a positive integer"),
        ([0, 0, 1, 1], {"samples_per_class": True}, TypeError, "samples_per_class should be an integer"),
        ([0, 0, 1, 1], {"samples_per_class": -2}, ValueError, "samples_per_class should be a positive integer"),
        ([0, 0, 1, 1], {"drop_last": "no"}, TypeError, "drop_last should be True or False"),
        ([0, 0, 1, 1], {"rank": 3, "num_replicas": 2}, ValueError, "rank"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_naming_the_parameter(labels: list, kwargs: dict, error: type, match: str) -> None:
    """Every bad argument fails at construction with a message naming it."""
    options = {"classes_per_batch": 2, "samples_per_class": 2}
    options.update(kwargs)
    with pytest.raises(error, match=match):
        ClassBalancedBatchSampler(labels, **options)


def _class_balanced_main(rank: int, world_size: int) -> list[list[list[int]]]:
    sampler = ClassBalancedBatchSampler(LABELS, classes_per_batch=4, samples_per_class=3, seed=3)
    loader = DataLoader(torch.arange(2_000), batch_sampler=sampler)
    return lockstep_epochs(loader, sampler)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2])
def test_real_ranks_step_together_on_one_plan(world_size: int) -> None:
    """On W gloo ranks: equal steps, whole P x K batches, together exactly the single-process plan."""
    reports = run_distributed(_class_balanced_main, world_size, timeout=180)
    for epoch in range(2):
        assert {len(report[epoch]) for report in reports} == {-(-(2_000 // 12) // world_size)}
        single = make(seed=3)
        single.set_epoch(epoch)
        plan = list(single)
        for rank, report in enumerate(reports):
            expected = [plan[(rank + k * world_size) % len(plan)] for k in range(len(report[epoch]))]
            assert report[epoch] == expected


def test_builds_and_iterates_over_a_memmap_under_a_memory_cap(tmp_path) -> None:
    """1e7 memory-mapped labels: a process capped at 64 MiB of private memory builds the shared index and iterates."""
    n = 10**7
    labels = np.lib.format.open_memmap(tmp_path / "labels.npy", mode="w+", dtype=np.int32, shape=(n,))
    labels[:] = np.random.default_rng(0).integers(0, 5_000, n, dtype=np.int32)
    labels.flush()
    options = {"classes_per_batch": 16, "samples_per_class": 4, "num_replicas": 8, "rank": 3, "seed": 1}
    first = first_units_under_cap(
        f"labels = np.load({str(tmp_path / 'labels.npy')!r}, mmap_mode='r')",
        f"shardwise.ClassBalancedBatchSampler(labels, cache_dir={str(tmp_path / 'cache')!r}, **{options!r})",
        n=n, first=3, skip=2000,
    )
    with pytest.warns(RuntimeWarning, match="private memory"):
        uncached = ClassBalancedBatchSampler(np.load(tmp_path / "labels.npy", mmap_mode="r"), cache_dir=False, **options)
    batches = iter(uncached)
    assert first == str([next(batches) for _ in range(3)])


def test_pickles_memory_mapped_arrays_by_reference(tmp_path) -> None:
    """A sampler over memory-mapped labels pickles as file names (a small blob) and yields the same batches."""
    np.save(tmp_path / "labels.npy", np.arange(2**17) % 97)
    labels = np.load(tmp_path / "labels.npy", mmap_mode="r")
    sampler = make(labels, cache_dir=tmp_path / "cache")
    blob = pickle.dumps(sampler)
    assert len(blob) < 20_000
    assert list(pickle.loads(blob)) == list(sampler)


def test_docstring_example_runs() -> None:
    """The module's Example sections run as written."""
    import doctest

    from shardwise.samplers import class_balanced as _class_balanced

    assert doctest.testmod(_class_balanced, optionflags=doctest.ELLIPSIS).failed == 0


def test_quotas_with_tied_order_words_follow_their_stable_order() -> None:
    """The systematic pass orders classes by their random words (a SIMD sort, the stable one on ties): tied
    words give the quotas of distinct words in the same stable order."""
    rng = np.random.default_rng(8)
    sizes = rng.integers(1, 40, 2_000)
    words = rng.integers(0, 2**63, sizes.size + 1, dtype=np.uint64)
    words[:1_000] = words[1_000:2_000]  # every word tied
    ranks = np.empty(sizes.size + 1, dtype=np.uint64)
    ranks[np.argsort(words[:-1], kind="stable")] = np.arange(sizes.size, dtype=np.uint64)
    ranks[-1] = words[-1]  # the offset word
    slots, cap = int(sizes.sum()) // 10, 3  # some classes capped
    assert np.array_equal(class_quotas(sizes, slots, cap, words), class_quotas(sizes, slots, cap, ranks))


def test_compiled_class_index_gives_the_numpy_index_and_plan(tmp_path, monkeypatch) -> None:
    """SHARDWISE_NUMBA=1 (two compiled passes) and 0 (numpy's one pass) write the same index file, so one plan."""
    pytest.importorskip("numba", reason="numba (the fast extra) is not installed: the compiled path is not tested")
    from shardwise._core import class_buckets

    monkeypatch.setattr(class_buckets, "BUCKET_ITEMS", 1 << 12)  # a few dozen buckets at this size
    np.save(tmp_path / "labels.npy", np.random.default_rng(9).integers(-50, 3_000, 2**17).astype(np.int32))
    labels = np.load(tmp_path / "labels.npy", mmap_mode="r")
    built = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("SHARDWISE_NUMBA", mode)
        sampler = make(labels, cache_dir=tmp_path / f"cache-{mode}", classes_per_batch=8, samples_per_class=4)
        (members,) = (tmp_path / f"cache-{mode}").rglob("members.npy")
        built[mode] = members.read_bytes(), sampler.epoch_plan(0)
    assert built["0"][0] == built["1"][0]
    assert np.array_equal(built["0"][1], built["1"][1])
