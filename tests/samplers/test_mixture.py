"""MixtureSampler: exact proportions (the stated bound), per-source cycles, stop rules, schedules, resume, bad input."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardwise
from shardwise import Mixture, MixtureSampler, ScheduledBatchSampler, WeightSchedule, temperature_weights
from shardwise._core.mixture import MixtureStop
from shardwise._core.weights import Weights, exact_weights
from tests.strategies import mixture_weights

SIZES = [1000, 50, 10]
WEIGHTS = [0.5, 0.3, 0.2]


def _sources(sampler: MixtureSampler, indices: list[int]) -> np.ndarray:
    return sampler.sources_of(indices)


def _plan(sampler: MixtureSampler, epoch: int = 0) -> list[int]:
    whole = MixtureSampler(
        sampler.sizes, sampler.weights, num_samples=sampler.num_samples, stop=sampler.stop, primary=sampler.primary,
        block=sampler.block, seed=sampler.seed, shuffle=sampler.shuffle, num_replicas=1, rank=0,
    )  # fmt: skip
    whole.set_epoch(epoch)
    return list(whole)


def _check_bound(sources: np.ndarray, shares: list[Fraction], block: int) -> None:
    """The bound of shardwise._core.mixture on a plan's source sequence, checked exactly."""
    length = len(sources)
    for i, share in enumerate(shares):
        hits = np.concatenate([[0], np.cumsum(sources == i)])  # hits[m]: draws of i in [0, m)
        # Block boundaries: |C_i(m) - w_i m| < 1.
        for m in range(0, length + 1, block):
            assert abs(hits[m] - share * m) < 1, (i, m)
        # Whole-block windows of every length: < 2.
        boundaries = hits[::block]
        ends = np.arange(len(boundaries)) * block
        for start in range(len(boundaries)):
            deviation = [abs(int(h) - int(hits[ends[start]]) - share * int(e - ends[start]))
                         for h, e in zip(boundaries[start:], ends[start:], strict=True)]  # fmt: skip
            assert max(deviation) < 2, (i, start)
        # Any window: < 2 + 2 * (w_i * B + 1), the cut blocks' prefix deviation added at both ends.
        slack = 2 + 2 * (share * block + 1)
        deviation = hits - np.asarray([float(share * m) for m in range(length + 1)])
        assert deviation.max() - deviation.min() < slack, i


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixture_weights(), st.integers(min_value=1, max_value=3), st.sampled_from(["shuffled", "interleaved", "fixed"]),
       st.integers(0, 2**32))  # fmt: skip
def test_proportion_bound_holds_for_random_weights_and_sizes(
    drawn: tuple[list[int], list[float]], scale: int, order: str, seed: int
) -> None:
    """Counts stay within 1 of w*m at block ends, 2 over whole-block windows, and the stated slack anywhere."""
    sizes, weights = drawn
    shuffle, interleave = order != "fixed", order == "interleaved"
    sampler = MixtureSampler(sizes, weights, num_samples=1, seed=seed, shuffle=shuffle, num_replicas=1, rank=0)
    block = sampler.block * scale
    sampler = MixtureSampler(sizes, weights, num_samples=12 * block + block // 2, block=block, seed=seed,
                             shuffle=shuffle, interleave=interleave, num_replicas=1, rank=0)  # fmt: skip
    a, denominator = exact_weights(np.asarray(weights, dtype=np.float64))
    shares = [Fraction(x, denominator) for x in a]
    plan = sampler._plan
    found = plan.locate(seed, 0, np.arange(sampler.plan.size(0), dtype=np.int64))
    _check_bound(found.sources, shares, block)
    whole = slice(0, 12 * block)  # the cut last block holds a subset of its block's draws, not a prefix
    for i in range(len(sizes)):  # over whole blocks each source's draws are numbered 0, 1, 2, ..., none missing
        draws = np.sort(found.draws[whole][found.sources[whole] == i])
        assert draws.tolist() == list(range(len(draws)))
    indices = list(sampler)
    assert (sampler.sources_of(indices) == found.sources).all()


def test_interleave_keeps_every_window_close_and_ranks_balanced() -> None:
    """interleave=True: every 1k window within 4 of its target; a strided rank gets the mix to ~1/block."""
    sampler = MixtureSampler([10**6] * 3, [0.5, 0.3, 0.2], num_samples=10**5, interleave=True, num_replicas=1, rank=0)
    sources = sampler._plan.locate(0, 0, np.arange(10**5)).sources
    for i, share in enumerate([0.5, 0.3, 0.2]):
        hits = np.concatenate([[0], np.cumsum(sources == i)])
        assert np.abs(hits[1000:] - hits[:-1000] - share * 1000).max() <= 4
        # A rank's share may differ by up to about 1/block: its stride can alias the blocks' quotas (2, 3, 2, ...).
        assert abs(np.mean(sources[1::4] == i) - share) < 1 / sampler.block


def test_exact_fractions_and_smallest_block() -> None:
    """Simple weights are exact ratios, and the default block holds the smallest weight once."""
    assert exact_weights(np.asarray([0.5, 0.3, 0.2])) == ((5, 3, 2), 10)
    assert exact_weights(np.asarray([3.0, 1.0, 0.0])) == ((3, 1, 0), 4)
    a, d = exact_weights(np.asarray([np.pi, 1e-6]))
    assert d == 2**30 and sum(a) == d and a[1] >= 1
    assert Weights((5, 3, 2), 10).smallest_block() == 5
    assert MixtureSampler([10, 10], [0.99, 0.01], num_samples=10).block == 100


def test_every_block_holds_its_exact_share_when_integer() -> None:
    """Weights 1/2, 1/4, 1/4 with block 8: every block of the plan is exactly 4, 2, 2."""
    sampler = MixtureSampler([100, 7, 3], [0.5, 0.25, 0.25], num_samples=800, block=8, num_replicas=1, rank=0)
    sources = sampler.sources_of(list(sampler)).reshape(-1, 8)
    for row in sources:
        assert np.bincount(row, minlength=3).tolist() == [4, 2, 2]


def test_global_batches_carry_exact_shares_with_scheduled_batches() -> None:
    """ScheduledBatchSampler over a mixture whose block is the global batch: every step is 8/4/4."""
    world_size, per_rank = 4, 4
    batches = []
    for rank in range(world_size):
        sampler = MixtureSampler([300, 40, 9], [2, 1, 1], num_samples=16 * 20, block=world_size * per_rank, seed=3)
        batches.append(list(ScheduledBatchSampler(sampler, batch_size=per_rank, num_replicas=world_size, rank=rank)))
    for step in zip(*batches, strict=True):
        drawn = [i for batch in step for i in batch]
        sources = np.searchsorted([300, 340, 349], drawn, side="right")
        assert np.bincount(sources, minlength=3).tolist() == [8, 4, 4]


def test_each_source_cycles_on_its_own_with_a_new_order_per_cycle() -> None:
    """A 10-sample source drawn 50 times: each run of 10 draws is a permutation, and the orders differ."""
    sampler = MixtureSampler([1000, 10], [0.5, 0.5], num_samples=100, block=2, num_replicas=1, rank=0)
    found = sampler._plan.locate(sampler.seed, 0, np.arange(100))
    indices = np.asarray(list(sampler))
    small = indices[found.sources == 1][np.argsort(found.draws[found.sources == 1])]
    cycles = small.reshape(5, 10)
    for cycle in cycles:
        assert sorted(cycle.tolist()) == list(range(1000, 1010))
    assert len({tuple(c) for c in cycles.tolist()}) == 5
    large = indices[found.sources == 0]
    assert len(set(large.tolist())) == 50  # the large source does not repeat before it is used up


def test_shuffle_false_reads_each_source_block_by_block_in_order() -> None:
    """shuffle=False: each block holds the next draws of every source in a fixed interleave, the same each epoch."""
    sampler = MixtureSampler([5, 100], [1, 3], num_samples=40, shuffle=False, num_replicas=1, rank=0)
    first = list(sampler)
    assert sampler.block == 4
    blocks = np.asarray(first).reshape(-1, 4)
    small = [sorted(i for i in row if i < 5) for row in blocks]
    large = [sorted(i - 5 for i in row if i >= 5) for row in blocks]
    assert [i for row in small for i in row] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert [i for row in large for i in row] == list(range(30))
    assert list(sampler) == first


@pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted", "primary"])
def test_exhaustion_stops_cover_the_exhausted_source_and_end_at_its_block(stop: str) -> None:
    """Each exhaustion rule ends at the end of the block where its source is used up, with all its samples."""
    sizes, weights = [40, 300, 25], [0.25, 0.5, 0.25]
    sampler = MixtureSampler(sizes, weights, stop=stop, primary=0 if stop == "primary" else None, block=8,
                             num_replicas=1, rank=0)  # fmt: skip
    plan = list(sampler)
    assert len(plan) == sampler.plan.size(0) and len(plan) % 8 == 0
    counts = np.bincount(sampler.sources_of(plan), minlength=3)
    before = np.bincount(sampler.sources_of(plan[:-8]), minlength=3)
    covered = [set(range(o, o + n)) <= set(plan) for o, n in zip(sampler.offsets, sizes, strict=True)]
    exhausted = counts >= np.asarray(sizes)
    exhausted_before = before >= np.asarray(sizes)
    if stop == "first_exhausted":
        assert exhausted.any() and not exhausted_before.any()
        assert covered[int(np.argmax(exhausted))]
    elif stop == "all_exhausted":
        assert exhausted.all() and not exhausted_before.all() and all(covered)
    else:
        assert exhausted[0] and not exhausted_before[0] and covered[0]


def test_num_samples_stop_and_defaults() -> None:
    """num_samples sets the plan; without it the default stop is all_exhausted; contradictions are refused."""
    assert len(MixtureSampler(SIZES, WEIGHTS, num_samples=77, num_replicas=1, rank=0)) == 77
    assert MixtureSampler(SIZES, WEIGHTS).stop is MixtureStop.ALL_EXHAUSTED
    with pytest.raises(ValueError, match="num_samples=5 contradicts stop='first_exhausted'"):
        MixtureSampler(SIZES, WEIGHTS, num_samples=5, stop="first_exhausted")
    with pytest.raises(ValueError, match="primary=1 has no effect"):
        MixtureSampler(SIZES, WEIGHTS, num_samples=5, primary=1)
    with pytest.raises(ValueError, match="primary should be the index"):
        MixtureSampler(SIZES, WEIGHTS, stop="primary")
    with pytest.raises(ValueError, match="primary=2 has weight 0"):
        MixtureSampler(SIZES, [1, 1, 0], stop="primary", primary=2)
    with pytest.raises(ValueError, match="num_samples should be given"):
        MixtureSampler(SIZES, WEIGHTS, stop="num_samples")


def test_weight_schedule_mid_epoch_resumed_at_another_world_size() -> None:
    """A by_samples change mid-epoch: saved at W=4, resumed at W=3, nothing lost or doubled, new weights after it."""
    schedule = WeightSchedule.by_samples({0: [0.75, 0.25], 1_000: [0.25, 0.75]})
    make = lambda w, r: MixtureSampler([5_000, 900], schedule, num_samples=2_000, block=8, seed=5,
                                       num_replicas=w, rank=r)  # fmt: skip
    plan = _plan(make(1, 0), epoch=1)
    # Epoch 1 starts at sample 2000: past the change, so the whole epoch is 1:3.
    assert np.bincount(make(1, 0).sources_of(plan), minlength=2).tolist() == [500, 1500]
    epoch0 = _plan(make(1, 0))
    sources = make(1, 0).sources_of(epoch0)
    assert np.bincount(sources[:1000], minlength=2).tolist() == [750, 250]
    assert np.bincount(sources[1000:], minlength=2).tolist() == [250, 750]
    seen: list[int] = []
    state = None
    for rank in range(4):
        sampler = make(4, rank)
        iterator = iter(sampler)
        seen += [next(iterator) for _ in range(120)]  # 480 positions: before the change
        state = state or sampler.state_dict()
    assert state is not None and state["consumed"] == 480
    for rank in range(3):
        resumed = make(3, rank)
        resumed.load_state_dict(state)
        seen += list(resumed)
    extra = Counter(seen) - Counter(epoch0)
    assert not Counter(epoch0) - Counter(seen) and sum(extra.values()) <= 2


def test_by_epoch_schedule_and_curriculum_counts() -> None:
    """by_epoch weights switch at the epoch boundary; describe() reports the weights in effect."""
    schedule = WeightSchedule.by_epoch({0: [1, 0], 2: [1, 1]})
    sampler = MixtureSampler([100, 100], schedule, num_samples=40, num_replicas=1, rank=0)
    per_epoch = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        per_epoch.append(np.bincount(sampler.sources_of(list(sampler)), minlength=2).tolist())
        assert sampler.describe()["sources"][1]["weight"] == (0.5 if epoch >= 2 else 0.0) or epoch < 2
    assert per_epoch == [[40, 0], [40, 0], [20, 20]]
    assert schedule.at(epoch=5, samples=0) == [1.0, 1.0]


def test_describe_and_state_report_per_source_draws_and_cycles() -> None:
    """Per-source draws and completed cycles are those of the plan's prefix, mid-block too."""
    sampler = MixtureSampler(SIZES, WEIGHTS, num_samples=500, num_replicas=2, rank=0, seed=8)
    iterator = iter(sampler)
    for _ in range(61):
        next(iterator)
    state = sampler.state_dict()
    plan = _plan(sampler)
    expected = np.bincount(sampler.sources_of(plan[: state["consumed"]]), minlength=3).tolist()
    assert state["mixture"]["consumed"] == expected and state["mixture"]["position"] == state["consumed"]
    assert state["mixture"]["cycles"] == [c // n for c, n in zip(expected, SIZES, strict=True)]
    described = sampler.describe()
    assert [s["consumed"] for s in described["sources"]] == expected
    assert [s["weight"] for s in described["sources"]] == WEIGHTS
    assert described["plan_size"] == 500 and described["block"] == 5


def test_state_counts_stop_at_the_block_start_deep_inside_a_large_block() -> None:
    """Far into a large block, the state's per-source counts describe the block's start (cheap on every step)."""
    sampler = MixtureSampler([10**6] * 2, [0.5, 0.5], num_samples=10**6, block=1 << 16, num_replicas=1, rank=0)
    iterator = iter(sampler)
    for _ in range(5000):
        next(iterator)
    assert sampler.state_dict()["mixture"] == {"position": 0, "consumed": [0, 0], "cycles": [0, 0]}
    assert sum(s["consumed"] for s in sampler.describe()["sources"]) == 5000


def test_resume_position_maps_without_replay_at_a_late_position() -> None:
    """Loading consumed = 5e8 of a 1e9 plan yields exactly what the uninterrupted plan holds there."""
    sampler = MixtureSampler([10**9, 10**7, 10**5, 10**3, 7], [0.4, 0.3, 0.2, 0.07, 0.03], num_samples=10**9,
                             seed=1, num_replicas=8, rank=3)  # fmt: skip
    state = sampler.state_dict() | {"consumed": 5 * 10**8}
    resumed = MixtureSampler(sampler.sizes, sampler.weights, num_samples=10**9, seed=1, num_replicas=6, rank=2)
    resumed.load_state_dict(state)
    head = [i for _, i in zip(range(5), iter(resumed), strict=False)]
    positions = np.asarray([5 * 10**8 + 2 + 6 * k for k in range(5)])
    assert head == resumed._plan.indices(1, 0, positions).tolist()
    boundary = 5 * 10**8 // resumed.block * resumed.block  # at a block boundary: within 1 of the target
    counts = resumed.source_counts(0, boundary)
    assert sum(counts) == boundary
    assert all(abs(c - Fraction(a, 100) * boundary) < 1 for c, a in zip(counts, [40, 30, 20, 7, 3], strict=True))


def test_mixture_dataset_tells_the_source_of_an_index() -> None:
    """Mixture is a ConcatDataset with sizes, names, offsets and the source of an index; the sampler reads it."""
    data = Mixture({"web": list(range(5)), "code": list(range(100, 103))})
    assert len(data) == 8 and data[6] == 101
    assert data.sizes == [5, 3] and data.offsets == [0, 5] and data.names == ["web", "code"]
    assert data.locate(5) == (1, 0) and data.locate(-1) == (1, 2) and data.source(4) == 0
    assert data.sources([0, 4, 5, 7]).tolist() == [0, 0, 1, 1]
    assert repr(data) == "Mixture(web=5, code=3)"
    sampler = MixtureSampler(data, [1, 1], num_samples=8, num_replicas=1, rank=0)
    assert sampler.sizes.tolist() == [5, 3]
    with pytest.raises(IndexError):
        data.locate(8)
    with pytest.raises(ValueError, match="dataset 'b' is empty"):
        Mixture({"a": [1], "b": []})


def test_temperature_weights() -> None:
    """w_i ~ n_i ** alpha: alpha 1 is proportional, 0 uniform; bad alpha is refused."""
    assert temperature_weights([300, 100], alpha=1) == pytest.approx([0.75, 0.25])
    assert temperature_weights([300, 100], alpha=0) == pytest.approx([0.5, 0.5])
    assert temperature_weights([10**12, 1], alpha=3)[1] >= 0
    with pytest.raises(ValueError, match="alpha should be a finite number >= 0"):
        temperature_weights([3, 1], alpha=-1)
    with pytest.raises(ValueError, match="alpha should be a finite number >= 0"):
        temperature_weights([3, 1], alpha=float("inf"))
    with pytest.raises(TypeError, match="alpha should be a real number"):
        temperature_weights([3, 1], alpha=True)


def test_fingerprint_refuses_another_mixture() -> None:
    """A state from other weights or sizes is refused naming the field."""
    state = MixtureSampler(SIZES, WEIGHTS, num_samples=10).state_dict()
    with pytest.raises(shardwise.StateMismatchError, match="weights"):
        MixtureSampler(SIZES, [0.4, 0.4, 0.2], num_samples=10).load_state_dict(state)
    with pytest.raises(shardwise.StateMismatchError, match="sizes"):
        MixtureSampler([1000, 50, 11], WEIGHTS, num_samples=10).load_state_dict(state)


BAD = [
    ({"weights": [0.5, -0.1, 0.6]}, ValueError, r"weights should be finite and non-negative, but got weights\[1\]=-0.1"),
    ({"weights": [0.5, float("nan"), 0.5]}, ValueError, r"weights should be finite and non-negative, but got weights\[1\]=nan"),
    ({"weights": [0, 0, 0]}, ValueError, "weights should have at least one positive weight"),
    ({"weights": [0.5, 0.5]}, ValueError, r"weights should hold one weight per source \(3\), but got 2"),
    ({"weights": ["a", "b", "c"]}, TypeError, "weights should hold real numbers"),
    ({"weights": [1, True, 1]}, TypeError, "weights should hold real numbers"),
    ({"sizes": [10, 0, 5]}, ValueError, r"sizes should hold positive sizes, but got sizes\[1\]=0: an empty source"),
    ({"sizes": [10, True, 5]}, TypeError, "sizes should hold integer sizes"),
    ({"sizes": [10.0, 2.0, 5.0]}, TypeError, "sizes should hold integer sizes"),
    ({"sizes": []}, ValueError, "sizes should hold at least one size"),
    ({"sizes": 7}, TypeError, "sizes should be a sequence of source sizes"),
    ({"num_samples": True}, TypeError, "num_samples should be an integer, but got num_samples=True"),
    ({"num_samples": -1}, ValueError, "num_samples should be a non-negative integer"),
    ({"block": 2}, ValueError, "block should be at least 5"),
    ({"block": True}, TypeError, "block should be an integer"),
    ({"stop": "forever"}, ValueError, "stop should be one of 'num_samples', 'first_exhausted'"),
    ({"shuffle": 1}, TypeError, "shuffle should be True or False"),
    ({"even": "trim"}, ValueError, "even should be one of 'pad', 'drop'"),
    ({"weights": {0: [1, 1, 1]}}, TypeError, "use WeightSchedule.by_samples"),
    ({"weights": WeightSchedule.by_samples({0: [1, 1], 10: [1, 0]})}, ValueError,
     r"weights\[0\] should hold one weight per source \(3\)"),
]


@pytest.mark.parametrize(("change", "error", "match"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_refused_naming_the_parameter(change: dict, error: type, match: str) -> None:
    """Each bad argument raises at construction with a message naming it."""
    kwargs = {"sizes": SIZES, "weights": WEIGHTS, "num_samples": 10} | change
    with pytest.raises(error, match=match):
        MixtureSampler(kwargs.pop("sizes"), kwargs.pop("weights"), **kwargs)


@pytest.mark.parametrize(
    ("points", "error", "match"),
    [
        ({0: [1, 1], 10: [1, 0], 5: [0, 1]}, ValueError, "strictly increasing, but got 5 after 10"),
        ({3: [1, 1]}, ValueError, "should start at samples 0"),
        ({0: [1, 1], 10: [1, -1]}, ValueError, r"weights\[10\] should be finite and non-negative"),
        ({0: [1, 1], True: [1, 0]}, TypeError, "should be an integer, but got"),
        ({0: [1, 1], 10: [1, 1, 1]}, ValueError, "one weight per source, but got lengths"),
        ({}, TypeError, "non-empty mapping"),
    ],
)
def test_bad_schedules_are_refused(points: dict, error: type, match: str) -> None:
    """A schedule out of order, not starting at 0, or with bad weights is refused."""
    with pytest.raises(error, match=match):
        WeightSchedule.by_samples(points)


def test_by_samples_schedule_with_an_exhaustion_stop_follows_earlier_epochs() -> None:
    """Epoch 1 starts where epoch 0 ended; a change 20 samples into epoch 1 applies from there, block by block."""
    schedule = WeightSchedule.by_samples({0: [0.5, 0.5], 80: [0.75, 0.25]})
    sampler = MixtureSampler([30, 10], schedule, stop="all_exhausted", block=4, num_replicas=1, rank=0)
    assert sampler.plan.size(0) == 60  # source 0 needs 30 draws at 1/2
    assert sampler._plan.epoch_start(1) == 60
    sampler.set_epoch(1)
    sources = sampler.sources_of(list(sampler)).reshape(-1, 4)
    assert [np.bincount(row, minlength=2).tolist() for row in sources[:5]] == [[2, 2]] * 5
    assert all(np.bincount(row, minlength=2).tolist() == [3, 1] for row in sources[5:])
    counts = np.bincount(sources.reshape(-1), minlength=2)
    assert counts[0] >= 30 and counts[0] - 3 < 30  # ends in the block where source 0 is used up


def test_docstring_examples_run() -> None:
    """The Example sections of the mixture modules run as written."""
    import doctest

    from shardwise._core import mixture as core
    from shardwise.data import mixture as data
    from shardwise.samplers import mixture as samplers

    for module in (core, data, samplers):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_torchdata_stateful_loader_resumes_a_mixture_mid_epoch() -> None:
    """torchdata's StatefulDataLoader saves a MixtureSampler mid-epoch; a new loader continues exactly."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = Mixture([range(100), range(1000, 1030), range(2000, 2007)])

    def loader() -> StatefulDataLoader:
        sampler = MixtureSampler(data, [0.5, 0.3, 0.2], stop="all_exhausted", seed=4, num_replicas=2, rank=1)
        return StatefulDataLoader(data, sampler=sampler, batch_size=4)

    whole = [b.tolist() for b in loader()]
    first = loader()
    iterator = iter(first)
    head = [next(iterator).tolist() for _ in range(5)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == whole
