"""BucketBatchSampler and the batch-plan layer: budgets, multiples, oversized samples, balance, bad input, real ranks."""

from __future__ import annotations

import logging
import pickle
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Sampler

from shardwise import BucketBatchSampler, Oversized, StateMismatchError
from shardwise._core.batching import BatchPlan
from shardwise._core.bucketing import bucket_plan
from shardwise._core.cutting import fixed_offsets, sized_offsets, token_offsets
from shardwise._core.ordering import balanced_batch_order, shuffled, sort_in_windows, window_starts
from shardwise._core.permutation import table_permutation
from shardwise.tools.launch import run_distributed
from tests.lockstep import lockstep_epochs

# A heavy-tailed length mix: many short samples, a sparse tail of long ones.
LENGTHS = np.concatenate([np.arange(300) % 40 + 1, np.arange(60) * 7 % 200 + 40, [230, 240, 250]])


def make(**kw) -> BucketBatchSampler:
    options = {"max_tokens": 256, "num_replicas": 1, "rank": 0, "seed": 3}
    options.update(kw)
    return BucketBatchSampler(options.pop("lengths", LENGTHS), **options)


def cost(batch: list[int], lengths: np.ndarray = LENGTHS) -> int:
    return len(batch) * max(int(lengths[batch].max()), 1)


def longest_first(lengths: list[int], budget: int, multiple: int, starts: list[int], phases=None, shorten=None):
    """The token cut written the obvious way: each batch takes what its first, longest sample allows."""
    n = len(lengths)
    ends = [*starts[1:], n]
    unit = multiple if multiple > 1 else 1
    boundaries = [0]
    for segment, (first, end) in enumerate(zip(starts, ends, strict=True)):
        i = first
        while i < end:
            fit = min(budget // max(lengths[i], 1), end - i)
            inner = i + fit < end
            if fit == 0:
                fit = 1
            elif phases is not None and i == first and fit > 1:
                fit = 1 + phases[segment] % fit
            else:
                if multiple > 1 and fit >= multiple and inner:
                    fit -= fit % multiple
                if shorten is not None and shorten[i] and inner and fit >= 2 * unit:
                    fit -= unit
            i += fit
            boundaries.append(i)
    return boundaries


# -- the batch-plan layer ---------------------------------------------------------------------------
def test_batch_plan_addresses_batches_by_position() -> None:
    """BatchPlan.batches/batch/take/costs read batch j as order[offsets[j]:offsets[j+1]]."""
    plan = BatchPlan(np.array([4, 2, 0, 1, 3], dtype=np.int64), np.array([0, 1, 3, 5], dtype=np.int64))
    assert len(plan) == 3 and plan.num_samples == 5
    assert plan.batches(np.array([2, 0, 2])) == [[1, 3], [4], [1, 3]]
    assert plan.batch(1).tolist() == [2, 0]
    assert plan.sizes().tolist() == [1, 2, 2]
    taken = plan.take(np.array([2, 1]))
    assert taken.batches(np.arange(2)) == [[1, 3], [2, 0]]
    assert plan.costs(np.array([1, 5, 2, 9, 3])).tolist() == [3, 2 * 2, 2 * 9]
    joined = BatchPlan.concat([plan, taken])
    assert joined.batches(np.arange(len(joined))) == [[4], [2, 0], [1, 3], [1, 3], [2, 0]]
    assert len(BatchPlan.empty()) == 0 and BatchPlan.concat([]).num_samples == 0


@pytest.mark.parametrize(
    ("order", "offsets", "match"),
    [
        (np.arange(3, dtype=np.int32), np.array([0, 3]), "order should be a 1-D int64 array"),
        (np.arange(3), np.array([0, 2]), "offsets should run from 0 to len"),
        (np.arange(3), np.array([0, 2, 2, 3]), "strictly increasing"),
        (np.arange(3), np.empty(0, dtype=np.int64), "offsets should be a non-empty"),
    ],
)
def test_batch_plan_refuses_inconsistent_arrays(order: np.ndarray, offsets: np.ndarray, match: str) -> None:
    """A plan whose arrays do not describe non-empty batches covering order is refused."""
    with pytest.raises(ValueError, match=match):
        BatchPlan(np.asarray(order), np.asarray(offsets, dtype=np.int64))


def test_fixed_offsets_place_the_short_batch() -> None:
    """Fixed-size boundaries put the one short batch where asked, the last by default."""
    assert fixed_offsets(10, 3).tolist() == [0, 3, 6, 9, 10]
    assert fixed_offsets(10, 3, partial_at=1).tolist() == [0, 3, 4, 7, 10]
    assert fixed_offsets(9, 3, partial_at=0).tolist() == [0, 3, 6, 9]
    assert fixed_offsets(0, 3).tolist() == [0]


def test_sized_offsets_vary_the_batch_size_along_the_plan() -> None:
    """Batch j takes the size the schedule gives at j (int, array holding its last value, or function)."""
    assert sized_offsets(10, lambda j: 2 + j).tolist() == [0, 2, 5, 9, 10]
    assert sized_offsets(10, np.array([1, 4])).tolist() == [0, 1, 5, 9, 10]
    assert sized_offsets(10, 4, drop_partial=True).tolist() == [0, 4, 8]
    assert sized_offsets(100_000, lambda j: np.where(j < 10, 1, 1000)).tolist()[:12] == [*range(11), 1010]
    assert sized_offsets(0, 5).tolist() == [0]


@pytest.mark.parametrize(
    ("sizes", "error", "match"),
    [
        (lambda j: j, ValueError, "batch_size should be positive, but got 0 at batch position 0"),
        (lambda j: j * 0.5 + 1, TypeError, "batch_size should give integers, but gave dtype float64"),
        (lambda j: np.ones(3, dtype=np.int64), ValueError, "returned shape"),
        (np.array([2, -1]), ValueError, "should be positive, but got -1 at batch position 1"),
    ],
)
def test_sized_offsets_refuse_bad_schedules(sizes: object, error: type, match: str) -> None:
    """A schedule giving non-positive, non-integer or misshapen sizes fails naming the batch position."""
    with pytest.raises(error, match=match):
        sized_offsets(10, sizes)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=60),
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=1, max_value=60),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.booleans(),
)
def test_token_offsets_equal_the_one_batch_at_a_time_cut(
    raw: list[int], budget: int, multiple: int, window: int, word: int, randomised: bool
) -> None:
    """The vectorised cut and the per-batch cut of a budget schedule both equal the plain loop."""
    n = len(raw)
    starts = window_starts(n, window)
    stream = np.concatenate([np.sort(raw[s : s + window])[::-1] for s in starts])
    phases = shorten = None
    if randomised:
        phases = np.random.PCG64(word).random_raw(starts.size)
        shorten = np.random.PCG64(word + 1 if word < 2**64 - 1 else 0).random_raw(n) % 3 == 0
    expected = longest_first(
        stream.tolist(), budget, multiple, starts.tolist(),
        None if phases is None else phases.tolist(), None if shorten is None else shorten.tolist(),
    )  # fmt: skip
    options = {"multiple": multiple, "segment_starts": starts, "oversized_alone": True, "phases": phases,
               "shorten": shorten}  # fmt: skip
    assert token_offsets(stream, budget, **options).tolist() == expected
    assert token_offsets(stream, np.array([budget, budget]), **options).tolist() == expected
    assert token_offsets(stream, lambda j: np.full(j.shape, budget), **options).tolist() == expected


def test_token_offsets_follow_a_varying_budget() -> None:
    """Batch j respects the budget the schedule gives at j."""
    stream = np.sort(np.arange(2000) % 50 + 1)[::-1]
    budgets = np.arange(20, dtype=np.int64) * 13 + 60
    offsets = token_offsets(stream, lambda j: budgets[j % 20])
    for j in range(len(offsets) - 1):
        batch = stream[offsets[j] : offsets[j + 1]]
        assert batch.size * batch.max() <= budgets[j % 20]
    assert offsets[-1] == stream.size


def test_token_offsets_phases_and_shortening_move_boundaries() -> None:
    """A phase sets a segment's first batch to 1 + phase % k samples; a marked batch takes one fewer."""
    stream = np.array([2, 2, 2, 2, 1, 1, 1, 1, 1, 1], dtype=np.int64)
    starts = np.array([0, 4])
    assert token_offsets(stream, 4, segment_starts=starts).tolist() == [0, 2, 4, 8, 10]
    assert token_offsets(stream, 4, segment_starts=starts, phases=np.array([0, 2])).tolist() == [0, 1, 3, 4, 7, 10]
    marked = np.zeros(10, dtype=bool)
    marked[4] = True
    assert token_offsets(stream, 4, segment_starts=starts, shorten=marked).tolist() == [0, 2, 4, 7, 10]
    with pytest.raises(ValueError, match="phases should have one value per segment"):
        token_offsets(stream, 4, segment_starts=starts, phases=np.array([1]))
    with pytest.raises(ValueError, match="shorten should have one flag per stream position"):
        token_offsets(stream, 4, shorten=marked[:3])


def test_token_offsets_refuse_oversized_and_unsorted_streams() -> None:
    """A sample over budget names its position and length; a rising length inside a segment is refused."""
    with pytest.raises(ValueError, match="length 9 at stream position 0, but max_tokens=8"):
        token_offsets(np.array([9, 2, 1]), 8)
    with pytest.raises(ValueError, match="length 9 at stream position 0, but max_tokens=8"):
        token_offsets(np.array([9, 2, 1]), lambda j: np.full(j.shape, 8))
    assert token_offsets(np.array([9, 2, 1]), 8, oversized_alone=True).tolist() == [0, 1, 3]
    with pytest.raises(ValueError, match=r"descend within each segment, but lengths\[0\]=1 < lengths\[1\]=3"):
        token_offsets(np.array([1, 3]), 8)
    assert token_offsets(np.array([1, 3]), 8, segment_starts=np.array([0, 1])).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="segment_starts should rise strictly from 0"):
        token_offsets(np.array([2, 1]), 8, segment_starts=np.array([1]))


def test_sort_in_windows_sorts_each_window_stably() -> None:
    """Each window is sorted by length; equal lengths keep their incoming order."""
    lengths = np.array([5, 1, 5, 2, 1, 3, 3, 0])
    order = np.array([7, 6, 5, 4, 3, 2, 1, 0], dtype=np.int64)
    assert sort_in_windows(order, lengths, 4).tolist() == [7, 4, 6, 5, 1, 3, 2, 0]
    assert sort_in_windows(order, lengths, 100).tolist() == [7, 4, 1, 3, 6, 5, 2, 0]
    assert sort_in_windows(order, lengths, 100, descending=True).tolist() == [2, 0, 6, 5, 3, 4, 1, 7]
    big = np.array([70000, 3, 70000, 1])  # keys past 16 bits take the general stable sort
    assert sort_in_windows(np.arange(4, dtype=np.int64), big, 4).tolist() == [3, 1, 0, 2]


def test_shuffled_is_the_table_permutation() -> None:
    """The plan's shuffle is the platform-stable table permutation of the key (identity without one)."""
    for n in (0, 1, 7, 5000):
        assert shuffled(n, 99).tolist() == table_permutation(n, 99).tolist()
    assert shuffled(4, None).tolist() == [0, 1, 2, 3]


def test_balanced_order_keeps_groups_of_similar_cost_together() -> None:
    """Batches sorted by cost are shuffled in whole groups; the one short group goes last."""
    costs = np.array([9, 1, 8, 2, 7, 3, 6, 4, 5, 0])
    order = balanced_batch_order(costs, 4, key=12)
    assert sorted(order.tolist()) == list(range(10))
    ranked = np.argsort(np.argsort(costs, kind="stable"))[order]  # cost rank of each planned batch
    for first in range(0, 8, 4):
        group = ranked[first : first + 4]
        assert np.all(np.diff(group) == 1)
    assert np.all(np.diff(ranked[8:]) == 1)
    assert balanced_batch_order(costs, 4, key=None).tolist() == np.argsort(costs, kind="stable").tolist()
    orders = {tuple(balanced_batch_order(np.arange(40), 4, key=k).tolist()) for k in range(6)}
    assert len(orders) > 1


def test_bucket_plan_builds_a_plan_piece_by_piece() -> None:
    """bucket_plan over pieces of a shuffled stream, joined, keeps each piece's batches inside it."""
    order = shuffled(LENGTHS.size, 5)
    pieces = [order[:150], order[150:]]
    plans = [
        bucket_plan(pieces[0], LENGTHS, batch_size=4, key=1),
        bucket_plan(pieces[1], LENGTHS, max_tokens=300, multiple=2, window=64, key=2),
    ]
    joined = BatchPlan.concat(plans)
    batches = joined.batches(np.arange(len(joined)))
    assert sorted(i for b in batches for i in b) == list(range(LENGTHS.size))
    first = set(pieces[0].tolist())
    assert all(set(b) <= first for b in batches[: len(plans[0])])
    assert all(not set(b) & first for b in batches[len(plans[0]) :])
    assert all(len(b) == 4 for b in batches[: len(plans[0])] if len(b) != 150 % 4)
    assert all(cost(b) <= 300 for b in batches[len(plans[0]) :])
    assert len(bucket_plan(order[:0], LENGTHS, batch_size=4)) == 0
    with pytest.raises(ValueError, match="exactly one of batch_size and max_tokens"):
        bucket_plan(order, LENGTHS, batch_size=4, max_tokens=10)


# -- BucketBatchSampler -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        {"max_tokens": 256},
        {"max_tokens": 256, "sort_window": 50},
        {"max_tokens": 300, "batch_size_multiple": 4, "sort_window": 64},
        {"max_tokens": None, "batch_size": 8},
        {"max_tokens": None, "batch_size": 7, "sort_window": 30},
        {"max_tokens": 256, "shuffle": False},
    ],
)
def test_every_sample_is_in_exactly_one_batch_per_epoch(options: dict) -> None:
    """Each epoch's plan holds every sample exactly once, and len() said beforehand how many batches."""
    sampler = make(**options)
    for _ in range(3):
        expected = len(sampler)
        batches = list(sampler)
        assert len(batches) == expected
        assert Counter(i for batch in batches for i in batch) == Counter(range(LENGTHS.size))


def test_token_budget_is_never_exceeded_and_multiples_are_respected() -> None:
    """Every batch fits max_tokens; sizes are multiples except the documented ones (few fit, window edges)."""
    sampler = make(max_tokens=300, batch_size_multiple=4, sort_window=64)
    for _ in range(3):
        batches = list(sampler)
        assert all(cost(batch) <= 300 for batch in batches)
        odd = [batch for batch in batches if len(batch) % 4]
        # at most two per window (its random first batch and its rest), plus batches where fewer than 4 fit
        windows = -(-LENGTHS.size // 64)
        assert len([b for b in odd if 4 * LENGTHS[b].max() <= 300]) <= 2 * windows
    fixed = make(max_tokens=None, batch_size=8)
    assert Counter(len(batch) for batch in fixed) == Counter({8: LENGTHS.size // 8, LENGTHS.size % 8: 1})


def test_fixed_batches_drop_only_the_short_batch_with_drop_last() -> None:
    """drop_last leaves out the one short batch, a different set of samples in different epochs."""
    sampler = make(max_tokens=None, batch_size=8, drop_last=True)
    left_out = []
    for _ in range(4):
        batches = list(sampler)
        assert {len(batch) for batch in batches} == {8}
        seen = {i for batch in batches for i in batch}
        assert len(seen) == LENGTHS.size // 8 * 8
        left_out.append(frozenset(set(range(LENGTHS.size)) - seen))
    assert len(set(left_out)) > 1


def test_oversized_samples_error_by_default_naming_index_and_length() -> None:
    """A sample longer than max_tokens fails at construction, naming it and the ways out."""
    with pytest.raises(ValueError, match=r"lengths\[362\]=250 is longer than max_tokens=245 \(1 sample is\); "):
        make(max_tokens=245)
    with pytest.raises(ValueError, match=r"lengths\[361\]=240 is longer than max_tokens=239 \(2 samples are\); "):
        make(max_tokens=239)
    with pytest.raises(ValueError, match="oversized='single'"):
        make(max_tokens=245, oversized="error")


def test_oversized_single_gives_each_its_own_batch() -> None:
    """oversized='single': each over-long sample is a batch of one; every other batch fits."""
    sampler = make(max_tokens=245, oversized=Oversized.SINGLE)
    batches = list(sampler)
    assert [362] in batches
    assert all(cost(b) <= 245 for b in batches if b != [362])
    assert sorted(i for b in batches for i in b) == list(range(LENGTHS.size))
    assert sampler.skipped.size == 0


def test_oversized_skip_leaves_samples_out_and_reports_them(caplog: pytest.LogCaptureFixture) -> None:
    """oversized='skip': over-long samples never appear, are listed in skipped, and are logged."""
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        sampler = make(max_tokens=245, oversized="skip")
    assert "skipping 1 of 363 samples longer than max_tokens=245 (first: lengths[362]=250)" in caplog.text
    assert sampler.skipped.tolist() == [362]
    for _ in range(2):
        seen = sorted(i for batch in sampler for i in batch)
        assert seen == sorted(set(range(LENGTHS.size)) - set(sampler.skipped.tolist()))
    assert "skipped=1" in repr(sampler)
    with pytest.raises(ValueError, match="every sample is longer than max_tokens=1"):
        make(lengths=[5, 6], max_tokens=1, oversized="skip")


def test_batch_size_attribute_is_what_frameworks_read() -> None:
    """batch_size is the fixed size, or None under a token budget (sizes vary); it is a torch Sampler."""
    assert make(max_tokens=None, batch_size=8).batch_size == 8
    assert make().batch_size is None
    assert isinstance(make(), Sampler)
    loader = DataLoader(torch.arange(LENGTHS.size), batch_sampler=make(max_tokens=None, batch_size=8))
    assert sum(batch.numel() for batch in loader) == LENGTHS.size


def test_neighbouring_batches_have_similar_cost() -> None:
    """The W=4 batches of each global step cost about the same (max/mean, averaged over steps)."""
    lengths = np.random.default_rng(0).integers(1, 500, 20_000)
    for options in ({"max_tokens": 4096}, {"batch_size": 16}, {"max_tokens": 4096, "sort_window": 2000}):
        sampler = BucketBatchSampler(lengths, num_replicas=1, rank=0, **options)
        costs = np.array([cost(batch, lengths) for batch in sampler])
        steps = costs[: costs.size // 4 * 4].reshape(-1, 4)  # steps: (global steps, W=4)
        assert (steps.max(1) / steps.mean(1)).mean() < 1.05


def test_epochs_differ_in_order_and_in_batches() -> None:
    """Consecutive epochs plan different batch orders, and few batches repeat even where lengths are sparse."""
    # Where only a few of the longest samples fit in a batch, their sorted order leaves the cut
    # few ways to differ (documented); max_tokens=2000 fits eight of the longest. LENGTHS holds
    # 1..40 eight or seven times each: sorted whole, batches of 8 would be those runs every epoch,
    # so the fixed-size case sorts in windows (documented: a window trades padding for randomness).
    for options in (
        {"max_tokens": 2000},
        {"max_tokens": None, "batch_size": 8, "sort_window": 120},
        {"max_tokens": 2000, "batch_size_multiple": 4},
    ):
        shares = []
        for seed in range(10):
            sampler = make(seed=seed, **options)
            first, second = list(sampler), list(sampler)
            assert first != second
            repeated = {tuple(sorted(b)) for b in first} & {tuple(sorted(b)) for b in second}
            shares.append(len(repeated) / len(second))
        # a plan of about 11 batches: one seed may repeat a few; on average few repeat
        assert np.mean(shares) < 0.12, shares


def test_plan_does_not_depend_on_world_size() -> None:
    """Rank r of W yields plan positions r, r+W, ... of the single-process plan, for every W."""
    plan = list(make(seed=8))
    for world_size in (2, 3, 5):
        for rank in range(world_size):
            got = list(make(seed=8, num_replicas=world_size, rank=rank))
            count = -(-len(plan) // world_size)
            assert got == [plan[(rank + k * world_size) % len(plan)] for k in range(count)]


def test_state_resumes_elastically_under_a_token_budget() -> None:
    """A state saved mid-epoch at W=2 resumes at W=3 with nothing lost and nothing twice (shuffled, budget)."""
    plan = [tuple(b) for b in make(seed=2, sort_window=40)]
    heads, state = [], None
    for rank in range(2):
        sampler = make(seed=2, sort_window=40, num_replicas=2, rank=rank)
        iterator = iter(sampler)
        heads += [tuple(next(iterator)) for _ in range(5)]
        state = state or sampler.state_dict()
    tails = []
    for rank in range(3):
        resumed = make(seed=2, sort_window=40, num_replicas=3, rank=rank)
        resumed.load_state_dict(state)
        tails += [tuple(b) for b in resumed]
    extra = Counter(heads + tails) - Counter(plan)
    assert not Counter(plan) - Counter(heads + tails)
    assert sum(extra.values()) <= 2
    with pytest.raises(StateMismatchError, match="max_tokens=256, but this sampler has max_tokens=257"):
        make(seed=2, sort_window=40, max_tokens=257).load_state_dict(state)
    other = LENGTHS.copy()
    other[0] += 1
    with pytest.raises(StateMismatchError, match="lengths="):
        make(seed=2, sort_window=40, lengths=other).load_state_dict(state)


def test_pickles_mid_epoch_without_its_cached_plan() -> None:
    """Pickling carries configuration and state, not the cached plan; loading the state, the copy continues identically."""
    sampler = make(seed=4)
    iterator = iter(sampler)
    next(iterator)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy._cache is None
    copy.load_state_dict(sampler.state_dict())  # a new pass starts the epoch unless a state is loaded
    assert [*copy] == [*iterator]


def test_lengths_are_used_as_given_and_read_only() -> None:
    """An array is used as is (no copy), read-only through the attribute; lists and tensors become arrays."""
    source = np.array([3, 1, 2], dtype=np.int64)
    sampler = make(lengths=source, max_tokens=6)
    assert np.shares_memory(sampler.lengths, source) and sampler.lengths.tolist() == [3, 1, 2]
    assert make(lengths=torch.tensor([4, 5]), max_tokens=10).lengths.tolist() == [4, 5]
    with pytest.raises(ValueError, match="read-only"):
        sampler.lengths[0] = 7
    windowed = make(lengths=source, max_tokens=6, sort_window=2)  # the windowed plan keeps a compact copy
    assert windowed.lengths.dtype == np.uint16 and not np.shares_memory(windowed.lengths, source)


def test_repr_and_describe_show_the_configuration() -> None:
    """repr names the mode, window, group, seed and resolved world; describe() carries the same."""
    text = repr(make(max_tokens=None, batch_size=8, sort_window=64))
    assert text.startswith("BucketBatchSampler(lengths=<363 samples, 1..250>, batch_size=8, sort_window=64")
    assert "seed=3, rank=0, world_size=1" in text
    described = make(batch_size_multiple=8).describe()
    assert described["max_tokens"] == 256 and described["batch_size_multiple"] == 8
    assert described["oversized"] == "error" and described["kind"] == "BucketBatchSampler"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lengths": []}, ValueError, "lengths should hold at least one length, but got an empty lengths"),
        ({"lengths": [3, -1]}, ValueError, r"lengths should hold non-negative integers, but got lengths\[1\]=-1"),
        ({"lengths": [1.5, 2.0]}, TypeError, "lengths should hold integers .* dtype float64"),
        ({"lengths": [True, False]}, TypeError, "lengths should hold integers .* dtype bool"),
        ({"lengths": [[1, 2], [3, 4]]}, ValueError, r"lengths should be a 1-D .* shape \(2, 2\)"),
        ({"lengths": "123"}, TypeError, "lengths should be a 1-D sequence of integers"),
        ({"lengths": [1, [2, 3]]}, TypeError, "lengths should be a 1-D sequence of integers"),
        ({"lengths": [2**63 - 1]}, ValueError, r"lengths should hold integers below 2\*\*62"),
        ({"max_tokens": 0}, ValueError, "max_tokens should be a positive integer, but got max_tokens=0"),
        ({"max_tokens": -5}, ValueError, "max_tokens should be a positive integer, but got max_tokens=-5"),
        ({"max_tokens": 2.5}, TypeError, "max_tokens should be an integer"),
        ({"max_tokens": None, "batch_size": 0}, ValueError, "batch_size should be a positive integer"),
        ({"max_tokens": None, "batch_size": True}, TypeError, "batch_size should be an integer"),
        ({"batch_size": 4}, ValueError, "pass exactly one of max_tokens .* and batch_size .*, but got max_tokens=256"),
        (
            {"max_tokens": None},
            ValueError,
            "pass exactly one of max_tokens .* but got max_tokens=None, batch_size=None",
        ),
        ({"batch_size_multiple": 0}, ValueError, "batch_size_multiple should be a positive integer"),
        ({"max_tokens": None, "batch_size": 8, "batch_size_multiple": 8}, ValueError, "batch_size_multiple applies"),
        ({"max_tokens": None, "batch_size": 8, "oversized": "skip"}, ValueError, "oversized applies to max_tokens"),
        ({"sort_window": 0}, ValueError, "sort_window should be a positive integer"),
        ({"balance_group": -1}, ValueError, "balance_group should be a positive integer"),
        ({"oversized": "truncate"}, ValueError, "oversized should be one of 'error', 'single', 'skip'"),
        ({"shuffle": 1}, TypeError, "shuffle should be True or False"),
        ({"drop_last": "yes"}, TypeError, "drop_last should be True or False"),
        ({"seed": -1}, ValueError, "seed should be a non-negative integer"),
        ({"num_replicas": 2, "rank": 2}, ValueError, r"rank should be in the interval \[0, 1\]"),
    ],
)
def test_bad_input_is_refused_naming_the_parameter(kwargs: dict, error: type, match: str) -> None:
    """Every bad argument fails at construction with a message naming it, its value and what is accepted."""
    with pytest.raises(error, match=match):
        make(**kwargs)


# -- real ranks -------------------------------------------------------------------------------------
def _bucket_main(rank: int, world_size: int, every: list[dict]) -> list[list[list[list[int]]]]:
    """Each options' 2 lockstep epochs, in turn, on the same ranks."""
    reports = []
    for options in every:
        sampler = BucketBatchSampler(LENGTHS, seed=21, **options)
        loader = DataLoader(torch.arange(LENGTHS.size), batch_sampler=sampler)
        reports.append(lockstep_epochs(loader, sampler))
    return reports


REAL_RANKS = [
    (2, {"max_tokens": 256, "sort_window": 100}),
    (4, {"max_tokens": 256, "batch_size_multiple": 2}),
    (4, {"batch_size": 8, "drop_last": True}),
]


@pytest.fixture(scope="module")
def bucket_reports() -> Callable[[int, dict], list[list[list[list[int]]]]]:
    """Per (world size, options), each rank's report: the cases of one world size share one start of its ranks."""
    runs: dict[int, list[list[list[list[list[int]]]]]] = {}

    def reports(world_size: int, options: dict) -> list[list[list[list[int]]]]:
        every = [o for w, o in REAL_RANKS if w == world_size]
        if world_size not in runs:
            runs[world_size] = run_distributed(_bucket_main, world_size, every, timeout=240)
        return [rank[every.index(options)] for rank in runs[world_size]]

    return reports


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("world_size", "options"), REAL_RANKS)
def test_real_ranks_step_together_with_disjoint_batches(
    bucket_reports: Callable[[int, dict], list[list[list[list[int]]]]], world_size: int, options: dict
) -> None:
    """On W gloo ranks: equal steps, disjoint batches within the budget, together the single-process plan."""
    reports = bucket_reports(world_size, options)
    for epoch in range(2):
        assert len({len(report[epoch]) for report in reports}) == 1
        single = BucketBatchSampler(LENGTHS, seed=21, num_replicas=1, rank=0, **options)
        single.set_epoch(epoch)
        plan = list(single)
        steps = len(reports[0][epoch])
        for rank, report in enumerate(reports):
            assert report[epoch] == [plan[(rank + k * world_size) % len(plan)] for k in range(steps)]
        drawn = [i for report in reports for batch in report[epoch] for i in batch]
        if options.get("drop_last"):
            assert len(drawn) == len(set(drawn))
        else:
            assert set(drawn) == set(range(LENGTHS.size))
            assert len(drawn) - LENGTHS.size <= sum(len(b) for b in plan[: world_size - 1])
        if "max_tokens" in options:
            assert all(cost(batch) <= options["max_tokens"] for report in reports for batch in report[epoch])


def _longest_per_batch(sampler: BucketBatchSampler, lengths: np.ndarray) -> list[int]:
    return [int(lengths[batch].max()) for batch in sampler]


@pytest.mark.parametrize("batch_size", [4, 16])
def test_a_small_distinct_length_set_gets_new_batches_in_a_new_order_every_epoch_and_seed(batch_size: int) -> None:
    """25 batches of distinct lengths (one balancing group): contents and order change with epoch and seed."""
    lengths = np.arange(1, 25 * batch_size + 1)
    plans = {}
    for seed in (1, 2):
        for epoch in (0, 1):
            sampler = BucketBatchSampler(lengths, batch_size=batch_size, seed=seed, num_replicas=1, rank=0)
            sampler.set_epoch(epoch)
            plans[seed, epoch] = [tuple(sorted(batch)) for batch in sampler]
    for a, b in [((1, 0), (1, 1)), ((1, 0), (2, 0))]:
        same = len(set(plans[a]) & set(plans[b])) / len(plans[a])
        assert same <= 0.05, f"{a} and {b} share {same:.0%} of their batches"
        assert [max(batch) for batch in plans[a]] != [max(batch) for batch in plans[b]]
    for plan in plans.values():
        longest = [max(batch) for batch in plan]
        assert longest != sorted(longest)  # not ascending (plan 1 was, every time)
        assert sorted(i for batch in plan for i in batch) == list(range(lengths.size))
    old = BucketBatchSampler(lengths, batch_size=batch_size, seed=1, batch_order="ascending", num_replicas=1, rank=0)
    longest = _longest_per_batch(old, lengths)
    assert longest == sorted(longest)  # the order kept by name


def test_longest_first_puts_the_longest_batch_first_on_every_seed_and_epoch() -> None:
    """longest_first (HF's rule): rank 0's first batch holds the longest sample, every mode, seed and epoch."""
    lengths = np.random.default_rng(0).integers(1, 500, 300)
    for kind in ({"batch_size": 8}, {"batch_size": 8, "drop_last": True}, {"max_tokens": 2000}, {"batch_size": 8,
                 "sort_window": 100}):  # fmt: skip
        for seed in range(3):
            for epoch in range(2):
                first = []
                for rank in range(1):
                    sampler = BucketBatchSampler(lengths, seed=seed, longest_first=True, num_replicas=2, rank=rank,
                                                 **kind)  # fmt: skip
                    sampler.set_epoch(epoch)
                    first.append(int(lengths[next(iter(sampler))].max()))
                if kind != {"batch_size": 8, "drop_last": True}:  # drop_last may drop the longest's short batch
                    assert first[0] == lengths.max(), kind
    with pytest.raises(ValueError, match=r"longest_first.*batch_order='mixed'"):
        BucketBatchSampler(lengths, batch_size=8, longest_first=True, batch_order="ascending")
    with pytest.raises(ValueError, match="batch_order should be one of"):
        BucketBatchSampler(lengths, batch_size=8, batch_order="sorted")


def test_a_state_of_the_ascending_plan_is_refused_naming_the_option_that_loads_it() -> None:
    """A plan-1 state (no plan field) under the mixed default: refused, naming batch_order='ascending'."""
    lengths = np.arange(1, 101)
    old = BucketBatchSampler(lengths, batch_size=4, seed=1, batch_order="ascending", num_replicas=1, rank=0)
    state = old.state_dict()
    with pytest.raises(StateMismatchError, match=r"without plan.*batch_order='ascending'"):
        BucketBatchSampler(lengths, batch_size=4, seed=1, num_replicas=1, rank=0).load_state_dict(state)
    BucketBatchSampler(lengths, batch_size=4, seed=1, batch_order="ascending", num_replicas=1, rank=0).load_state_dict(state)
