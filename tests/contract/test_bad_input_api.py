"""The bad-input table, third part: the API added since the shared layer, refused at the call that takes it.

Rows as in tests/contract/test_bad_input_table.py: ``(id, call, error, names)``, ``call(tmp)`` must raise
``error`` whose message contains every string of ``names``. Here: ``cache_dir`` checked at
construction (a small input never reaches the index cache), position lookups (schedules, mixtures),
``PackedDataset`` over data it cannot read, ``ScheduledBatchSampler`` over a batch sampler,
``set_epoch`` of nothing, and states whose fields are out of range.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler

import shardwise
from shardwise import (
    BatchSizeSchedule,
    BucketBatchSampler,
    ClassBalancedBatchSampler,
    MalformedStateError,
    Mixture,
    MixtureSampler,
    PackCollate,
    PackedBatchSampler,
    PackedDataset,
    PackedIndex,
    PackedSample,
    ScheduledBatchSampler,
    ShardedSampler,
    TwoStreamBatchSampler,
    WeightedSampler,
    WeightSchedule,
    pack_collate,
    pad_collate,
    set_epoch,
    shard,
    shard_batches,
)
from shardwise.index import IndexCacheError
from tests.contract.test_bad_input_data import check_row

Call = Callable[[Path], object]
V, T, I = ValueError, TypeError, IndexError  # noqa: E741  # I is IndexError, as V and T above
MIXTURE = Mixture([range(3), range(2)])  # 5 samples: 0-2 from source 0, 3-4 from source 1
BY_SAMPLES = WeightSchedule.by_samples({0: [1, 1], 10: [1, 2]})
BY_EPOCH = WeightSchedule.by_epoch({0: [1, 1], 1: [1, 2]})
SIZES = BatchSizeSchedule.by_samples({0: 2, 10: 4})


def _file(tmp: Path) -> Path:
    (tmp / "file").write_text("x")
    return tmp / "file"


def _cache(make: Callable[..., object], cache_dir: Any) -> Call:
    """``make(cache_dir=...)``; a callable ``cache_dir`` is called with ``tmp`` first (a file made there)."""
    return lambda tmp: make(cache_dir=cache_dir(tmp) if callable(cache_dir) else cache_dir)


def _bucket(**kwargs: Any) -> object:
    return BucketBatchSampler([3, 5, 2, 7], max_tokens=16, **kwargs)


def _balanced(**kwargs: Any) -> object:
    return ClassBalancedBatchSampler([0, 0, 1, 1], classes_per_batch=2, samples_per_class=2, **kwargs)


def _two(**kwargs: Any) -> object:
    return TwoStreamBatchSampler([0, 1, 2, 3], [4, 5], primary_batch_size=2, secondary_batch_size=1, **kwargs)


def _weighted(**kwargs: Any) -> object:
    return WeightedSampler([1.0, 2.0, 3.0], num_samples=3, **kwargs)


def _packed(**kwargs: Any) -> object:
    return PackedBatchSampler([3, 4], max_len=8, rows_per_batch=2, **kwargs)


def _mixture_sampler() -> MixtureSampler:
    return MixtureSampler([3, 2], [1, 1], num_samples=4, num_replicas=1, rank=0)


def _scheduled() -> ScheduledBatchSampler:
    return ScheduledBatchSampler(10, batch_size=2, num_replicas=1, rank=0)


def _scheduled_over(data: Any) -> Call:
    return lambda tmp: ScheduledBatchSampler(data, batch_size=2, num_replicas=1, rank=0)


def _load(state_changes: dict[str, Any], make: Callable[[], Any] | None = None) -> Call:
    """Load a state (of a ``seed=None`` sampler, which adopts the saved seed) with some fields changed."""

    def call(tmp: Path) -> None:
        sampler = make() if make is not None else ShardedSampler(10, num_replicas=1, rank=0, seed=None)
        sampler.load_state_dict({**sampler.state_dict(), **state_changes})

    return call


class _Stream(IterableDataset[list[int]]):
    def __iter__(self) -> Any:
        return iter([[1, 2], [3]])


class _NoLen:
    def __getitem__(self, index: int) -> list[int]:
        return [1, 2]


def _shards(tmp: Path, count: int = 1) -> list[str]:
    """``count`` small Parquet shards with columns text, n, label (what ShardedSource rows read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": ["a", "bb", "ccc"], "n": [1, 2, 3], "label": [0, 1, 0]})
    paths = [str(tmp / f"{i}.parquet") for i in range(count)]
    for path in paths:
        pq.write_table(table, path)
    return paths


def _source(**kwargs: Any) -> Call:
    from shardwise import ShardedSource

    return lambda tmp: ShardedSource(_shards(tmp, 2), index_dir=tmp / "index", **kwargs)


ROWS: list[tuple[str, Call, type[BaseException], tuple[str, ...]]] = [
    # -- cache_dir, checked at construction by every sampler that takes it (_core.errors.check_cache_dir) ---
    ("bucket-cache-dir-int", _cache(_bucket, 3), T, ("cache_dir", "3", "False")),
    ("bucket-cache-dir-bytes", _cache(_bucket, b"dir"), T, ("cache_dir", "b'dir'")),
    ("bucket-cache-dir-empty", _cache(_bucket, ""), T, ("cache_dir", "''")),
    ("balanced-cache-dir-file", _cache(_balanced, _file), IndexCacheError, ("cache_dir", "is a file")),
    ("balanced-cache-dir-true", _cache(_balanced, True), T, ("cache_dir", "True")),
    ("balanced-cache-dir-int", _cache(_balanced, 0), T, ("cache_dir", "0")),
    ("two-cache-dir-file", _cache(_two, _file), IndexCacheError, ("cache_dir", "is a file")),
    ("two-cache-dir-float", _cache(_two, 1.5), T, ("cache_dir", "1.5")),
    ("weighted-cache-dir-file", _cache(_weighted, _file), IndexCacheError, ("cache_dir", "is a file")),
    ("weighted-cache-dir-list", _cache(_weighted, ["/tmp"]), T, ("cache_dir", "list")),
    ("weighted-cache-dir-true", _cache(_weighted, True), T, ("cache_dir", "True")),
    ("packed-cache-dir-file", _cache(_packed, _file), IndexCacheError, ("cache_dir", "is a file")),
    ("packed-cache-dir-true", _cache(_packed, True), T, ("cache_dir", "True")),
    ("packed-cache-dir-int", _cache(_packed, 7), T, ("cache_dir", "7")),
    # -- WeightSchedule.at / index_at: an epoch and a sample count, never negative or fractional ----------
    ("weight-schedule-at-negative-samples", lambda tmp: BY_SAMPLES.at(0, -1), V, ("samples", "-1")),
    ("weight-schedule-at-negative-epoch", lambda tmp: BY_EPOCH.at(-1, 0), V, ("epoch", "-1")),
    ("weight-schedule-at-float", lambda tmp: BY_SAMPLES.at(0, 10.5), T, ("samples", "10.5")),  # type: ignore[arg-type]
    ("weight-schedule-at-nan", lambda tmp: BY_SAMPLES.at(0, math.nan), T, ("samples", "nan")),  # type: ignore[arg-type]
    ("weight-schedule-at-bool", lambda tmp: BY_EPOCH.at(True, 0), T, ("epoch", "True")),
    ("weight-schedule-at-str", lambda tmp: BY_EPOCH.at("1", 0), T, ("epoch", "'1'")),  # type: ignore[arg-type]
    ("weight-schedule-index-at-negative", lambda tmp: BY_SAMPLES.index_at(0, -5), V, ("samples", "-5")),
    # -- BatchSizeSchedule(epoch, samples) / segment ----------------------------------------------------
    ("schedule-call-negative-samples", lambda tmp: SIZES(0, -1), V, ("samples", "-1")),
    ("schedule-call-negative-epoch", lambda tmp: BatchSizeSchedule.by_epoch({0: 2, 1: 4})(-1, 0), V, ("epoch", "-1")),
    ("schedule-call-float", lambda tmp: SIZES(0, 1.5), T, ("samples", "1.5")),  # type: ignore[arg-type]
    ("schedule-call-bool", lambda tmp: BatchSizeSchedule.by_epoch({0: 2, 1: 4})(True, 0), T, ("epoch", "True")),
    ("schedule-call-str", lambda tmp: BatchSizeSchedule.constant(2)("x", 0), T, ("epoch", "'x'")),  # type: ignore[arg-type]
    ("schedule-segment-negative", lambda tmp: SIZES.segment(0, -3), V, ("samples", "-3")),
    # -- ScheduledBatchSampler.steps(epoch) and its data ------------------------------------------------
    ("scheduled-steps-negative", lambda tmp: _scheduled().steps(-1), V, ("epoch", "-1")),
    ("scheduled-steps-float", lambda tmp: _scheduled().steps(1.5), T, ("epoch", "1.5")),  # type: ignore[arg-type]
    ("scheduled-steps-bool", lambda tmp: _scheduled().steps(True), T, ("epoch", "True")),
    ("scheduled-data-bucket", _scheduled_over(BucketBatchSampler([3, 4, 5, 6], max_tokens=8, num_replicas=1, rank=0)),
     T, ("data", "BucketBatchSampler", "batch sampler")),
    ("scheduled-data-shard-batches", _scheduled_over(shard_batches(BatchSampler(SequentialSampler(range(8)), 2, False),
                                                                   num_replicas=1, rank=0)),
     T, ("data", "ShardedBatchWrapper")),
    ("scheduled-data-packed", _scheduled_over(PackedBatchSampler([3, 4], max_len=8, rows_per_batch=1, num_replicas=1,
                                                                 rank=0)), T, ("data", "PackedBatchSampler")),
    ("scheduled-data-two-stream", _scheduled_over(TwoStreamBatchSampler([0, 1, 2, 3], [4, 5], primary_batch_size=2,
                                                                        secondary_batch_size=1, num_replicas=1,
                                                                        rank=0)), T, ("data", "TwoStreamBatchSampler")),
    # -- Mixture.locate / source / sources ----------------------------------------------------------------
    ("mixture-datasets-locate-float", lambda tmp: MIXTURE.locate(2.5), T, ("index", "2.5")),  # type: ignore[arg-type]
    ("mixture-datasets-locate-bool", lambda tmp: MIXTURE.locate(True), T, ("index", "True")),
    ("mixture-datasets-locate-str", lambda tmp: MIXTURE.locate("1"), T, ("index", "'1'")),  # type: ignore[arg-type]
    ("mixture-datasets-source-float", lambda tmp: MIXTURE.source(1.5), T, ("index", "1.5")),  # type: ignore[arg-type]
    ("mixture-datasets-sources-out-of-range", lambda tmp: MIXTURE.sources([0, 7]), I, ("indices", "[0, 5)", "7")),
    ("mixture-datasets-sources-negative", lambda tmp: MIXTURE.sources([-1]), I, ("indices", "-1")),
    ("mixture-datasets-sources-float", lambda tmp: MIXTURE.sources([1.5]), T, ("indices", "float64")),
    ("mixture-datasets-sources-bool", lambda tmp: MIXTURE.sources([True]), T, ("indices", "bool")),
    ("mixture-datasets-sources-none", lambda tmp: MIXTURE.sources(None), T, ("indices", "None")),
    ("mixture-datasets-sources-str", lambda tmp: MIXTURE.sources("ab"), T, ("indices", "'ab'")),
    ("mixture-datasets-sources-2d-out-of-range", lambda tmp: MIXTURE.sources(np.array([[0, 1], [2, 5]])), I,
     ("indices[1, 1]", "5")),
    ("mixture-datasets-duplicate-names", lambda tmp: Mixture({1: [1], "1": [2]}), V, ("datasets", "names")),
    # -- MixtureSampler.sources_of / source_counts / num_samples ------------------------------------------
    ("mixture-sources-of-out-of-range", lambda tmp: _mixture_sampler().sources_of([9]), I, ("indices", "9")),
    ("mixture-sources-of-negative", lambda tmp: _mixture_sampler().sources_of([-1]), I, ("indices", "-1")),
    ("mixture-sources-of-float", lambda tmp: _mixture_sampler().sources_of([1.5]), T, ("indices", "float64")),
    ("mixture-sources-of-bool", lambda tmp: _mixture_sampler().sources_of(True), T, ("indices", "True")),
    ("mixture-sources-of-none", lambda tmp: _mixture_sampler().sources_of(None), T, ("indices", "None")),
    ("mixture-source-counts-negative-epoch", lambda tmp: _mixture_sampler().source_counts(-1, 0), V, ("epoch", "-1")),
    ("mixture-source-counts-float-epoch", lambda tmp: _mixture_sampler().source_counts(0.5, 0), T, ("epoch", "0.5")),  # type: ignore[arg-type]
    ("mixture-source-counts-bool-epoch", lambda tmp: _mixture_sampler().source_counts(True, 0), T, ("epoch", "True")),
    ("mixture-num-samples-beyond-2**62", lambda tmp: MixtureSampler([3, 2], [1, 1], num_samples=2**70), V,
     ("num_samples", str(2**70))),
    # -- PackedDataset: refused at construction, not at the first batch ------------------------------------
    ("packed-dataset-iterable", lambda tmp: PackedDataset(_Stream()), T, ("dataset", "IterableDataset")),
    ("packed-dataset-unsized", lambda tmp: PackedDataset(_NoLen()), T, ("dataset", "_NoLen", "__len__")),
    ("packed-dataset-empty", lambda tmp: PackedDataset([]), V, ("dataset", "empty")),
    ("packed-dataset-missing-field", lambda tmp: PackedDataset([{"ids": [1, 2]}], field="input_ids"), V,
     ("field='input_ids'", "'ids'")),
    ("packed-dataset-field-on-lists", lambda tmp: PackedDataset([[1, 2]], field="input_ids"), T,
     ("field='input_ids'", "list", "field=None")),
    ("packed-dataset-mapping-without-field", lambda tmp: PackedDataset([{"input_ids": [1, 2]}]), T,
     ("field=", "'input_ids'")),
    ("packed-dataset-items-ints", lambda tmp: PackedDataset([1, 2, 3]), T, ("dataset[0]", "int")),
    ("packed-dataset-items-0d-tensors", lambda tmp: PackedDataset([torch.tensor(3)]), T, ("dataset[0]", "tensor(3)")),
    ("packed-dataset-items-2d-arrays", lambda tmp: PackedDataset([np.zeros((2, 2), np.int64)]), T, ("dataset[0]",)),
    ("packed-dataset-items-str-field", lambda tmp: PackedDataset([{"text": "abc"}], field="text"), T,
     ("dataset[0]", "'abc'")),
    ("packed-dataset-getitem-negative", lambda tmp: PackedDataset([[1, 2]])[-1], V, ("index", "-1")),
    ("packed-dataset-getitem-float", lambda tmp: PackedDataset([[1, 2]])[0.5], T, ("index", "0.5")),  # type: ignore[index]
    ("packed-dataset-getitems-float", lambda tmp: PackedDataset([[1, 2]]).__getitems__([0.0]), T, ("index", "0.0")),  # type: ignore[list-item]
    # -- pack_collate / PackCollate: the fields of a PackedSample, token ids int64 cannot hold ---------------
    ("pack-collate-sample-negative", lambda tmp: pack_collate([PackedSample([1, 2], -1, 0)]), V,
     ("batch[0].sample", "-1")),
    ("pack-collate-sample-str", lambda tmp: pack_collate([PackedSample([1, 2], "a", 0)]), T, ("batch[0].sample", "'a'")),  # type: ignore[arg-type]
    ("pack-collate-row-float", lambda tmp: pack_collate([PackedSample([1, 2], 0, 0.5)]), T, ("batch[0].row", "0.5")),  # type: ignore[arg-type]
    ("pack-collate-start-negative", lambda tmp: pack_collate([PackedSample([1, 2], 0, 0, -3)]), V,
     ("batch[0].start", "-3")),
    ("pack-collate-tokens-uint64-2**63", lambda tmp: pack_collate([np.array([2**63], np.uint64)]), V,
     ("batch item 0", str(2**63))),
    ("packcollate-call-none", lambda tmp: PackCollate(max_len=4)(None), T, ("batch", "None")),  # type: ignore[arg-type]
    # -- PackCollate / pack_collate for a model: what cannot keep packed documents apart (issue 29) -----------
    ("packcollate-attn-implementation-int", lambda tmp: PackCollate(attn_implementation=3), T,  # type: ignore[arg-type]
     ("attn_implementation", "3")),
    ("packcollate-attn-implementation-unknown", lambda tmp: PackCollate(attn_implementation="my_kernel"), V,
     ("attn_implementation='my_kernel'", "'sdpa'", "'flash_attention_2'")),
    ("packcollate-attn-implementation-paged", lambda tmp: PackCollate(attn_implementation="paged|sdpa"), V,
     ("paged", "generation")),
    ("packcollate-mask-for-an-hf-model", lambda tmp: PackCollate(attention_mask=True, attn_implementation="eager"), V,
     ("attention_mask=True", "leave attention_mask=False", "position_ids")),
    ("pack-collate-attn-implementation-empty", lambda tmp: pack_collate([[1, 2]], attn_implementation=""), V,
     ("attn_implementation", "''")),
    ("mixture-datasets-getitem-float", lambda tmp: MIXTURE[1.5], T, ("index", "1.5")),  # type: ignore[index]
    ("mixture-datasets-getitem-bool", lambda tmp: MIXTURE[True], T, ("index", "True")),
    # -- shard_batches over a sampler of single indices ----------------------------------------------------
    ("shard-batches-sequential-sampler", lambda tmp: shard_batches(SequentialSampler(range(4))), T,  # type: ignore[arg-type]
     ("batch_sampler", "SequentialSampler", "shard(sampler)")),
    ("shard-batches-random-sampler", lambda tmp: shard_batches(RandomSampler(range(4))), T,  # type: ignore[arg-type]
     ("batch_sampler", "RandomSampler")),
    # -- integers beyond 2**62 (counts, sizes, positions are int64): refused by check_int, not an OverflowError later
    ("bucket-batch-size-2**63", lambda tmp: BucketBatchSampler([3, 4], batch_size=2**63), V, ("batch_size", "2**62")),
    ("bucket-multiple-2**63", lambda tmp: BucketBatchSampler([3, 4], max_tokens=8, batch_size_multiple=2**63), V,
     ("batch_size_multiple", "2**62")),
    ("balanced-per-class-2**63", lambda tmp: ClassBalancedBatchSampler([0, 0, 1, 1], classes_per_batch=2,
                                                                       samples_per_class=2**63), V,
     ("samples_per_class", "2**62")),
    ("two-secondary-size-2**63", lambda tmp: TwoStreamBatchSampler([0, 1], [2], primary_batch_size=1,
                                                                   secondary_batch_size=2**63), V,
     ("secondary_batch_size", "2**62")),
    ("weighted-num-samples-2**63", lambda tmp: WeightedSampler([1.0, 2.0], num_samples=2**63), V, ("num_samples",)),
    ("packed-max-len-2**63", lambda tmp: PackedBatchSampler([3, 4], max_len=2**63, rows_per_batch=2), V, ("max_len",)),
    ("pack-collate-rows-2**63", lambda tmp: pack_collate([[1, 2]], rows=2**63), V, ("rows", "2**62")),
    ("pad-multiple-2**63", lambda tmp: pad_collate([np.zeros((1, 2))], pad_to_multiple_of=2**63), V,
     ("pad_to_multiple_of", "2**62")),
    ("shard-replicas-2**63", lambda tmp: shard([0, 1], num_replicas=2**63, rank=0), V, ("num_replicas", "2**62")),
    ("scheduled-batch-size-2**63", lambda tmp: ScheduledBatchSampler(10, batch_size=2**63), V, ("batch_size", "2**62")),
    ("schedule-samples-key-2**63", lambda tmp: BatchSizeSchedule.by_samples({0: 2, 2**63: 4}), V, ("sizes key",)),
    ("sampler-set-epoch-2**70", lambda tmp: ShardedSampler(10).set_epoch(2**70), V, ("epoch", "2**62")),
    ("packed-index-2**70", lambda tmp: PackedIndex(2**70), V, ("index", "2**62")),
    # -- set_epoch of nothing ----------------------------------------------------------------------------
    ("set-epoch-obj-none", lambda tmp: set_epoch(None, 1), T, ("obj", "None", "set_epoch(loader, 1)")),
    ("set-epoch-obj-int", lambda tmp: set_epoch(5, 1), T, ("obj", "5")),
    ("set-epoch-obj-str", lambda tmp: set_epoch("loader", 1), T, ("obj", "'loader'")),
    ("set-epoch-obj-list", lambda tmp: set_epoch([ShardedSampler(10)], 1), T, ("obj", "list", "set_epoch(o, 1)")),
    # -- states whose fields are out of range (a seed=None sampler adopts the saved seed) --------------------
    ("state-seed-2**64", _load({"seed": 2**64}), MalformedStateError, ("state['seed']", str(2**64))),
    ("state-epoch-2**70", _load({"epoch": 2**70}), MalformedStateError, ("state['epoch']", str(2**70))),
    ("state-consumed-2**63", _load({"consumed": 2**63}), MalformedStateError, ("state['consumed']",)),
    ("state-scheduled-seed-2**64", _load({"seed": 2**64}, lambda: ScheduledBatchSampler(
        10, batch_size=2, seed=None, num_replicas=1, rank=0)), MalformedStateError, ("state['seed']",)),
    # -- issue 34: provenance edges ---------------------------------------------------------------------------
    ("when-scheduled-past-the-data", lambda tmp: shardwise.when(ScheduledBatchSampler(100_003, batch_size=4, seed=1),
     100_003, epochs=0, world_size=2), V, ("index", "[0, 100002]", "index=100003")),
    ("when-scheduled-small-past-the-data", lambda tmp: shardwise.when(ScheduledBatchSampler(1000, batch_size=4),
     1000, epochs=0, world_size=2), V, ("index", "[0, 999]", "index=1000")),
    ("when-packed-past-the-data", lambda tmp: shardwise.when(_packed(num_replicas=1, rank=0), 4, epochs=0), V,
     ("index", "[0, 1]", "PackedBatchSampler", "index=4")),
    ("when-balanced-past-the-data", lambda tmp: shardwise.when(_balanced(num_replicas=1, rank=0), 40, epochs=0), V,
     ("index", "index=40")),
    ("when-two-past-the-data", lambda tmp: shardwise.when(_two(num_replicas=1, rank=0), 99, epochs=0), V,
     ("index", "index=99")),
    ("when-sharded-negative", lambda tmp: shardwise.when(ShardedSampler(10, num_replicas=1, rank=0), -1, epochs=0,
     batch_size=2), V, ("index", "[0, 9]", "index=-1")),
    ("sampler-skip-positions-past-the-plan", lambda tmp: ShardedSampler(100).skip_positions(0, 150, 160), V,
     ("stop", "160", "100")),
    ("sampler-skip-positions-across-the-end", lambda tmp: ShardedSampler(100).skip_positions(0, 90, 101), V,
     ("stop", "101")),
    ("sampler-skip-ranges-three-columns", lambda tmp: ShardedSampler(100).skip_ranges(0, [[1, 2, 3]]), V,
     ("ranges", "(1, 3)")),
    ("sampler-skip-ranges-str", lambda tmp: ShardedSampler(100).skip_ranges(0, "ab"), T, ("ranges", "'ab'")),
    ("sampler-skip-ranges-int", lambda tmp: ShardedSampler(100).skip_ranges(0, 5), T, ("ranges", "5")),
    ("sampler-skip-ranges-ragged", lambda tmp: ShardedSampler(100).skip_ranges(0, [[1, 2], [3]]), V,
     ("ranges", "different lengths")),
    ("sampler-skip-ranges-float", lambda tmp: ShardedSampler(100).skip_ranges(0, [[1.5, 2.0]]), T,
     ("ranges", "float64")),
    ("sampler-skip-ranges-past-the-plan", lambda tmp: ShardedSampler(100).skip_ranges(0, [[10, 20], [150, 160]]), V,
     ("ranges", "[150, 160]", "[0, 100)")),
    ("sampler-skip-ranges-reversed", lambda tmp: ShardedSampler(100).skip_ranges(0, [[20, 10]]), V,
     ("ranges", "[[20, 10]]")),
    ("sampler-skip-id-ranges-three-columns", lambda tmp: ShardedSampler(100).skip_id_ranges([[1, 2, 3]]), V,
     ("ranges", "(1, 3)")),
    ("sampler-skip-id-ranges-str", lambda tmp: ShardedSampler(100).skip_id_ranges("ab"), T, ("ranges", "'ab'")),
    ("sampler-skip-id-ranges-past-the-data", lambda tmp: ShardedSampler(100).skip_id_ranges([[90, 120]]), V,
     ("ranges", "[0, 99]", "[90, 120]")),
    ("sampler-skip-ids-past-the-data", lambda tmp: ShardedSampler(100).skip_ids(90, 120), V,
     ("stop", "120", "[0, 99]")),
    # -- issue 34: messages that name the fix ------------------------------------------------------------------
    ("source-length-column-typo", _source(length_column="txt"), V,
     ("length_column", "'txt'", "['text', 'n', 'label']")),
    ("source-label-column-typo", _source(label_column="lable"), V,
     ("label_column", "'lable'", "['text', 'n', 'label']")),
    ("source-columns-typo", _source(columns=["text", "nn"]), V, ("columns", "'nn'", "['text', 'n', 'label']")),
    ("source-folder-missing", lambda tmp: shardwise.ShardedSource(str(tmp / "nope"), index_dir=False), V,
     ("urls", "nope", "does not exist")),
    ("two-primary-a-dataset", lambda tmp: TwoStreamBatchSampler(torch.utils.data.TensorDataset(torch.zeros(6, 3)),
     range(3), primary_batch_size=2, secondary_batch_size=1), T, ("primary_indices", "TensorDataset",
     "lists of indices into one dataset")),
    ("two-secondary-strings", lambda tmp: TwoStreamBatchSampler(range(6), list("xyz"), primary_batch_size=2,
     secondary_batch_size=1), T, ("secondary_indices", "lists of indices into one dataset")),
    ("two-primary-rows", lambda tmp: TwoStreamBatchSampler(np.zeros((6, 3), dtype=int), range(3),
     primary_batch_size=2, secondary_batch_size=1), V, ("primary_indices", "(6, 3)", "not two datasets")),
    # -- public names added since the last round (issue 22 and after) ----------------------------------------
    ("shard-cache-prefetch-threads-bool", lambda tmp: shardwise.ShardCache(tmp, prefetch_threads=True), T,
     ("prefetch_threads", "True")),
    ("shard-cache-prefetch-threads-2**70", lambda tmp: shardwise.ShardCache(tmp, prefetch_threads=2**70), V,
     ("prefetch_threads",)),
    ("shard-cache-timeout-zero", lambda tmp: shardwise.ShardCache(tmp, timeout=0), V, ("timeout", "0")),
    ("shard-cache-storage-options-str", lambda tmp: shardwise.ShardCache(tmp, storage_options="anon"), T,
     ("storage_options", "'anon'")),
    ("source-cache-not-a-cache", _source(cache="cache"), T, ("cache", "'cache'")),
    ("source-storage-options-list", _source(storage_options=["anon"]), T, ("storage_options", "['anon']")),
    ("source-index-dir-int", lambda tmp: shardwise.ShardedSource(_shards(tmp), index_dir=3), T, ("index_dir", "3")),
    ("source-columns-str", _source(columns="text"), T, ("columns", "'text'")),
    ("source-open-shards-bool", _source(open_shards=True), T, ("open_shards", "True")),
    ("locality-partitions-bool", lambda tmp: shardwise.LocalitySampler([3, 4], partitions=True), T,
     ("partitions", "True")),
    ("locality-window-str", lambda tmp: shardwise.LocalitySampler([3, 4], window="2"), T, ("window", "'2'")),
]  # fmt: skip


def test_the_api_table_has_at_least_90_unique_rows() -> None:
    """The rows have unique ids, and there are at least 90 of them."""
    ids = [row[0] for row in ROWS]
    assert len(ids) == len(set(ids)) >= 90


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("call", "error", "names"), [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_bad_input_raises_naming_the_parameter(tmp_path: Path, call: Call, error: type, names: tuple[str, ...]) -> None:
    """The call raises the expected exception type, and its message names the parameter (and value)."""
    check_row(tmp_path, call, error, names)


@pytest.mark.parametrize("seed", [-1, True, 2**64, 1.0])
def test_a_refused_state_leaves_the_seed_alone(seed: object) -> None:
    """A seed=None sampler refusing a state keeps its own seed: the bad seed is never adopted."""
    sampler = ShardedSampler(10, num_replicas=1, rank=0, seed=None)
    state = sampler.state_dict()
    fresh = ShardedSampler(10, num_replicas=1, rank=0, seed=None)
    with pytest.raises(MalformedStateError, match=r"state\['seed'\]"):
        fresh.load_state_dict({**state, "seed": seed})
    assert fresh._resolved_seed is None
    fresh.load_state_dict(state)
    assert fresh.seed == sampler.seed and list(fresh) == list(sampler)


def test_a_mismatched_state_does_not_adopt_its_seed() -> None:
    """A state of another configuration is refused, and its seed is not taken over either."""
    state = ShardedSampler(11, num_replicas=1, rank=0, seed=5).state_dict()
    for inner in (None, ShardedSampler(10, num_replicas=1, rank=0, seed=None)):
        sampler: Any = ShardedSampler(10, num_replicas=1, rank=0, seed=None) if inner is None else (
            ScheduledBatchSampler(inner, batch_size=2, num_replicas=1, rank=0))
        with pytest.raises(ValueError, match="saved for"):
            sampler.load_state_dict(state)
        assert sampler._resolved_seed is None and (inner is None or inner._resolved_seed is None)


def test_a_valid_state_still_hands_its_seed_to_the_index_sampler() -> None:
    """ScheduledBatchSampler over a seed=None index sampler resumes both with the saved seed."""
    saved = ScheduledBatchSampler(ShardedSampler(10, num_replicas=1, rank=0, seed=77), batch_size=2,
                                  num_replicas=1, rank=0)  # fmt: skip
    inner = ShardedSampler(10, num_replicas=1, rank=0, seed=None)
    resumed = ScheduledBatchSampler(inner, batch_size=2, num_replicas=1, rank=0)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.seed == inner.seed == 77 and list(resumed) == list(saved)


def test_lookups_of_nothing_and_of_numpy_or_torch_integers_still_work() -> None:
    """An empty lookup gives an empty answer; numpy and torch integer indices are looked up as ints."""
    assert MIXTURE.sources([]).tolist() == [] and MIXTURE.sources(np.empty((0, 2), np.float32)).shape == (0, 2)
    assert MIXTURE.sources(torch.tensor([2, 3])).tolist() == [0, 1]
    assert MIXTURE.sources(np.array([4], np.uint64)).tolist() == [1]
    assert MIXTURE.locate(np.int64(4)) == (1, 1) and MIXTURE[-1] == 1 and MIXTURE[np.int64(3)] == 0
    assert _mixture_sampler().sources_of(np.int64(3)) == 1
    assert BY_EPOCH.at(np.int64(1), np.int32(3)) == [1.0, 2.0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # cache_dir=False: built in private memory, with a warning
def test_good_cache_dirs_are_still_accepted(tmp_path: Path) -> None:
    """A directory that does not exist yet, a str, a PathLike, None and False all make a working sampler."""
    for cache_dir in (tmp_path / "new", str(tmp_path), None, False):
        sampler: Any = _bucket(cache_dir=cache_dir, num_replicas=1, rank=0)
        assert sorted(i for batch in sampler for i in batch) == [0, 1, 2, 3]
