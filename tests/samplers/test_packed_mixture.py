"""PackedMixtureSampler in one process: token shares per batch, full rows, cycles, schedules, the data path.

Every rank's view and the resume at another world size are the conformance harness's
(``tests/conformance.py``, cases ``PackedMixture*``); real ranks, workers and SIGKILL are in
``test_packed_mixture_ranks.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardwise
from shardwise import Mixture, PackedDataset, PackedMixtureSampler, WeightSchedule, pack_collate
from shardwise._core.token_mixture import EpochQuotas
from shardwise._core.weights import Weights, exact_weights

RNG = np.random.default_rng(0)
LENGTHS = [RNG.integers(20, 200, 300), RNG.integers(100, 900, 120), RNG.integers(400, 3000, 40)]
WEIGHTS = [0.5, 0.3, 0.2]


def sampler(lengths: list = LENGTHS, weights: object = WEIGHTS, **options: object) -> PackedMixtureSampler:
    settings: dict[str, object] = {"max_len": 512, "rows_per_batch": 4, "seed": 3, "num_replicas": 1, "rank": 0}
    return PackedMixtureSampler(lengths, weights, **{**settings, **options})  # type: ignore[arg-type]


def source_tokens(s: PackedMixtureSampler, batch: list) -> np.ndarray:
    """Tokens of each source in one batch."""
    offsets = np.asarray([0, *np.cumsum(s.sizes)])
    out = np.zeros(len(s.sizes), dtype=np.int64)
    for piece in batch:
        out[np.searchsorted(offsets, int(piece), side="right") - 1] += piece.stop - piece.start
    return out


def test_every_batch_holds_each_source_within_a_token_of_its_weight_in_full_rows() -> None:
    s = sampler()
    batches = list(s)
    assert len(batches) == len(s) > 50
    target = np.asarray(WEIGHTS) * 4 * 512
    for batch in batches:
        rows = Counter()
        for piece in batch:
            rows[piece.row] += piece.stop - piece.start
        assert rows == {r: 512 for r in range(4)}  # every row exactly full
        assert np.abs(source_tokens(s, batch) - target).max() < len(WEIGHTS)


def test_all_exhausted_reads_every_token_of_every_source_and_first_exhausted_of_one() -> None:
    for stop, expect_all in (("all_exhausted", True), ("first_exhausted", False)):
        s = sampler(stop=stop)
        covered = [np.zeros(int(n.sum()) and len(n), dtype=np.int64) for n in LENGTHS]
        offsets = np.asarray([0, *np.cumsum(s.sizes)])
        for batch in s:
            for piece in batch:
                source = int(np.searchsorted(offsets, int(piece), side="right")) - 1
                covered[source][int(piece) - offsets[source]] += piece.stop - piece.start
        done = [bool((c >= n).all()) for c, n in zip(covered, LENGTHS, strict=True)]
        assert all(done) if expect_all else any(done), (stop, done)
    # all_exhausted is the least number of batches that reads the source slowest to finish
    s = sampler()
    needed = max(int(n.sum()) / w for n, w in zip(LENGTHS, WEIGHTS, strict=True)) / (4 * 512)
    assert len(s) == int(np.ceil(needed)) or len(s) == int(np.ceil(needed)) + 1


def test_a_large_memory_mapped_source_is_read_once_a_cycle_in_chunks(tmp_path: Path) -> None:
    """Past 4,096 documents a source is dealt into strided chunks: still every token once a cycle."""
    lengths = np.random.default_rng(1).integers(0, 40, 20_000).astype(np.int32)
    np.save(tmp_path / "big.npy", lengths)
    mapped = np.load(tmp_path / "big.npy", mmap_mode="r")
    small = np.full(50, 30)
    tokens = int(lengths.sum())
    s = sampler([mapped, small], [0.75, 0.25], max_len=256, rows_per_batch=2, stop="all_exhausted")
    assert s.plan.core.streams(0, s.seed)[0].chunks == 5  # 20,000 documents in chunks of 4,096
    seen = np.zeros(lengths.size, dtype=np.int64)
    for batch in s:
        for piece in batch:
            if int(piece) < lengths.size:
                seen[int(piece)] += piece.stop - piece.start
    drawn = s.plan.core.quotas(0).cumulative(len(s))[0]
    assert tokens <= drawn < 2 * tokens  # all_exhausted: the big source once, and the start of its second cycle
    assert int(seen.sum()) == drawn and (seen >= lengths).all() and (seen - lengths <= lengths).all()


def test_small_weights_are_in_every_batch() -> None:
    """Largest weight absorbs the rounding: a 0.1% source still gets its tokens every batch (Marin #8373)."""
    lengths = [np.full(100, 700), np.full(100, 50), np.full(100, 60), np.full(100, 10)]
    s = sampler(lengths, [0.997, 0.001, 0.001, 0.001], max_len=2048, rows_per_batch=2, num_batches=40)
    for batch in s:
        tokens = source_tokens(s, batch)
        assert (tokens[1:] >= 4).all() and tokens.sum() == 4096, tokens


def test_quotas_are_monotone_and_exact_for_awkward_weights() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        sources = int(rng.integers(1, 9))
        weights = rng.random(sources) ** 4 + 1e-6
        per_batch = int(rng.integers(sources * sources, 5000))
        quotas = EpochQuotas(Weights(*exact_weights(weights)), per_batch)
        previous = quotas.cumulative(0)
        for batch in range(1, 30):
            now = quotas.cumulative(batch)
            assert sum(now) == batch * per_batch
            assert all(b >= a for a, b in zip(previous, now, strict=True))
            share = np.asarray(now) / sum(now)
            assert np.abs(share * sum(now) - weights / weights.sum() * sum(now)).max() < sources
            previous = now


def test_weights_by_tokens_change_at_the_first_batch_past_the_threshold() -> None:
    schedule = WeightSchedule.by_tokens({0: [1, 0, 0], 10 * 2048 + 5: [0, 1, 0]})
    s = sampler(weights=schedule, num_batches=20)
    shares = [source_tokens(s, batch) for batch in s]
    assert all(t[0] == 2048 for t in shares[:11]) and all(t[1] == 2048 for t in shares[11:])
    by_epoch = sampler(weights=WeightSchedule.by_epoch({0: [1, 0, 0], 1: [0, 0, 1]}), num_batches=5)
    by_epoch.set_epoch(1)
    assert all(source_tokens(by_epoch, batch)[2] == 2048 for batch in by_epoch)


def test_batches_reach_a_model_through_mixture_packed_dataset_and_pack_collate() -> None:
    docs = [[np.arange(n) + 1000 * i for n in lengths] for i, lengths in enumerate(LENGTHS)]
    data = PackedDataset(Mixture(docs))
    s = sampler()
    loader = DataLoader(data, batch_sampler=s, collate_fn=lambda items: pack_collate(items, max_len=512))
    batch = next(iter(loader))
    assert tuple(batch.input_ids.shape) == (4, 512)
    assert int((batch.input_ids >= 0).sum()) == 4 * 512  # no padding: every row full
    first = next(iter(s))[0]
    source = int(np.searchsorted(np.cumsum(s.sizes), int(first), side="right"))
    expected = docs[source][int(first) - int(np.concatenate([[0], np.cumsum(s.sizes)])[source])][
        first.start : first.stop
    ]
    assert batch.input_ids[0, : first.stop - first.start].tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (lambda: sampler([[0, 0], [5]], [0.5, 0.5]), ValueError, ("source 0", "0 tokens", "weight 0")),
        (lambda: sampler(np.arange(5), [1.0]), TypeError, ("lengths", "one lengths input per source")),
        (lambda: sampler(weights=[0.5, 0.5]), ValueError, ("weights",)),
        (
            lambda: sampler(weights=shardwise.AdaptiveWeights(shardwise.Exp3(), interval=4)),
            ValueError,
            ("AdaptiveWeights", "num_batches"),
        ),
        (lambda: sampler(weights=WeightSchedule.by_samples({0: WEIGHTS})), ValueError, ("by_tokens",)),
        (lambda: sampler(weights=WeightSchedule.by_tokens({0: WEIGHTS})), ValueError, ("num_batches",)),
        (lambda: sampler(stop="num_batches"), ValueError, ("num_batches",)),
        (lambda: sampler(stop="most_exhausted"), ValueError, ("stop", "'all_exhausted'")),
        (lambda: sampler(max_len=2, rows_per_batch=2), ValueError, ("rows_per_batch * max_len", "9")),
        (lambda: sampler([[3, -1], [4]], [1, 1]), ValueError, ("lengths", "-1")),
    ],
)
def test_bad_input_is_refused_naming_the_parameter(build: object, error: type, words: tuple[str, ...]) -> None:
    with pytest.raises(error) as raised:
        build()  # type: ignore[operator]
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))


def test_without_shuffle_a_large_source_is_read_in_index_order_in_contiguous_chunks() -> None:
    """No shuffle: documents in index order, chunk by chunk (a rank never holds the whole source's order)."""
    lengths = np.random.default_rng(2).integers(0, 30, 9_000)
    s = sampler([lengths, [25] * 10], [0.9, 0.1], max_len=128, rows_per_batch=2, num_batches=60, shuffle=False)
    stream = s.plan.core.streams(0, s.seed)[0]
    assert stream.chunks == 3 and not s.plan.core.shuffle
    first = [int(p) for batch in s for p in batch if int(p) < lengths.size]
    assert first == sorted(first) and first[0] == int(np.flatnonzero(lengths)[0])


def test_balance_groups_deal_attention_cost_evenly_and_keep_every_batchs_quotas() -> None:
    """Groups of 16 batches dealt longest piece first: the steps of W=8 cost alike, quotas and full rows kept."""
    rng = np.random.default_rng(4)
    lengths = [rng.integers(20, 600, 3000), rng.integers(200, 3000, 600), rng.integers(1000, 12000, 150)]

    def step_ratios(group: int) -> np.ndarray:
        s = sampler(lengths, WEIGHTS, max_len=2048, rows_per_batch=4, num_batches=160, balance_group=group)
        batches = list(s)
        for batch in batches:
            assert np.abs(source_tokens(s, batch) - np.asarray(WEIGHTS) * 8192).max() < 3
            assert np.bincount([p.row for p in batch], weights=[p.stop - p.start for p in batch]).tolist() == [2048] * 4
        cost = np.asarray([sum((p.stop - p.start) ** 2 for p in batch) for batch in batches], dtype=float)
        steps = cost.reshape(-1, 8)
        return steps.max(axis=1) / steps.mean(axis=1)

    dealt, plain = step_ratios(16), step_ratios(1)
    assert np.median(dealt) < 1.06 and np.median(plain) > 1.1, (np.median(dealt), np.median(plain))  # 1.045, 1.166


def test_skip_ids_leaves_out_the_batches_holding_a_document_and_resumes_at_another_world_size() -> None:
    """A skipped document never trains: the batches holding its pieces leave the plan, at any world size."""
    whole = sampler(num_batches=40)
    plan = [[(int(p), p.start, p.stop) for p in batch] for batch in whole]
    first = [sampler(num_batches=40, num_replicas=3, rank=r) for r in range(3)]
    for s in first:
        next(iter(s))  # one step trained at W=3
    editor = sampler(num_batches=40, num_replicas=2, rank=0)
    editor.load_state_dict(first[0].state_dict())
    editor.skip_ids(5, 6)
    editor.skip_ids(310, 312)
    state = editor.state_dict()
    skipped = {5, 310, 311}
    holding = {b for b, batch in enumerate(plan) if b >= 3 and skipped & {i for i, _, _ in batch}}
    assert holding  # the skipped documents are in the plan after the resume point
    resumed = [sampler(num_batches=40, num_replicas=2, rank=r) for r in range(2)]
    for s in resumed:
        s.load_state_dict(state)
    got = [[[(int(p), p.start, p.stop) for p in batch] for batch in s] for s in resumed]
    merged = [got[q % 2][q // 2] for q in range(sum(len(g) for g in got))]
    expected = [batch for b, batch in enumerate(plan) if b >= 3 and b not in holding]
    assert merged == expected[: len(merged)] and len(expected) - len(merged) < 2  # drop nothing but a step's cut
    assert not skipped & {i for batch in merged for i, _, _ in batch}
    with pytest.raises(shardwise.ProvenanceUnsupported, match="skip_steps"):
        adaptive = shardwise.AdaptiveWeights(shardwise.Exp3(), interval=4)
        sampler(weights=adaptive, num_batches=40).skip_ids(5, 6)
