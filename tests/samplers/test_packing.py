"""PackedBatchSampler, the packing core and pack_collate: rows within max_len, coverage, balance, collate, ranks."""

from __future__ import annotations

import itertools
import pickle
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardwise import (
    PackCollate,
    PackedBatchSampler,
    PackedDataset,
    PackedIndex,
    PackedSample,
    RaggedArray,
    StateMismatchError,
    pack_collate,
)
from shardwise._core.packing import (
    CARRIED,
    Balance,
    TooLong,
    carried_slots,
    class_phases,
    piece_index,
    stratum_histogram,
    stratum_layouts,
    stratum_slots,
)
from shardwise._core.packing.rows import pack_histogram, row_loads
from shardwise.tools.launch import run_distributed
from tests.lockstep import lockstep_epochs

# Heavy-tailed: many short documents, a sparse tail of long ones, a few longer than max_len.
LENGTHS = np.concatenate([np.arange(600) % 50 + 1, np.arange(120) * 7 % 300 + 50, [400, 700, 1300, 0, 0]])
MAX_LEN = 256
# A fixed long-tailed length set (log-normal: median 45, p99 ~690, max 5122).
LONG_TAILED = np.ceil(np.random.default_rng(19).lognormal(3.8, 1.2, size=16000)).astype(np.int64)


def make(**kw) -> PackedBatchSampler:
    options = {"max_len": MAX_LEN, "rows_per_batch": 4, "num_replicas": 1, "rank": 0, "seed": 3, "window": 256}
    options.update(kw)
    return PackedBatchSampler(options.pop("lengths", LENGTHS), **options)


def pieces_of(batches) -> dict[int, list[tuple[int, int]]]:
    got: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for batch in batches:
        for item in batch:
            got[int(item)].append((item.start, item.stop))
    return got


def row_tokens(batch) -> Counter:
    rows: Counter = Counter()
    for item in batch:
        rows[item.row] += item.stop - item.start
    return rows


# -- the core ---------------------------------------------------------------------------------------
def test_pack_histogram_is_best_fit_decreasing_item_by_item() -> None:
    """The per-length-class packing gives the rows best-fit decreasing gives placing one item at a time."""
    rng = np.random.default_rng(0)
    for max_len in (8, 31, 100):
        lengths = rng.integers(1, max_len + 1, size=300)
        histogram = np.bincount(lengths, minlength=max_len + 1)
        item_rows, num_rows = pack_histogram(histogram, max_len)
        rooms: list[int] = []
        for length in sorted(lengths.tolist(), reverse=True):
            fits = [r for r, room in enumerate(rooms) if room >= length]
            if fits:
                best = min(fits, key=lambda r: (rooms[r], r))
                rooms[best] -= length
            else:
                rooms.append(max_len - length)
        item_lengths = np.repeat(np.arange(max_len + 1), histogram)
        tokens, _ = row_loads(item_rows, item_lengths, num_rows)
        assert num_rows == len(rooms)
        assert sorted(tokens.tolist()) == sorted(max_len - room for room in rooms)


def test_strata_split_every_class_exactly() -> None:
    """Over all strata every length class is taken exactly once, each stratum floor or ceil of its share."""
    counts = np.array([0, 1, 2, 7, 100, 3])
    phases = class_phases(counts.size)
    for strata in (1, 3, 7):
        histograms = np.array([stratum_histogram(counts, strata, s, phases) for s in range(strata)])
        assert histograms.sum(axis=0).tolist() == counts.tolist()
        assert np.all(histograms >= counts // strata) and np.all(histograms <= -(-counts // strata))


def test_strata_hand_their_extra_rows_on_and_every_slot_is_dealt_once() -> None:
    """Every stratum but the last deals a multiple of R rows; the rows it hands on are dealt by the next, whole."""
    counts = np.bincount(LONG_TAILED[:3000] % 300 + 1, minlength=257)[:257]
    strata, rows_per_batch = 6, 4
    layouts = list(stratum_layouts(counts, strata, 256, rows_per_batch=rows_per_batch, tokens_per_batch=None,
                                   balance=Balance.TOKENS))  # fmt: skip
    phases, seen = class_phases(counts.size), Counter()
    for s, layout in enumerate(layouts):
        dealt = layout.batch_of_row >= 0
        assert int(dealt.sum()) % rows_per_batch == 0 or s == strata - 1
        classes, ranks = stratum_slots(counts, strata, s, phases)
        own = dealt[: layout.own_rows][layout.slot_rows]  # own slots whose row this stratum deals
        seen.update(zip(classes[own].tolist(), ranks[own].tolist(), strict=True))
        if layout.carried:
            previous = stratum_slots(counts, strata, s - 1, phases)
            more = carried_slots(layouts[s - 1], *previous, own_rows=layout.own_rows)
            assert set(more[2].tolist()) == set(range(layout.own_rows, layout.batch_of_row.size))
            seen.update(zip(more[0].tolist(), more[1].tolist(), strict=True))
        else:
            assert s == 0 or not (layouts[s - 1].batch_of_row == CARRIED).any()
    assert (layouts[-1].batch_of_row != CARRIED).all() and any(layout.carried for layout in layouts)
    assert set(seen.values()) == {1} and sum(seen.values()) == int(counts.sum())
    total_rows = sum(layout.own_rows for layout in layouts)
    assert sum(layout.num_batches for layout in layouts) == -(-total_rows // rows_per_batch)


def test_piece_index_splits_long_samples_into_max_len_pieces() -> None:
    """too_long='split': pieces of max_len, the rest last, grouped by piece length."""
    index = piece_index(np.array([3, 10, 4]), 4, TooLong.SPLIT)
    pieces = sorted(zip(index.sample.tolist(), index.start.tolist(), strict=True))
    assert pieces == [(0, 0), (1, 0), (1, 4), (1, 8), (2, 0)]
    assert index.counts.tolist() == [0, 0, 1, 1, 3]


# -- the sampler ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"tokens_per_batch": 700, "rows_per_batch": None},
        {"balance": "attention"},
        {"window": 10_000, "shuffle": False},
        {"window": 64, "rows_per_batch": 1},
    ],
)
def test_rows_fit_and_every_token_is_packed_once_per_epoch(options: dict) -> None:
    """Rows hold at most max_len tokens; every sample's tokens appear exactly once per epoch (split pieces tile it)."""
    sampler = make(**options)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        for batch in batches:
            assert max(row_tokens(batch).values()) <= MAX_LEN
            if sampler.tokens_per_batch is not None:
                assert sum(row_tokens(batch).values()) <= sampler.tokens_per_batch
            else:
                assert max(item.row for item in batch) < sampler.rows_per_batch
        pieces = pieces_of(batches)
        assert set(pieces) == set(range(LENGTHS.size))
        for sample, spans in pieces.items():
            spans.sort()
            assert spans[0][0] == 0 and spans[-1][1] == LENGTHS[sample]
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            assert all(stop - start <= MAX_LEN for start, stop in spans)


def test_split_pieces_are_documented_ranges() -> None:
    """A sample of length L > max_len is cut at multiples of max_len: [0, m), [m, 2m), ..., the rest last."""
    sampler = make(lengths=[600, 10], max_len=256, rows_per_batch=2)
    spans = sorted(pieces_of(list(sampler))[0])
    assert spans == [(0, 256), (256, 512), (512, 600)]


def test_skip_leaves_long_samples_out_and_lists_them(caplog: pytest.LogCaptureFixture) -> None:
    """too_long='skip' leaves out samples over max_len (listed in skipped, with a warning); the rest once."""
    sampler = make(too_long="skip")
    long = np.flatnonzero(LENGTHS > MAX_LEN)
    assert sampler.skipped.tolist() == long.tolist()
    assert f"skipping {long.size} of {LENGTHS.size}" in caplog.text
    drawn = Counter(int(i) for batch in sampler for i in batch)
    assert set(drawn) == set(range(LENGTHS.size)) - set(long.tolist())
    assert set(drawn.values()) == {1}


def test_rows_are_full_and_batches_short_only_by_a_row() -> None:
    """Rows are packed as tightly as the lower bound allows; rows_per_batch batches are full but for < R short ones per stratum."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 200, size=4000)
    sampler = make(lengths=lengths, max_len=512, rows_per_batch=4, window=1000)
    batches = list(sampler)
    rows = sum(len(row_tokens(b)) for b in batches)
    assert rows <= int(np.ceil(lengths.sum() / 512)) + sampler.num_strata
    short = [b for b in batches if len(row_tokens(b)) < 4]
    assert all(len(row_tokens(b)) == 3 for b in short)
    assert sampler.num_strata > 1 and len(short) < 4  # strata hand their extra rows on: only the last is short
    full = make(lengths=lengths, max_len=512, rows_per_batch=4, window=1000, drop_last=True)
    assert all(len(row_tokens(b)) == 4 for b in full)


def _lag(batches, lengths, world_size: int) -> float:
    """Mean over steps of max - min over ranks of the sum of squared lengths (the Multipack L^2 lag, squared)."""
    costs = [sum((item.stop - item.start) ** 2 for item in batch) for batch in batches]
    steps = len(costs) // world_size
    per_step = np.array(costs[: steps * world_size]).reshape(steps, world_size)
    return float((per_step.max(axis=1) - per_step.min(axis=1)).mean())


def test_attention_balance_evens_out_squared_lengths_across_a_step() -> None:
    """balance='attention' makes the batches of a step differ far less in sum of squared lengths than 'tokens'."""
    rng = np.random.default_rng(2)
    lengths = np.concatenate([rng.integers(1, 40, size=3000), rng.integers(200, 512, size=150)])
    common = {"lengths": lengths, "max_len": 512, "rows_per_batch": 4, "window": 4096}
    attention = _lag(list(make(balance="attention", **common)), lengths, 8)
    tokens = _lag(list(make(balance="tokens", **common)), lengths, 8)
    assert attention < 0.5 * tokens


def _fill_and_utilization(batches, capacity: int, world_size: int) -> tuple[float, float]:
    """bench_packing's fill (real tokens / capacity) and utilization (real tokens / (slowest rank's tokens x W) per
    step), over the plan dealt to ``world_size`` ranks (the last step padded from the start, as dealt)."""
    loads = [sum(item.stop - item.start for item in batch) for batch in batches]
    dealt = np.array([loads[k % len(loads)] for k in range(-(-len(loads) // world_size) * world_size)])
    steps = dealt.reshape(-1, world_size)
    return dealt.sum() / (dealt.size * capacity), dealt.sum() / (steps.max(axis=1).sum() * world_size)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("balance", ["tokens", "attention"])
def test_long_tailed_lengths_reach_the_fill_and_utilization_target(balance: str, drop_last: bool) -> None:
    """On long-tailed lengths in many strata, fill and utilization at W=8 are >= 99.5%: the plan has about
    ceil(tokens / batch capacity) batches, not one partial batch per stratum (plan 1: 98.2%)."""
    sampler = make(lengths=LONG_TAILED, max_len=1024, rows_per_batch=4, window=2048, balance=balance,
                   drop_last=drop_last)  # fmt: skip
    assert sampler.num_strata == 8
    batches = list(sampler)
    fill, utilization = _fill_and_utilization(batches, 4 * 1024, 8)
    assert fill >= 0.995 and utilization >= 0.995, (fill, utilization)
    assert len(batches) <= -(-int(LONG_TAILED.sum()) // 4096) + 1


def test_length_is_known_before_the_first_batch_and_the_same_every_epoch() -> None:
    """len() is exact before iterating and equal in every epoch; orders differ between epochs."""
    sampler = make(window=100)
    lengths = set()
    plans = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected = len(sampler)
        plan = [tuple(b) for b in sampler]
        assert len(plan) == expected
        lengths.add(expected)
        plans.append(plan)
    assert len(lengths) == 1
    assert plans[0] != plans[1] != plans[2]


def test_resume_mid_epoch_at_another_world_size_loses_and_repeats_nothing() -> None:
    """A state saved after k steps at W=3 resumes at W=2: all batches together are the plan once (padding aside)."""
    plan = [tuple(b) for b in make(window=100)]
    first = [make(window=100, num_replicas=3, rank=r) for r in range(3)]
    iterators = [iter(s) for s in first]
    before = [tuple(next(it)) for it in iterators for _ in range(2)]
    state = first[0].state_dict()
    assert all(s.state_dict() == state for s in first)
    after = []
    for rank in range(2):
        resumed = make(window=100, num_replicas=2, rank=rank)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        after += [tuple(b) for b in resumed]
    together = Counter(before + after)
    assert set(together) == set(plan)
    assert sum(together.values()) - len(plan) <= 1  # the last step padded at W=2


def test_state_of_another_configuration_is_refused() -> None:
    """Loading a state saved with another max_len names the field."""
    state = make().state_dict()
    with pytest.raises(StateMismatchError, match="max_len=256, but this sampler has max_len=300"):
        make(max_len=300).load_state_dict(state)
    del state["fingerprint"]["plan"]  # a state of plan version 1 (strata rounded up alone): its positions differ
    with pytest.raises(StateMismatchError, match="saved without plan"):
        make().load_state_dict(state)


def test_packed_index_is_an_int_that_pickles_with_its_row() -> None:
    """PackedIndex indexes like an int and survives pickling (DataLoader workers)."""
    item = PackedIndex(7, 2, 10, 20)
    assert item == 7 and [0, 1, 2, 3, 4, 5, 6, 7][item] == 7
    back = pickle.loads(pickle.dumps(item))
    assert (int(back), back.row, back.start, back.stop) == (7, 2, 10, 20)
    assert repr(back) == "PackedIndex(7, row=2, start=10, stop=20)"


def test_repr_and_describe_show_the_configuration() -> None:
    """repr and describe() name max_len, the batch shape, too_long and balance."""
    text = repr(make(balance="attention"))
    assert "max_len=256" in text and "rows_per_batch=4" in text and "balance='attention'" in text
    assert make().describe()["too_long"] == "split"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_len": 0}, ValueError, "max_len should be a positive integer, but got max_len=0"),
        ({"max_len": 2.5}, TypeError, "max_len should be an integer"),
        ({"too_long": "error"}, ValueError, r"lengths\[630\]=260 is longer than max_len=256 \(33 samples are\)"),
        ({"tokens_per_batch": 512}, ValueError, "pass exactly one of rows_per_batch"),
        ({"rows_per_batch": None}, ValueError, "pass exactly one of rows_per_batch"),
        ({"rows_per_batch": 0}, ValueError, "rows_per_batch should be a positive integer"),
        ({"rows_per_batch": None, "tokens_per_batch": 100}, ValueError, "tokens_per_batch should be at least max_len"),
        ({"lengths": [3, -1, 2]}, ValueError, r"lengths should hold non-negative integers, but got lengths\[1\]=-1"),
        ({"lengths": [1.5, 2.0]}, TypeError, "lengths should hold integers"),
        ({"lengths": []}, ValueError, "lengths should hold at least one length"),
        ({"balance": "flops"}, ValueError, "balance should be one of 'tokens', 'attention'"),
        ({"too_long": "truncate"}, ValueError, "too_long should be one of 'split', 'skip', 'error'"),
        ({"window": 0}, ValueError, "window should be a positive integer"),
        ({"lengths": [300, 400], "too_long": "skip"}, ValueError, "every sample is longer than max_len=256"),
    ],
)
def test_bad_input_is_refused_naming_the_parameter(kwargs: dict, error: type, match: str) -> None:
    """Each bad argument raises at construction with a message naming it and what is accepted."""
    with pytest.raises(error, match=match):
        make(**kwargs)


# -- the collate ------------------------------------------------------------------------------------
DOCS = [np.arange(100 * i, 100 * i + n) for i, n in enumerate(LENGTHS.tolist())]


def test_collate_matches_the_unpacked_documents() -> None:
    """Each document's tokens, positions, labels, ids and cu_seqlens segment are what it gives alone."""
    sampler = make()
    data = PackedDataset(DOCS)
    for batch_keys in list(sampler)[:20]:
        items = [data[k] for k in batch_keys]
        out = pack_collate(items, max_len=MAX_LEN, rows=4, attention_mask=True)
        assert out.input_ids.shape == (4, MAX_LEN)
        bounds = out.cu_seqlens.tolist()
        flat_ids = out.input_ids.reshape(-1)
        seen_docs = 0
        for key in batch_keys:
            doc = DOCS[int(key)][key.start : key.stop]
            if doc.size == 0:
                continue
            row = out.sample_ids[key.row].tolist()
            at = next(
                c for c in range(MAX_LEN) if row[c] == int(key) and out.position_ids[key.row, c] == 0
                and out.input_ids[key.row, c] == doc[0]
            )
            span = slice(at, at + doc.size)
            assert out.input_ids[key.row, span].tolist() == doc.tolist()
            assert out.position_ids[key.row, span].tolist() == list(range(doc.size))
            assert out.labels[key.row, span].tolist() == [-100, *doc[1:].tolist()]
            assert len(set(out.document_ids[key.row, span].tolist())) == 1
            flat_start = key.row * MAX_LEN + at
            assert flat_start in bounds and flat_start + doc.size in bounds
            assert flat_ids[flat_start : flat_start + doc.size].tolist() == doc.tolist()
            mask = out.attention_mask[key.row, 0, span, :]
            assert mask.sum().item() == doc.size * (doc.size + 1) // 2  # causal, within the document only
            seen_docs += 1
        assert out.num_tokens == sum(k.stop - k.start for k in batch_keys)
        assert bounds[-1] == 4 * MAX_LEN and out.cu_seqlens.dtype == torch.int32
        assert out.max_seqlen == max(np.diff(bounds))
        padding = out.sample_ids == -1
        assert (out.labels[padding] == -100).all() and (out.input_ids[padding] == 0).all()
        assert int(out.document_ids.max()) + 1 == seen_docs


def test_plain_sequences_fill_rows_in_order() -> None:
    """Plain token lists (no row) fill rows of max_len in order, or one flattened row without max_len."""
    out = pack_collate([[1, 2, 3], [4, 5], [6, 7, 8, 9]], max_len=5)
    assert out.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    flat = pack_collate([[1, 2, 3], [4, 5]])
    assert flat.input_ids.tolist() == [[1, 2, 3, 4, 5]] and flat.cu_seqlens.tolist() == [0, 3, 5]


def test_collate_refuses_bad_batches() -> None:
    """An empty batch, an over-long row, float tokens and a bad option each raise a clear error."""
    with pytest.raises(ValueError, match="at least one document"):
        pack_collate([])
    with pytest.raises(ValueError, match="row 0 of the batch holds 7 tokens, but max_len=4"):
        pack_collate([PackedSample([1, 2, 3], 0, 0), PackedSample([1, 2, 3, 4], 1, 0)], max_len=4)
    with pytest.raises(TypeError, match="integer token ids"):
        pack_collate([np.ones(3)])
    with pytest.raises(ValueError, match="max_len should be a positive integer"):
        PackCollate(max_len=0)
    with pytest.raises(ValueError, match="has 3 tokens, but the sampler planned with a length of at least 5"):
        PackedDataset([[1, 2, 3]])[PackedIndex(0, 0, 0, 5)]
    with pytest.raises(TypeError, match="field="):
        PackedDataset([{"input_ids": [1]}])[0]


def test_mapping_items_use_the_field() -> None:
    """HF-style rows ({'input_ids': [...]}) pack through field='input_ids'."""
    data = PackedDataset([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}], field="input_ids")
    out = PackCollate(max_len=4)([data[PackedIndex(0, 0, 1, 3)], data[PackedIndex(1, 0, 0, 1)]])
    assert out.input_ids.tolist() == [[6, 7, 8, 0]]


def test_loader_with_workers_over_a_ragged_store(tmp_path: Path) -> None:
    """Two spawned workers, a RaggedArray store and PackCollate: every token of every sample arrives once."""
    lengths = LENGTHS[:300]
    store = RaggedArray.write(tmp_path / "s", (np.arange(n, dtype=np.int32) + 7 for n in lengths.tolist()))
    sampler = make(lengths=store.lengths, rows_per_batch=2)
    loader = DataLoader(
        PackedDataset(store), batch_sampler=sampler, collate_fn=PackCollate(max_len=MAX_LEN, rows=2),
        num_workers=2, multiprocessing_context="spawn",
    )  # fmt: skip
    tokens = Counter()
    batches = 0
    for batch in loader:
        batches += 1
        assert batch.input_ids.shape == (2, MAX_LEN)
        real = batch.sample_ids >= 0
        for sample, token in zip(batch.sample_ids[real].tolist(), batch.input_ids[real].tolist(), strict=True):
            tokens[(sample, token)] += 1
    assert batches == len(sampler)
    assert tokens == Counter((i, t + 7) for i, n in enumerate(lengths.tolist()) for t in range(n))


# -- real ranks -------------------------------------------------------------------------------------
def _packed_main(rank: int, world_size: int, options: dict) -> list[list[list[int]]]:
    sampler = make(num_replicas=None, rank=None, seed=21, **options)
    loader = DataLoader(torch.arange(LENGTHS.size), batch_sampler=sampler)
    return lockstep_epochs(loader, sampler)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("world_size", "options"), [(2, {"window": 100}), (3, {"balance": "attention"})])
def test_real_ranks_step_together_and_cover_the_plan(world_size: int, options: dict) -> None:
    """On W gloo ranks: equal steps, together exactly the single-process plan, dealt by position."""
    reports = run_distributed(_packed_main, world_size, options, timeout=180)
    for epoch in range(2):
        single = make(seed=21, **options)
        single.set_epoch(epoch)
        plan = [[int(i) for i in b] for b in single]
        steps = len(reports[0][epoch])
        assert steps == -(-len(plan) // world_size)
        for rank, report in enumerate(reports):
            assert report[epoch] == [plan[(rank + k * world_size) % len(plan)] for k in range(steps)]


def test_large_lengths_are_checked_once_per_node_and_bad_ones_are_refused(tmp_path: Path) -> None:
    """Large lengths are checked by the build of their range entry: a negative one is refused naming lengths."""
    from shardwise.samplers.packed import SHARED_FROM

    lengths = np.full(SHARED_FROM, 100, dtype=np.int32)
    lengths[12_345] = -1
    with pytest.raises(ValueError, match=r"lengths should hold non-negative integers, but got lengths\[12345\]=-1"):
        make(lengths=lengths, max_len=512, cache_dir=tmp_path)
    lengths[12_345] = 900
    with pytest.raises(ValueError, match=r"lengths\[12345\]=900 is longer than max_len=512"):
        make(lengths=lengths, max_len=512, too_long="error", cache_dir=tmp_path)
    assert make(lengths=lengths, max_len=512, too_long="skip", cache_dir=tmp_path).skipped.tolist() == [12_345]


def test_large_data_uses_the_node_shared_index_and_reopens_it_after_pickling(tmp_path: Path) -> None:
    """From SHARED_FROM samples on, the item index and batch counts come from the cache; a pickled sampler reopens them."""
    from shardwise.samplers.packed import SHARED_FROM

    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 300, size=SHARED_FROM).astype(np.int32)
    lengths[::5000] = 700  # some split
    small = make(lengths=lengths[:1000], max_len=512, window=1 << 15)
    sampler = make(lengths=lengths, max_len=512, window=1 << 15, cache_dir=tmp_path)
    assert isinstance(sampler._index.sample, np.memmap)
    entries = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert entries == ["lengths-range", "pack-layouts", "pack-pieces"]
    clone = pickle.loads(pickle.dumps(sampler))
    assert clone._index_cache is None and clone._layout_arrays is None
    assert [list(map(int, b)) for b in itertools.islice(iter(clone), 3)] == [
        list(map(int, b)) for b in itertools.islice(iter(sampler), 3)
    ]
    assert len(small) < len(sampler)
    sampler.set_epoch(1)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert max(max(row_tokens(b).values()) for b in batches) <= 512
    spans = Counter((int(i), i.start) for b in batches for i in b)
    expected = Counter((i, k * 512) for i, n in enumerate(lengths.tolist()) for k in range(max(1, -(-n // 512))))
    assert spans == expected


def test_a_state_of_packing_plan_2_is_refused_naming_the_release_and_rebase_state() -> None:
    """Plan 3 (the tree order within groups) refuses a plan-2 state, naming what to do, not a data change."""
    import shardwise

    sampler = shardwise.PackedBatchSampler(np.arange(1, 60), max_len=64, rows_per_batch=2, num_replicas=1, rank=0,
                                           seed=1)  # fmt: skip
    state = sampler.state_dict()
    state["fingerprint"]["plan"] = 2
    with pytest.raises(shardwise.StateMismatchError, match=r"plan=2, but this sampler has plan=3 \(a state of another"):
        sampler.load_state_dict(state)
