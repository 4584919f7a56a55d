"""WeightedSampler: exact draws, frequencies (chi-square), successive sampling, the integer core, bad input, real ranks."""

from __future__ import annotations

import hashlib
import itertools
import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from shardwise import StateMismatchError, WeightedSampler
from shardwise._core.draws import counter_hash, mul_wide, uniform_below
from shardwise.index import cache as index_cache
from shardwise.index.weights import WEIGHT_TABLE, WeightTable, distinct_draws, quantise
from shardwise.samplers import weighted
from shardwise.samplers.weighted import DISTINCT_PLAN
from shardwise.tools.launch import run_distributed
from tests.lockstep import lockstep_epochs
from tests.memcap import first_units_under_cap

WEIGHTS = [1.0, 2.0, 3.0, 4.0, 0.0, 10.0]


def make(weights=WEIGHTS, **kw) -> WeightedSampler:
    options = {"num_samples": 100, "num_replicas": 1, "rank": 0, "seed": 7}
    options.update(kw)
    return WeightedSampler(weights, **options)


def chi_square(observed: Counter, expected: dict[int, float]) -> float:
    return sum((observed.get(k, 0) - e) ** 2 / e for k, e in expected.items())


def test_frequencies_follow_the_weights() -> None:
    """60k draws: chi-square against the weights is small (df=4, 99.99% quantile 23.5); zero weight never drawn."""
    draws = Counter(make(num_samples=60_000))
    assert 4 not in draws
    total = sum(WEIGHTS)
    expected = {k: 60_000 * w / total for k, w in enumerate(WEIGHTS) if w > 0}
    assert chi_square(draws, expected) < 30


def test_draws_are_a_pure_function_of_seed_epoch_and_position() -> None:
    """The same (seed, epoch) gives the same draws; another epoch or seed gives others."""
    sampler = make()
    first, second = list(sampler), list(sampler)
    assert first != second
    assert list(make()) == first
    assert list(make(seed=8)) != first
    again = make()
    again.set_epoch(1)
    assert list(again) == second


def test_ranks_draw_their_own_positions() -> None:
    """Rank r of W draws plan positions r, r+W, ...: together the W=1 plan, equal lengths."""
    plan = list(make(num_samples=101))
    per_rank = [list(make(num_samples=101, num_replicas=4, rank=r)) for r in range(4)]
    assert {len(draws) for draws in per_rank} == {26}
    interleaved = [per_rank[k % 4][k // 4] for k in range(104)]
    assert interleaved[:101] == plan
    assert interleaved[101:] == plan[:3]
    dropped = [list(make(num_samples=101, num_replicas=4, rank=r, drop_last=True)) for r in range(4)]
    assert {len(draws) for draws in dropped} == {25}


def test_is_a_distributed_sampler_with_torch_attributes() -> None:
    """A DistributedSampler subclass (frameworks keep it); num_samples is per epoch, len per rank."""
    sampler = make(num_samples=10, num_replicas=3, rank=1)
    assert isinstance(sampler, DistributedSampler)
    assert sampler.num_samples == 10
    assert len(sampler) == 4
    assert sampler.num_weights == 6
    loader = DataLoader(torch.arange(6), batch_size=2, sampler=sampler)
    assert sum(len(batch) for batch in loader) == 4


def test_more_than_two_to_the_24_weights(tmp_path) -> None:
    """Beyond torch.multinomial's 2**24 categories: the draws land where the weight is."""
    weights = np.zeros(2**24 + 3, dtype=np.float32)
    weights[-1], weights[5] = 3.0, 1.0
    draws = Counter(make(weights, num_samples=4_000, cache_dir=tmp_path))
    assert set(draws) == {5, 2**24 + 2}
    assert abs(draws[2**24 + 2] / 4_000 - 0.75) < 0.04


def test_without_replacement_draws_distinct_indices() -> None:
    """replacement=False: distinct indices; asking for every positive weight returns all of them."""
    sampler = make(num_samples=5, replacement=False)
    for _ in range(5):
        assert sorted(sampler) == [0, 1, 2, 3, 5]
    weights = np.random.default_rng(0).exponential(size=5_000) ** 4
    draws = list(make(weights, num_samples=4_000, replacement=False))
    assert len(set(draws)) == 4_000


def test_without_replacement_is_successive_sampling() -> None:
    """Orders of 3 items over 3000 epochs match P(a) P(b | not a): chi-square, df=5."""
    weights = [1.0, 2.0, 7.0]
    sampler = make(weights, num_samples=3, replacement=False)
    orders = Counter(tuple(sampler) for _ in range(3_000))
    expected = {}
    for a, b, c in itertools.permutations(range(3)):
        expected[(a, b, c)] = 3_000 * weights[a] / 10 * weights[b] / (10 - weights[a])
    assert chi_square(orders, expected) < 30


def test_uniform_below_is_exact_and_in_range() -> None:
    """Lemire reduction: in range for huge bounds, uniform for a small one (chi-square, df=5)."""
    keys = np.array([11, 12], dtype=np.uint64)
    positions = np.arange(60_000, dtype=np.int64)
    huge = uniform_below(2**62 - 1, positions, keys)
    assert huge.min() >= 0
    assert huge.max() < 2**62 - 1
    assert huge.max() > 2**61
    small = Counter(uniform_below(6, positions, keys).tolist())
    assert chi_square(small, dict.fromkeys(range(6), 10_000)) < 30
    assert np.array_equal(uniform_below(6, positions[5:9], keys), uniform_below(6, positions, keys)[5:9])


def test_wide_multiplication_matches_python_integers() -> None:
    """mul_wide gives the exact 128-bit product's high and low words."""
    words = counter_hash(np.arange(1_000, dtype=np.int64), np.array([1, 2], dtype=np.uint64))
    for bound in (1, 3, 2**32 + 5, 2**61 + 12345, 2**64 - 1):
        high, low = mul_wide(words, bound)
        for word, h, lo in zip(words.tolist(), high.tolist(), low.tolist(), strict=True):
            assert (h, lo) == divmod(word * bound, 2**64)


def test_table_locates_like_a_binary_search() -> None:
    """The guide-table search equals searchsorted on the cumulative sum, with zeros and skew."""
    rng = np.random.default_rng(3)
    for size in (1, 2, 7, 1_000, 50_000):
        weights = rng.exponential(size=size) ** 6
        weights[rng.random(size) < 0.3] = 0
        weights[0] += 1e-3
        cdf = quantise(weights).cdf
        table = WeightTable(cdf)
        values = np.concatenate([rng.integers(0, table.total, 20_000), [0, table.total - 1]])
        assert np.array_equal(table.locate(values), np.searchsorted(cdf, values, side="right"))


def test_quantisation_keeps_ratios_and_support() -> None:
    """Power-of-two scaling keeps exact ratios; a tiny positive weight stays drawable; total < 2**62."""
    units = np.diff(quantise(np.array([1.0, 2.0, 4.0, 0.0])).cdf, prepend=0)
    assert units[1] == 2 * units[0]
    assert units[2] == 4 * units[0]
    assert units[3] == 0
    cdf = quantise(np.array([1e300, 1e-300, 0.0])).cdf
    assert np.diff(cdf, prepend=0).tolist()[1:] == [1, 0]
    assert int(quantise(np.full(1_000, np.finfo(np.float64).max)).cdf[-1]) < 2**62


def test_integer_and_tensor_weights_are_accepted() -> None:
    """Integer lists, float32 arrays and CPU tensors give the same draws as float64."""
    expected = list(make([1.0, 2.0, 3.0]))
    assert list(make([1, 2, 3])) == expected
    assert list(make(np.array([1, 2, 3], dtype=np.float32))) == expected
    assert list(make(torch.tensor([1.0, 2.0, 3.0]))) == expected


def test_state_resumes_and_refuses_other_weights() -> None:
    """A mid-epoch state resumes exactly; a state of other weights is refused by name."""
    sampler = make(replacement=False, num_samples=5)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(2)]
    state = sampler.state_dict()
    resumed = make(replacement=False, num_samples=5)
    resumed.load_state_dict(state)
    assert head + list(resumed) == list(make(replacement=False, num_samples=5))
    with pytest.raises(StateMismatchError, match="weights_digest"):
        make([1.0, 2.0, 3.0, 4.0, 0.0, 11.0], replacement=False, num_samples=5).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="replacement"):
        make(num_samples=5).load_state_dict(state)


def test_pickle_and_repr() -> None:
    """Pickling keeps the plan; repr shows the sizes and options."""
    sampler = make(replacement=False, num_samples=5)
    expected = list(sampler)
    sampler.set_epoch(0)
    assert list(pickle.loads(pickle.dumps(sampler))) == expected
    text = repr(sampler)
    for part in ("weights=6", "num_samples=5", "replacement=False", "drop_last=False", "seed=7"):
        assert part in text


@pytest.mark.parametrize(
    ("weights", "kwargs", "error", "match"),
    [
        ([1.0, float("nan")], {}, ValueError, r"finite and non-negative, but got weights\[1\]=nan"),
        ([float("inf"), 1.0], {}, ValueError, r"finite and non-negative, but got weights\[0\]=inf"),
        ([1.0, -0.5], {}, ValueError, r"finite and non-negative, but got weights\[1\]=-0.5"),
        ([0.0, 0.0, 0.0], {}, ValueError, "at least one positive weight, but all 3 weights are zero"),
        ([[1.0, 2.0]], {}, ValueError, "weights should be a 1-D sequence"),
        ([], {}, ValueError, "weights should hold at least one weight"),
        (["a", "b"], {}, TypeError, "weights should hold real numbers"),
        ([True, False], {}, TypeError, "weights should hold real numbers"),
        ([1j, 2j], {}, TypeError, "weights should hold real numbers"),
        ([1.0, 2.0], {"num_samples": -1}, ValueError, "num_samples should be a non-negative integer"),
        ([1.0, 2.0], {"num_samples": True}, TypeError, "num_samples should be an integer"),
        ([1.0, 2.0], {"num_samples": 2.5}, TypeError, "num_samples should be an integer"),
        ([1.0, 0.0, 2.0], {"num_samples": 3, "replacement": False}, ValueError,
         "num_samples should be at most the 2 positive weights with replacement=False"),
        ([1.0, 2.0], {"replacement": "no"}, TypeError, "replacement should be True or False"),
        ([1.0, 2.0], {"drop_last": None}, TypeError, "drop_last should be True or False"),
        ([1.0, 2.0], {"seed": 1.5}, TypeError, "seed should be an integer"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_naming_the_parameter(weights: list, kwargs: dict, error: type, match: str) -> None:
    """Every bad argument fails at construction with a message naming it."""
    options = {"num_samples": 4}
    options.update(kwargs)
    with pytest.raises(error, match=match):
        WeightedSampler(weights, **options)


WORLD_WEIGHTS = np.arange(1_000) % 7  # zeros at every 7th index


def _weighted_main(rank: int, world_size: int) -> list[list[int]]:
    sampler = WeightedSampler(WORLD_WEIGHTS, num_samples=999, seed=13)
    loader = DataLoader(torch.arange(1_000), batch_size=16, sampler=sampler)
    return [[i for batch in batches for i in batch] for batches in lockstep_epochs(loader, sampler)]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [4])
def test_real_ranks_draw_the_single_process_plan(world_size: int) -> None:
    """On W gloo ranks: equal steps, and each rank draws exactly its positions of the W=1 plan."""
    reports = run_distributed(_weighted_main, world_size, timeout=180)
    for epoch in range(2):
        assert {len(report[epoch]) for report in reports} == {-(-999 // world_size)}
        single = WeightedSampler(WORLD_WEIGHTS, num_samples=999, seed=13, num_replicas=1, rank=0)
        single.set_epoch(epoch)
        plan = list(single)
        for rank, report in enumerate(reports):
            assert report[epoch] == [plan[(rank + k * world_size) % 999] for k in range(len(report[epoch]))]
        assert not {i for report in reports for i in report[epoch]} & set(range(0, 1_000, 7))


def test_builds_and_iterates_over_a_memmap_under_a_memory_cap(tmp_path) -> None:
    """1e7 memory-mapped weights: a process capped at 64 MiB of private memory builds the shared table and draws."""
    n = 10**7
    weights = np.lib.format.open_memmap(tmp_path / "weights.npy", mode="w+", dtype=np.float32, shape=(n,))
    weights[:] = np.random.default_rng(0).exponential(size=n).astype(np.float32)
    weights.flush()
    options = {"num_samples": n, "num_replicas": 8, "rank": 3, "seed": 1}
    first = first_units_under_cap(
        f"weights = np.load({str(tmp_path / 'weights.npy')!r}, mmap_mode='r')",
        f"shardwise.WeightedSampler(weights, cache_dir={str(tmp_path / 'cache')!r}, **{options!r})",
        n=n, first=20, skip=300000,
    )
    with pytest.warns(RuntimeWarning, match="private memory"):
        uncached = WeightedSampler(np.load(tmp_path / "weights.npy", mmap_mode="r"), cache_dir=False, **options)
    draws = iter(uncached)
    assert first == str([next(draws) for _ in range(20)])


def test_pickles_memory_mapped_tables_by_reference(tmp_path) -> None:
    """A sampler whose weight table is memory-mapped pickles as file names (a small blob) and draws the same."""
    np.save(tmp_path / "weights.npy", np.arange(2**17, dtype=np.float32) % 13)
    sampler = make(np.load(tmp_path / "weights.npy", mmap_mode="r"), num_samples=500, cache_dir=tmp_path / "cache")
    blob = pickle.dumps(sampler)
    assert len(blob) < 20_000
    assert list(pickle.loads(blob)) == list(sampler)


# -- replacement=False: the epoch's plan in the node's index cache ---------------------------------------
HEAVY = np.random.default_rng(2**17).exponential(size=2**17) ** 4  # >= SHARED_MIN: the cache path; rebuilds the table
PINNED = {0: "bd740e8534cdbda1", 1: "2aa0a6c8c87a6311"}  # sha256 of the plans before they moved to the cache


def _distinct(weights=HEAVY, **kw) -> WeightedSampler:
    options = {"num_samples": 2**15, "replacement": False, "num_replicas": 1, "rank": 0, "seed": 3}
    options.update(kw)
    return WeightedSampler(weights, **options)


def _sha(plan: object) -> str:
    return hashlib.sha256(np.asarray(plan, dtype=np.int64).tobytes()).hexdigest()[:16]


def _plan_entries(cache: Path) -> dict[str, Path]:
    """{key: entry} of the plan entries in ``cache``."""
    entries = {}
    for entry in cache.glob(f"{DISTINCT_PLAN}-*"):
        entries[json.loads((entry / "manifest.json").read_text())["key"]] = entry
    return entries


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = weighted.distinct_draws

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(weighted, "distinct_draws", counted)
    return calls


def test_distinct_plan_is_unchanged_in_memory_cached_and_reopened(tmp_path, monkeypatch) -> None:
    """Over 2**17 weights (3 table rebuilds): the plan pinned before the cache, with cache_dir=False, cached, reopened."""
    calls = _count_builds(monkeypatch)
    cached = _distinct(cache_dir=tmp_path)
    with pytest.warns(RuntimeWarning, match="private memory"):
        uncached = _distinct(cache_dir=False)
        for epoch, pinned in PINNED.items():
            uncached.set_epoch(epoch)
            assert _sha(list(uncached)) == pinned
    for epoch, pinned in PINNED.items():
        cached.set_epoch(epoch)
        assert _sha(list(cached)) == pinned
        assert isinstance(cached._cached[2], np.memmap) and not cached._cached[2].flags.writeable  # type: ignore[index]
    assert _sha(distinct_draws(cached._table, 2**15, 3, 1)) == PINNED[1]  # the plain function, in memory
    assert len(calls) == 4
    entry = _plan_entries(tmp_path)[f"weights={cached._digest} num_samples={2**15} seed=3 epoch=1"]
    stamp = (entry / "plan.npy").stat().st_mtime_ns
    again = _distinct(cache_dir=tmp_path)
    again.set_epoch(1)
    assert _sha(list(again)) == PINNED[1]
    assert len(calls) == 4 and (entry / "plan.npy").stat().st_mtime_ns == stamp  # opened, not rebuilt


def test_distinct_draws_fills_the_given_array() -> None:
    """distinct_draws writes into out and returns it; a wrong shape or dtype is refused."""
    table = WeightTable(quantise(np.asarray(HEAVY[:5_000])).cdf)
    out = np.full(1_000, -1, dtype=np.int64)
    assert distinct_draws(table, 1_000, 3, 0, out) is out
    np.testing.assert_array_equal(out, distinct_draws(table, 1_000, 3, 0))
    assert len(set(out.tolist())) == 1_000
    with pytest.raises(ValueError, match=r"out should be a \(1000,\) int64 array"):
        distinct_draws(table, 1_000, 3, 0, np.empty(999, dtype=np.int64))


def test_plans_of_older_epochs_are_removed_when_epoch_e_plus_2_is_built(tmp_path, monkeypatch) -> None:
    """Building epoch e removes this sampler's plans but e and e - 1; other seeds' plans and the table stay."""
    calls = _count_builds(monkeypatch)
    other = _distinct(num_samples=1_000, seed=4, cache_dir=tmp_path)
    next(iter(other))
    sampler = _distinct(num_samples=1_000, cache_dir=tmp_path)
    mine = f"weights={sampler._digest} num_samples=1000 seed=3 epoch="
    for epoch in range(4):
        sampler.set_epoch(epoch)
        plan = list(sampler)
        assert len(set(plan)) == 1_000
        assert set(_plan_entries(tmp_path)) == {
            *(mine + str(e) for e in range(max(0, epoch - 1), epoch + 1)),
            mine.replace("seed=3", "seed=4") + "0",
        }
    readers = _distinct(num_samples=1_000, cache_dir=tmp_path)  # a worker one epoch behind opens epoch 2: kept
    readers.set_epoch(2)
    assert len(list(readers)) == 1_000 and len(calls) == 5
    sampler.set_epoch(0)  # going back (a resume) rebuilds epoch 0 and removes 2 and 3
    monkeypatch.setattr(index_cache, "_warned", set())  # warned once a process: expected here whatever ran before
    with pytest.warns(RuntimeWarning, match="private memory"):  # the weight table's and the plan's
        uncached = list(_distinct(num_samples=1_000, cache_dir=False))
    assert _sha(list(sampler)) == _sha(uncached)
    assert {key.rpartition("=")[2] for key in _plan_entries(tmp_path) if key.startswith(mine)} == {"0"}
    assert len(list(tmp_path.glob(f"{WEIGHT_TABLE}-*"))) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".old", ".partial"))]


def test_pickled_distinct_sampler_carries_no_plan(tmp_path) -> None:
    """A sampler whose epoch plan is mapped pickles small (no plan, the table by reference) and plans alike."""
    sampler = _distinct(num_samples=60_000, cache_dir=tmp_path)
    plan = list(sampler)
    sampler.set_epoch(0)
    blob = pickle.dumps(sampler)
    assert len(blob) < 20_000
    assert list(pickle.loads(blob)) == plan


def _distinct_main(rank: int, world_size: int, cache_dir: str) -> tuple[str, int]:
    import torch.distributed as dist

    calls = []
    real = weighted.distinct_draws

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    weighted.distinct_draws = counted
    dist.barrier()  # start together, on an empty cache
    sampler = _distinct(cache_dir=cache_dir)
    sampler.set_epoch(1)
    return _sha(list(sampler)), len(calls)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_three_processes_build_one_plan_and_agree(tmp_path) -> None:
    """3 processes starting at once on an empty cache: one builds the plan, all plan alike, one entry, no litter."""
    reports = run_distributed(_distinct_main, 3, str(tmp_path), timeout=180)
    assert [digest for digest, _ in reports] == [PINNED[1]] * 3
    assert sum(builds for _, builds in reports) == 1
    assert len(_plan_entries(tmp_path)) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".old", ".partial"))]


@pytest.mark.timeout(300)
def test_rank_opening_a_built_plan_holds_no_private_copy(tmp_path) -> None:
    """4e6 weights, a plan of 3e6 (24 MB): a process capped at 16 MiB of private memory opens it and draws."""
    n, count = 4_000_000, 3_000_000
    weights = np.lib.format.open_memmap(tmp_path / "weights.npy", mode="w+", dtype=np.float32, shape=(n,))
    weights[:] = np.random.default_rng(0).exponential(size=n).astype(np.float32)
    weights.flush()
    options = {"num_samples": count, "replacement": False, "num_replicas": 8, "rank": 3, "seed": 1}
    built = WeightedSampler(weights, cache_dir=tmp_path / "cache", **options)  # the node's first rank builds
    draws = iter(built)
    expected = str([next(draws) for _ in range(20)])
    first = first_units_under_cap(
        f"weights = np.load({str(tmp_path / 'weights.npy')!r}, mmap_mode='r')",
        f"shardwise.WeightedSampler(weights, cache_dir={str(tmp_path / 'cache')!r}, **{options!r})",
        n=n, first=20, skip=count // 8 - 20, mib=16,
    )  # fmt: skip
    assert first == expected


def test_docstring_example_runs() -> None:
    """The module's Example sections run as written."""
    import doctest

    from shardwise.samplers import weighted as _weighted

    assert doctest.testmod(_weighted, optionflags=doctest.ELLIPSIS).failed == 0
