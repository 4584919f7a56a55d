"""The bad-input table: every public name refuses each bad argument with the right type, naming the parameter.

Each row is ``(id, call, error, names)``: ``call(tmp)`` (``tmp`` a fresh directory) must raise
``error`` whose message contains every string of ``names`` (the parameter, and the value where it
is not obvious). This file holds the samplers' and schedules' rows; tests/contract/test_bad_input_data.py the data
utilities', seeds' and states'; tests/contract/test_bad_input_api.py those of cache_dir, lookups, PackedDataset and
other API added since; tests/tools/test_cli.py the command line's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

import shardwise
from shardwise import (
    BatchSizeSchedule,
    BucketBatchSampler,
    ClassBalancedBatchSampler,
    Mixture,
    MixtureSampler,
    PackCollate,
    PackedBatchSampler,
    PackedDataset,
    PackedIndex,
    ScheduledBatchSampler,
    ShardedBatchWrapper,
    ShardedSampler,
    ShardedWrapper,
    TwoStreamBatchSampler,
    WeightedSampler,
    WeightSchedule,
    pack_collate,
    shard,
    shard_batches,
    temperature_weights,
)
from shardwise.samplers.adaptive import AdaptiveMixture
from tests.contract.test_bad_input_data import ROWS as DATA_ROWS
from tests.contract.test_bad_input_data import check_row

Call = Callable[[Path], object]
RAGGED = [[0, 1], [2]]  # nested lists of unequal lengths: numpy cannot make an array of them
SQUARE = [[0, 1], [2, 3]]  # a 2-D table where a 1-D sequence is meant
BATCHES = BatchSampler(SequentialSampler(range(8)), 2, False)


def _sharded(**kwargs: Any) -> Call:
    return lambda tmp: ShardedSampler(kwargs.pop("dataset", 10), **kwargs)


def _bucket(**kwargs: Any) -> Call:
    lengths = kwargs.pop("lengths", [3, 5, 2, 7])
    kwargs.setdefault("max_tokens", 16) if "batch_size" not in kwargs else None
    return lambda tmp: BucketBatchSampler(lengths, **kwargs)


def _balanced(**kwargs: Any) -> Call:
    labels = kwargs.pop("labels", [0, 0, 1, 1, 2, 2])
    kwargs.setdefault("classes_per_batch", 2)
    kwargs.setdefault("samples_per_class", 2)
    return lambda tmp: ClassBalancedBatchSampler(labels, **kwargs)


def _two(**kwargs: Any) -> Call:
    primary = kwargs.pop("primary", [0, 1, 2, 3])
    secondary = kwargs.pop("secondary", [4, 5, 6, 7])
    kwargs.setdefault("primary_batch_size", 2)
    kwargs.setdefault("secondary_batch_size", 2)
    return lambda tmp: TwoStreamBatchSampler(primary, secondary, **kwargs)


def _weighted(**kwargs: Any) -> Call:
    weights = kwargs.pop("weights", [1.0, 2.0, 3.0])
    kwargs.setdefault("num_samples", 3)
    return lambda tmp: WeightedSampler(weights, **kwargs)


def _scheduled(**kwargs: Any) -> Call:
    data = kwargs.pop("data", 10)
    kwargs.setdefault("batch_size", 2)
    return lambda tmp: ScheduledBatchSampler(data, **kwargs)


def _adaptive() -> AdaptiveMixture:
    adaptive = MixtureSampler([3, 2], shardwise.AdaptiveWeights(shardwise.Exp3(), interval=8), num_samples=4).adaptive
    assert adaptive is not None
    return adaptive


def _mixture(**kwargs: Any) -> Call:
    sizes = kwargs.pop("sizes", [3, 2])
    weights = kwargs.pop("weights", [1.0, 1.0])
    kwargs.setdefault("num_samples", 4)
    return lambda tmp: MixtureSampler(sizes, weights, **kwargs)


V, T = ValueError, TypeError
ZOO = "tests.verify_zoo:sharded_env"
ROWS: list[tuple[str, Call, type[BaseException], tuple[str, ...]]] = [
    # -- ShardedSampler ----------------------------------------------------------------------------
    ("sharded-dataset-negative", _sharded(dataset=-1), V, ("dataset", "-1")),
    ("sharded-dataset-float", _sharded(dataset=2.5), T, ("dataset", "2.5")),
    ("sharded-dataset-bool", _sharded(dataset=True), T, ("dataset", "True")),
    ("sharded-dataset-none", _sharded(dataset=None), T, ("dataset", "None")),
    ("sharded-dataset-unsized", _sharded(dataset=object()), T, ("dataset", "object")),
    ("sharded-dataset-huge", _sharded(dataset=2**63), V, ("dataset",)),
    ("sharded-replicas-zero", _sharded(num_replicas=0), V, ("num_replicas", "0")),
    ("sharded-replicas-bool", _sharded(num_replicas=True), T, ("num_replicas", "True")),
    ("sharded-replicas-float", _sharded(num_replicas=2.0), T, ("num_replicas", "2.0")),
    ("sharded-replicas-str", _sharded(num_replicas="2"), T, ("num_replicas", "'2'")),
    ("sharded-rank-too-big", _sharded(num_replicas=2, rank=2), V, ("rank", "2")),
    ("sharded-rank-negative", _sharded(rank=-1), V, ("rank", "-1")),
    ("sharded-rank-str", _sharded(rank="0"), T, ("rank", "'0'")),
    ("sharded-rank-bool", _sharded(rank=False), T, ("rank", "False")),
    ("sharded-seed-negative", _sharded(seed=-3), V, ("seed", "-3")),
    ("sharded-seed-str", _sharded(seed="7"), T, ("seed", "'7'")),
    ("sharded-seed-float", _sharded(seed=1.5), T, ("seed", "1.5")),
    ("sharded-seed-bool", _sharded(seed=True), T, ("seed", "True")),
    ("sharded-seed-2**64", _sharded(seed=2**64), V, ("seed",)),
    ("sharded-shuffle-int", _sharded(shuffle=1), T, ("shuffle", "1")),
    ("sharded-shuffle-str", _sharded(shuffle="yes"), T, ("shuffle", "'yes'")),
    ("sharded-drop-last-none", _sharded(drop_last=None), T, ("drop_last", "None")),
    ("sharded-drop-last-numpy-bool", _sharded(drop_last=np.array([True, False])), T, ("drop_last",)),
    # -- shard / shard_batches / the wrappers -----------------------------------------------------
    ("shard-sampler-int", lambda tmp: shard(42), T, ("sampler", "42")),  # type: ignore[arg-type]
    ("shard-sampler-none", lambda tmp: shard(None), T, ("sampler", "None")),  # type: ignore[arg-type]
    ("shard-sampler-batch", lambda tmp: shard(BATCHES), T, ("sampler", "shard_batches")),  # type: ignore[arg-type]
    ("shard-even-wrap", lambda tmp: shard(SequentialSampler(range(4)), even="wrap"), V, ("even", "'pad'", "'drop'")),
    ("shard-even-none", lambda tmp: shard(SequentialSampler(range(4)), even=None), V, ("even", "None")),  # type: ignore[arg-type]
    ("shard-seed-negative", lambda tmp: shard(SequentialSampler(range(4)), seed=-1), V, ("seed", "-1")),
    ("shard-even-and-drop-last", lambda tmp: shard(SequentialSampler(range(4)), even="pad", drop_last=False), V, ("drop_last=False", "even='pad'", "deprecated")),
    ("shard-batches-drop-last-str", lambda tmp: shard_batches(BATCHES, drop_last="yes"), T, ("drop_last", "'yes'")),
    ("sharded-unknown-keyword", lambda tmp: ShardedSampler(8, drop_lst=True), T, ("drop_lst",)),  # type: ignore[call-arg]
    ("shard-replicas-zero", lambda tmp: shard(SequentialSampler(range(4)), num_replicas=0), V, ("num_replicas",)),
    ("shard-rank-bool", lambda tmp: shard(SequentialSampler(range(4)), rank=True), T, ("rank", "True")),
    ("shard-batches-int", lambda tmp: shard_batches(5), T, ("batch_sampler", "5")),  # type: ignore[arg-type]
    ("shard-batches-none", lambda tmp: shard_batches(None), T, ("batch_sampler", "None")),  # type: ignore[arg-type]
    ("shard-batches-even", lambda tmp: shard_batches(BATCHES, even="x"), V, ("even", "'x'")),
    ("shard-batches-seed-str", lambda tmp: shard_batches(BATCHES, seed="a"), T, ("seed", "'a'")),
    ("shard-batches-replicas", lambda tmp: shard_batches(BATCHES, num_replicas=-1), V, ("num_replicas", "-1")),
    ("shard-batches-rank-float", lambda tmp: shard_batches(BATCHES, rank=1.5), T, ("rank", "1.5")),
    ("wrapper-sampler-str", lambda tmp: ShardedWrapper("abc"), T, ("sampler", "'abc'")),  # type: ignore[arg-type]
    ("wrapper-even-int", lambda tmp: ShardedWrapper(SequentialSampler(range(4)), even=1), V, ("even", "1")),  # type: ignore[arg-type]
    ("batch-wrapper-int", lambda tmp: ShardedBatchWrapper(3), T, ("batch_sampler", "3")),  # type: ignore[arg-type]
    ("batch-wrapper-rank", lambda tmp: ShardedBatchWrapper(BATCHES, num_replicas=2, rank=5), V, ("rank", "5")),
    # -- BucketBatchSampler -----------------------------------------------------------------------
    ("bucket-lengths-ragged", _bucket(lengths=RAGGED), T, ("lengths",)),
    ("bucket-lengths-2d", _bucket(lengths=SQUARE), V, ("lengths", "(2, 2)")),
    ("bucket-lengths-float", _bucket(lengths=[1.5, 2.0]), T, ("lengths", "float64")),
    ("bucket-lengths-negative", _bucket(lengths=[3, -1]), V, ("lengths", "-1")),
    ("bucket-lengths-empty", _bucket(lengths=[]), V, ("lengths",)),
    ("bucket-lengths-str", _bucket(lengths="abc"), T, ("lengths", "'abc'")),
    ("bucket-lengths-none", _bucket(lengths=None), T, ("lengths", "None")),
    ("bucket-lengths-generator", _bucket(lengths=(n for n in [3, 5])), T, ("lengths", "generator")),
    ("bucket-lengths-bool", _bucket(lengths=[True, False]), T, ("lengths", "bool")),
    ("bucket-lengths-meta-tensor", _bucket(lengths=torch.ones(3, dtype=torch.int64, device="meta")), T, ("lengths", "meta")),
    ("bucket-max-tokens-zero", _bucket(max_tokens=0), V, ("max_tokens", "0")),
    ("bucket-max-tokens-bool", _bucket(max_tokens=True), T, ("max_tokens", "True")),
    ("bucket-max-tokens-float", _bucket(max_tokens=1.5), T, ("max_tokens", "1.5")),
    ("bucket-max-tokens-too-small", _bucket(max_tokens=4), V, ("max_tokens=4", "oversized")),
    ("bucket-neither-size", _bucket(max_tokens=None), V, ("max_tokens", "batch_size")),
    ("bucket-both-sizes", _bucket(max_tokens=8, batch_size=2), V, ("max_tokens", "batch_size")),
    ("bucket-batch-size-zero", _bucket(batch_size=0), V, ("batch_size", "0")),
    ("bucket-batch-size-str", _bucket(batch_size="4"), T, ("batch_size", "'4'")),
    ("bucket-batch-size-lambda-1-arg", _bucket(batch_size=lambda epoch: 2), T, ("batch_size",)),
    ("bucket-multiple-zero", _bucket(batch_size_multiple=0), V, ("batch_size_multiple", "0")),
    ("bucket-multiple-bool", _bucket(batch_size_multiple=True), T, ("batch_size_multiple", "True")),
    ("bucket-multiple-with-batch-size", _bucket(batch_size=2, batch_size_multiple=2), V, ("batch_size_multiple",)),
    ("bucket-sort-window-zero", _bucket(sort_window=0), V, ("sort_window", "0")),
    ("bucket-sort-window-float", _bucket(sort_window=2.5), T, ("sort_window", "2.5")),
    ("bucket-balance-group-zero", _bucket(balance_group=0), V, ("balance_group", "0")),
    ("bucket-batch-order-unknown", _bucket(batch_order="sorted"), V, ("batch_order", "'mixed'", "'ascending'")),
    ("bucket-longest-first-int", _bucket(longest_first=1), T, ("longest_first", "1")),
    ("bucket-longest-first-ascending", _bucket(batch_order="ascending", longest_first=True), V,
     ("longest_first", "batch_order='mixed'")),
    ("bucket-balance-group-none", _bucket(balance_group=None), T, ("balance_group", "None")),
    ("bucket-oversized-trim", _bucket(oversized="trim"), V, ("oversized", "'trim'", "'error'")),
    ("bucket-oversized-int", _bucket(oversized=1), V, ("oversized", "1")),
    ("bucket-oversized-with-batch-size", _bucket(batch_size=2, oversized="skip"), V, ("oversized",)),
    ("bucket-shuffle-str", _bucket(shuffle="no"), T, ("shuffle", "'no'")),
    ("bucket-drop-last-int", _bucket(drop_last=2), T, ("drop_last", "2")),
    ("bucket-seed-negative", _bucket(seed=-1), V, ("seed", "-1")),
    ("bucket-replicas-zero", _bucket(num_replicas=0), V, ("num_replicas", "0")),
    ("bucket-rank-negative", _bucket(rank=-1), V, ("rank", "-1")),
    ("bucket-schedule-changes-mid-epoch", _bucket(max_tokens=BatchSizeSchedule.by_samples({0: 16, 3: 32})), V, ("max_tokens",)),
    # -- ClassBalancedBatchSampler ----------------------------------------------------------------
    ("balanced-labels-multi-label", _balanced(labels=[[0, 1], [2], [1, 2]]), T, ("labels",)),
    ("balanced-labels-2d", _balanced(labels=SQUARE), V, ("labels", "(2, 2)")),
    ("balanced-labels-float", _balanced(labels=[0.5, 1.5]), T, ("labels", "float64")),
    ("balanced-labels-empty", _balanced(labels=[]), V, ("labels",)),
    ("balanced-labels-none", _balanced(labels=None), T, ("labels", "None")),
    ("balanced-labels-dict", _balanced(labels={0: 0, 1: 1}), T, ("labels", "dict")),
    ("balanced-labels-bool", _balanced(labels=[True, False, True]), T, ("labels", "bool")),
    ("balanced-labels-mixed", _balanced(labels=[0, "a", 1]), T, ("labels",)),
    ("balanced-classes-zero", _balanced(classes_per_batch=0), V, ("classes_per_batch", "0")),
    ("balanced-classes-bool", _balanced(classes_per_batch=True), T, ("classes_per_batch", "True")),
    ("balanced-classes-str", _balanced(classes_per_batch="2"), T, ("classes_per_batch", "'2'")),
    ("balanced-classes-too-many", _balanced(classes_per_batch=5), V, ("classes_per_batch", "5")),
    ("balanced-classes-schedule-too-many", _balanced(classes_per_batch=BatchSizeSchedule.by_epoch({0: 2, 1: 9})), V, ("classes_per_batch",)),
    ("balanced-per-class-zero", _balanced(samples_per_class=0), V, ("samples_per_class", "0")),
    ("balanced-per-class-float", _balanced(samples_per_class=1.5), T, ("samples_per_class", "1.5")),
    ("balanced-small-drop", _balanced(small_classes="drop"), V, ("small_classes", "'drop'", "'replace'")),
    ("balanced-small-none", _balanced(small_classes=None), V, ("small_classes", "None")),
    ("balanced-small-error", _balanced(labels=[0, 0, 1], samples_per_class=2, small_classes="error"), V, ("samples_per_class", "small_classes")),
    ("balanced-drop-last-str", _balanced(drop_last="x"), T, ("drop_last", "'x'")),
    ("balanced-seed-negative", _balanced(seed=-1), V, ("seed", "-1")),
    ("balanced-rank-negative", _balanced(rank=-1), V, ("rank", "-1")),
    ("balanced-replicas-zero", _balanced(num_replicas=0), V, ("num_replicas", "0")),
    # -- TwoStreamBatchSampler --------------------------------------------------------------------
    ("two-primary-per-class-lists", _two(primary=[[0, 1], [2]]), T, ("primary_indices",)),
    ("two-primary-2d", _two(primary=SQUARE), V, ("primary_indices", "(2, 2)")),
    ("two-primary-empty", _two(primary=[]), V, ("primary_indices",)),
    ("two-primary-negative", _two(primary=[0, -1]), V, ("primary_indices", "-1")),
    ("two-primary-float", _two(primary=[0.5, 1.0]), T, ("primary_indices", "float64")),
    ("two-primary-none", _two(primary=None), T, ("primary_indices", "None")),
    ("two-primary-generator", _two(primary=iter(range(4))), T, ("primary_indices", "range_iterator")),
    ("two-primary-str", _two(primary="abc"), T, ("primary_indices", "'abc'")),
    ("two-primary-bool-mask", _two(primary=[True, False]), T, ("primary_indices", "bool")),
    ("two-secondary-ragged", _two(secondary=RAGGED), T, ("secondary_indices",)),
    ("two-secondary-negative", _two(secondary=[-2]), V, ("secondary_indices", "-2")),
    ("two-secondary-float", _two(secondary=[1.5]), T, ("secondary_indices", "float64")),
    ("two-secondary-empty-but-drawn", _two(secondary=[]), V, ("secondary_indices", "secondary_batch_size")),
    ("two-primary-size-zero", _two(primary_batch_size=0), V, ("primary_batch_size", "0")),
    ("two-primary-size-bool", _two(primary_batch_size=True), T, ("primary_batch_size", "True")),
    ("two-primary-size-str", _two(primary_batch_size="2"), T, ("primary_batch_size", "'2'")),
    ("two-primary-size-too-big", _two(primary_batch_size=9), V, ("primary_batch_size", "9")),
    ("two-primary-size-lambda", _two(primary_batch_size=lambda e, s: 2), T, ("primary_batch_size",)),
    ("two-secondary-size-negative", _two(secondary_batch_size=-1), V, ("secondary_batch_size", "-1")),
    ("two-secondary-size-none", _two(secondary_batch_size=None), T, ("secondary_batch_size", "None")),
    ("two-drop-last-int", _two(drop_last=1), T, ("drop_last", "1")),
    ("two-seed-str", _two(seed="x"), T, ("seed", "'x'")),
    ("two-replicas-zero", _two(num_replicas=0), V, ("num_replicas", "0")),
    ("two-rank-negative", _two(rank=-1), V, ("rank", "-1")),
    # -- WeightedSampler --------------------------------------------------------------------------
    ("weighted-ragged", _weighted(weights=[[1.0, 2.0], [3.0]]), T, ("weights",)),
    ("weighted-2d", _weighted(weights=[[1.0, 2.0], [3.0, 4.0]]), V, ("weights", "(2, 2)")),
    ("weighted-empty", _weighted(weights=[]), V, ("weights",)),
    ("weighted-negative", _weighted(weights=[1.0, -1.0]), V, ("weights", "-1.0")),
    ("weighted-nan", _weighted(weights=[1.0, math.nan]), V, ("weights", "nan")),
    ("weighted-inf", _weighted(weights=[1.0, math.inf]), V, ("weights", "inf")),
    ("weighted-all-zero", _weighted(weights=[0.0, 0.0]), V, ("weights",)),
    ("weighted-str", _weighted(weights=["a", "b"]), T, ("weights",)),
    ("weighted-bool", _weighted(weights=[True, False]), T, ("weights", "bool")),
    ("weighted-none", _weighted(weights=None), T, ("weights", "None")),
    ("weighted-set", _weighted(weights={1.0, 2.0}), T, ("weights", "set")),
    ("weighted-complex", _weighted(weights=[1j, 2]), T, ("weights", "complex")),
    ("weighted-meta-tensor", _weighted(weights=torch.ones(3, device="meta")), T, ("weights", "meta")),
    ("weighted-num-samples-negative", _weighted(num_samples=-1), V, ("num_samples", "-1")),
    ("weighted-num-samples-float", _weighted(num_samples=1.5), T, ("num_samples", "1.5")),
    ("weighted-num-samples-bool", _weighted(num_samples=True), T, ("num_samples", "True")),
    ("weighted-num-samples-none", _weighted(num_samples=None), T, ("num_samples", "None")),
    ("weighted-too-many-distinct", _weighted(num_samples=4, replacement=False), V, ("num_samples", "4")),
    ("weighted-replacement-str", _weighted(replacement="no"), T, ("replacement", "'no'")),
    ("weighted-drop-last-none", _weighted(drop_last=None), T, ("drop_last", "None")),
    ("weighted-seed-2**64", _weighted(seed=2**64), V, ("seed",)),
    ("weighted-replicas-bool", _weighted(num_replicas=True), T, ("num_replicas", "True")),
    ("weighted-rank-float", _weighted(rank=1.0), T, ("rank", "1.0")),
    # -- ScheduledBatchSampler --------------------------------------------------------------------
    ("scheduled-data-negative", _scheduled(data=-1), V, ("data", "-1")),
    ("scheduled-data-none", _scheduled(data=None), T, ("data", "None")),
    ("scheduled-data-float", _scheduled(data=2.5), T, ("data", "2.5")),
    ("scheduled-data-torch-sampler", _scheduled(data=SequentialSampler(range(4))), T, ("data", "shard")),
    ("scheduled-batch-pair-of-1", _scheduled(batch_size=lambda e, s: (2,)), T, ("batch_size", "(2,)")),
    ("scheduled-batch-zero", _scheduled(batch_size=0), V, ("batch_size", "0")),
    ("scheduled-batch-bool", _scheduled(batch_size=True), T, ("batch_size", "True")),
    ("scheduled-batch-str", _scheduled(batch_size="8"), T, ("batch_size", "'8'")),
    ("scheduled-batch-none", _scheduled(batch_size=None), T, ("batch_size", "None")),
    ("scheduled-batch-lambda-1-arg", _scheduled(batch_size=lambda epoch: 4), T, ("batch_size",)),
    ("scheduled-batch-lambda-0-args", _scheduled(batch_size=lambda: 4), T, ("batch_size",)),
    ("scheduled-batch-lambda-3-args", _scheduled(batch_size=lambda e, s, x: 4), T, ("batch_size",)),
    ("scheduled-batch-lambda-returns-0", _scheduled(batch_size=lambda e, s: 0), V, ("batch_size",)),
    ("scheduled-batch-lambda-returns-str", _scheduled(batch_size=lambda e, s: "8"), T, ("batch_size", "'8'")),
    ("scheduled-batch-lambda-returns-float", _scheduled(batch_size=lambda e, s: 2.0), T, ("batch_size", "2.0")),
    ("scheduled-shuffle-int", _scheduled(shuffle=0), T, ("shuffle", "0")),
    ("scheduled-drop-last-str", _scheduled(drop_last="no"), T, ("drop_last", "'no'")),
    ("scheduled-seed-negative", _scheduled(seed=-1), V, ("seed", "-1")),
    ("scheduled-replicas-zero", _scheduled(num_replicas=0), V, ("num_replicas", "0")),
    ("scheduled-rank-negative", _scheduled(rank=-5), V, ("rank", "-5")),
    # -- MixtureSampler, WeightSchedule, temperature_weights ------------------------------------------
    ("mixture-sizes-ragged", _mixture(sizes=RAGGED), T, ("sizes",)),
    ("mixture-sizes-none", _mixture(sizes=None), T, ("sizes", "None")),
    ("mixture-sizes-negative", _mixture(sizes=[3, -1]), V, ("sizes", "-1")),
    ("mixture-sizes-float", _mixture(sizes=[3.5, 2]), T, ("sizes", "float64")),
    ("mixture-weights-one-too-many", _mixture(weights=[1, 1, 1]), V, ("weights", "3")),
    ("mixture-weights-negative", _mixture(weights=[1, -1]), V, ("weights", "-1")),
    ("mixture-weights-nan", _mixture(weights=[1, math.nan]), V, ("weights", "nan")),
    ("mixture-weights-none", _mixture(weights=None), T, ("weights", "None")),
    ("mixture-weights-str", _mixture(weights="ab"), T, ("weights", "'ab'")),
    ("mixture-weights-all-zero", _mixture(weights=[0, 0]), V, ("weights",)),
    ("mixture-num-samples-negative", _mixture(num_samples=-1), V, ("num_samples", "-1")),
    ("mixture-num-samples-bool", _mixture(num_samples=True), T, ("num_samples", "True")),
    ("mixture-stop-never", _mixture(num_samples=None, stop="never"), V, ("stop", "'never'", "'first_exhausted'")),
    ("mixture-primary-out-of-range", _mixture(num_samples=None, stop="primary", primary=5), V, ("primary", "5")),
    ("mixture-primary-bool", _mixture(num_samples=None, stop="primary", primary=True), T, ("primary", "True")),
    ("mixture-block-zero", _mixture(block=0), V, ("block", "0")),
    ("mixture-shuffle-int", _mixture(shuffle=1), T, ("shuffle", "1")),
    ("mixture-interleave-str", _mixture(interleave="y"), T, ("interleave", "'y'")),
    ("mixture-even-wrap", _mixture(even="wrap"), V, ("even", "'wrap'", "'pad'")),
    ("mixture-even-and-drop-last", _mixture(even="drop", drop_last=True), V, ("drop_last=True", "even='drop'", "drop_last only")),
    ("mixture-drop-last-int", _mixture(drop_last=1), T, ("drop_last", "1")),
    ("mixture-seed-negative", _mixture(seed=-1), V, ("seed", "-1")),
    ("mixture-rank-negative", _mixture(rank=-1), V, ("rank", "-1")),
    ("mixture-schedule-one-too-many", _mixture(weights=WeightSchedule.constant([1, 1, 1])), V, ("weights", "3")),
    ("weight-schedule-epoch-empty", lambda tmp: WeightSchedule.by_epoch({}), T, ("weights", "{}")),
    ("weight-schedule-epoch-not-from-0", lambda tmp: WeightSchedule.by_epoch({1: [1, 1]}), V, ("weights", "epoch 0")),
    ("weight-schedule-epoch-ragged", lambda tmp: WeightSchedule.by_epoch({0: [1, 1], 2: [1]}), V, ("weights", "[1, 2]")),
    ("weight-schedule-samples-key-float", lambda tmp: WeightSchedule.by_samples({0: [1, 1], 0.5: [1, 2]}), T, ("weights", "0.5")),
    ("weight-schedule-constant-negative", lambda tmp: WeightSchedule.constant([1, -1]), V, ("weights", "-1")),
    ("weight-schedule-constant-none", lambda tmp: WeightSchedule.constant(None), T, ("weights", "None")),
    ("weight-schedule-constant-ragged", lambda tmp: WeightSchedule.constant([[1], [1, 2]]), T, ("weights",)),
    ("temperature-alpha-negative", lambda tmp: temperature_weights([3, 2], -1), V, ("alpha", "-1")),
    ("temperature-alpha-str", lambda tmp: temperature_weights([3, 2], "x"), T, ("alpha", "'x'")),
    ("temperature-alpha-nan", lambda tmp: temperature_weights([3, 2], math.nan), V, ("alpha", "nan")),
    ("temperature-sizes-ragged", lambda tmp: temperature_weights(RAGGED, 0.5), T, ("sizes",)),
    ("temperature-sizes-none", lambda tmp: temperature_weights(None, 0.5), T, ("sizes", "None")),
    ("mixture-datasets-none", lambda tmp: Mixture(None), T, ("datasets", "None")),  # type: ignore[arg-type]
    ("mixture-datasets-of-ints", lambda tmp: Mixture([1, 2]), T, ("datasets", "1")),  # type: ignore[list-item]
    ("mixture-datasets-empty", lambda tmp: Mixture([]), V, ("datasets",)),
    ("mixture-datasets-one-empty", lambda tmp: Mixture([[1], []]), V, ("datasets", "'1'")),
    # -- adaptive mixtures: AdaptiveWeights, Exp3, ExponentiatedGradient, MixtureSampler.adaptive.record---------
    ("adaptive-policy-not-callable", lambda tmp: shardwise.AdaptiveWeights("exp3", interval=8), T, ("policy", "'exp3'")),
    ("adaptive-interval-zero", lambda tmp: shardwise.AdaptiveWeights(shardwise.Exp3(), interval=0), V, ("interval", "0")),
    ("adaptive-initial-negative", lambda tmp: shardwise.AdaptiveWeights(shardwise.Exp3(), interval=8, initial=[1, -1]), V, ("initial", "-1")),
    ("exp3-smoothing-one", lambda tmp: shardwise.Exp3(smoothing=1.0), V, ("smoothing", "[0, 1)")),
    ("exp3-floor-negative", lambda tmp: shardwise.Exp3(floor=-0.1), V, ("floor", "-0.1")),
    ("exp3-floor-str", lambda tmp: shardwise.Exp3(floor="0.1"), T, ("floor", "'0.1'")),
    ("exp-gradient-rate-zero", lambda tmp: shardwise.ExponentiatedGradient(rate=0), V, ("rate", "(0,")),
    ("exp-gradient-smoothing-nan", lambda tmp: shardwise.ExponentiatedGradient(smoothing=math.nan), V, ("smoothing", "nan")),
    ("mixture-adaptive-exhausted-stop", _mixture(weights=shardwise.AdaptiveWeights(shardwise.Exp3(), interval=8), num_samples=None), V, ("stop='num_samples'", "'all_exhausted'")),
    ("mixture-adaptive-block-below-floor", _mixture(weights=shardwise.AdaptiveWeights(shardwise.Exp3(floor=0.1), interval=8), block=4), V, ("block", "10", "floor=0.1")),
    ("mixture-adaptive-floor-too-high", _mixture(weights=shardwise.AdaptiveWeights(shardwise.Exp3(floor=0.5), interval=8)), V, ("floor", "1 / 2")),
    ("mixture-adaptive-initial-one-too-many", _mixture(weights=shardwise.AdaptiveWeights(shardwise.Exp3(), interval=8, initial=[1, 1, 1])), V, ("initial", "3")),
    ("mixture-record-nan", lambda tmp: _adaptive().record([math.nan], [0]), V, ("values", "nan")),
    ("mixture-record-source-out-of-range", lambda tmp: _adaptive().record([1.0], [2]), V, ("sources", "[0, 1]", "2")),
    ("mixture-record-lengths-differ", lambda tmp: _adaptive().record([1.0, 2.0], [0]), V, ("values", "sources", "2 values")),
    ("mixture-record-float-sources", lambda tmp: _adaptive().record([1.0], [0.5]), T, ("sources", "float64")),
    ("mixture-update-due-negative-position", lambda tmp: _adaptive().update_due(-1), V, ("position", "-1")),
    # -- PackedBatchSampler, pack_collate, PackCollate, PackedDataset, PackedIndex ----------------------
    ("packed-max-len-zero", lambda tmp: PackedBatchSampler([3, 4], max_len=0, rows_per_batch=2), V, ("max_len", "0")),
    ("packed-both-budgets", lambda tmp: PackedBatchSampler([3, 4], max_len=8, rows_per_batch=2, tokens_per_batch=16), V, ("rows_per_batch", "tokens_per_batch")),
    ("packed-no-budget", lambda tmp: PackedBatchSampler([3, 4], max_len=8), V, ("rows_per_batch", "tokens_per_batch")),
    ("packed-negative-length", lambda tmp: PackedBatchSampler([3, -4], max_len=8, rows_per_batch=2), V, ("lengths", "-4")),
    ("packed-too-long-error", lambda tmp: PackedBatchSampler([3, 40], max_len=8, rows_per_batch=2, too_long="error"), V, ("max_len", "too_long")),
    ("packed-too-long-unknown", lambda tmp: PackedBatchSampler([3, 4], max_len=8, rows_per_batch=2, too_long="cut"), V, ("too_long", "'cut'", "'split'")),
    ("packed-balance-unknown", lambda tmp: PackedBatchSampler([3, 4], max_len=8, rows_per_batch=2, balance="flops"), V, ("balance", "'flops'", "'attention'")),
    ("packed-lengths-ragged", lambda tmp: PackedBatchSampler(RAGGED, max_len=8, rows_per_batch=2), T, ("lengths",)),
    ("packed-shuffle-int", lambda tmp: PackedBatchSampler([3, 4], max_len=8, rows_per_batch=2, shuffle=1), T, ("shuffle", "1")),
    ("packed-rows-bool", lambda tmp: PackedBatchSampler([3, 4], max_len=8, rows_per_batch=True), T, ("rows_per_batch", "True")),
    ("mixture-by-tokens", lambda tmp: MixtureSampler([3, 2], WeightSchedule.by_tokens({0: [1, 1]}), num_samples=4), V, ("by_tokens", "by_samples", "PackedMixtureSampler")),
    # -- PackedMixtureSampler ---------------------------------------------------------------------------
    ("packed-mixture-zero-token-source", lambda tmp: shardwise.PackedMixtureSampler([[0, 0], [5]], [1, 1], max_len=8, rows_per_batch=2), V, ("source 0", "0 tokens", "weight 0")),
    ("packed-mixture-one-source-flat", lambda tmp: shardwise.PackedMixtureSampler([3, 4], [1], max_len=8, rows_per_batch=2), V, ("lengths",)),
    ("packed-mixture-weights-count", lambda tmp: shardwise.PackedMixtureSampler([[3], [4]], [1], max_len=8, rows_per_batch=2), V, ("weights",)),
    ("packed-mixture-by-samples", lambda tmp: shardwise.PackedMixtureSampler([[3], [4]], WeightSchedule.by_samples({0: [1, 1]}), max_len=8, rows_per_batch=2), V, ("by_tokens", "by_samples")),
    ("packed-mixture-stop-unknown", lambda tmp: shardwise.PackedMixtureSampler([[3], [4]], [1, 1], max_len=8, rows_per_batch=2, stop="never"), V, ("stop", "'never'", "'all_exhausted'")),
    ("packed-mixture-small-batch", lambda tmp: shardwise.PackedMixtureSampler([[3], [4], [5]], [1, 1, 1], max_len=2, rows_per_batch=2), V, ("rows_per_batch * max_len", "9")),
    ("packed-mixture-rows-zero", lambda tmp: shardwise.PackedMixtureSampler([[3], [4]], [1, 1], max_len=8, rows_per_batch=0), V, ("rows_per_batch", "0")),
    ("pack-collate-batch-none", lambda tmp: pack_collate(None), T, ("batch", "None")),  # type: ignore[arg-type]
    ("pack-collate-max-len-zero", lambda tmp: pack_collate([[1, 2]], max_len=0), V, ("max_len", "0")),
    ("packcollate-rows-negative", lambda tmp: PackCollate(rows=-1), V, ("rows", "-1")),
    ("packcollate-max-len-zero", lambda tmp: PackCollate(max_len=0), V, ("max_len", "0")),
    ("packed-dataset-none", lambda tmp: PackedDataset(None), T, ("dataset", "NoneType")),
    ("packed-index-negative", lambda tmp: PackedIndex(-1), V, ("index", "-1")),
    ("packed-index-row-bool", lambda tmp: PackedIndex(3, row=True), T, ("row", "True")),
    # -- verify, VerifyReport (refused before any process starts) ------------------------------------
    ("verify-world-size-zero", lambda tmp: shardwise.verify(ZOO, world_size=0), V, ("world_size", "0")),
    ("verify-epochs-bool", lambda tmp: shardwise.verify(ZOO, epochs=True), T, ("epochs", "True")),
    ("verify-dataset-size-negative", lambda tmp: shardwise.verify(ZOO, dataset_size=-1), V, ("dataset_size", "-1")),
    ("verify-lengths-float", lambda tmp: shardwise.verify(ZOO, lengths=[1.5]), T, ("lengths",)),
    ("verify-timeout-zero", lambda tmp: shardwise.verify(ZOO, timeout=0), V, ("timeout", "0")),
    ("verify-target-no-colon", lambda tmp: shardwise.verify("nocolon"), V, ("target", "'nocolon'")),
    ("verify-target-lambda", lambda tmp: shardwise.verify(lambda: None), V, ("lambda",)),
    ("verify-target-int", lambda tmp: shardwise.verify(3), V, ("factory", "3")),  # type: ignore[arg-type]
    ("verify-report-severity", lambda tmp: shardwise.VerifyReport("m:f", 2, 1, "batch", []).raise_for_findings("fatal"),
     V, ("severity", "'fatal'")),
    # -- BatchSizeSchedule ------------------------------------------------------------------------
    ("schedule-function-int", lambda tmp: BatchSizeSchedule(5), T, ("function", "5")),  # type: ignore[arg-type]
    ("schedule-function-1-arg", lambda tmp: BatchSizeSchedule(lambda e: 1), T, ("function",)),  # type: ignore[arg-type]
    ("schedule-function-3-args", lambda tmp: BatchSizeSchedule(lambda a, b, c: 1), T, ("function",)),  # type: ignore[arg-type]
    ("schedule-function-kw-only", lambda tmp: BatchSizeSchedule(lambda e, *, s: 1), T, ("function",)),  # type: ignore[arg-type]
    ("schedule-function-returns-0", lambda tmp: BatchSizeSchedule(lambda e, s: 0), V, ("function",)),
    ("schedule-function-returns-none", lambda tmp: BatchSizeSchedule(lambda e, s: None), T, ("function", "None")),
    ("schedule-constant-zero", lambda tmp: BatchSizeSchedule.constant(0), V, ("batch_size", "0")),
    ("schedule-constant-bool", lambda tmp: BatchSizeSchedule.constant(True), T, ("batch_size", "True")),
    ("schedule-constant-str", lambda tmp: BatchSizeSchedule.constant("4"), T, ("batch_size", "'4'")),  # type: ignore[arg-type]
    ("schedule-epoch-empty", lambda tmp: BatchSizeSchedule.by_epoch({}), T, ("sizes",)),
    ("schedule-epoch-list", lambda tmp: BatchSizeSchedule.by_epoch([4]), T, ("sizes",)),  # type: ignore[arg-type]
    ("schedule-epoch-none", lambda tmp: BatchSizeSchedule.by_epoch(None), T, ("sizes", "None")),  # type: ignore[arg-type]
    ("schedule-epoch-not-from-0", lambda tmp: BatchSizeSchedule.by_epoch({1: 4}), V, ("sizes",)),
    ("schedule-epoch-size-zero", lambda tmp: BatchSizeSchedule.by_epoch({0: 0}), V, ("sizes",)),
    ("schedule-epoch-key-negative", lambda tmp: BatchSizeSchedule.by_epoch({0: 4, -1: 2}), V, ("sizes",)),
    ("schedule-epoch-key-str", lambda tmp: BatchSizeSchedule.by_epoch({"0": 4}), T, ("sizes", "'0'")),  # type: ignore[dict-item]
    ("schedule-epoch-key-bool", lambda tmp: BatchSizeSchedule.by_epoch({False: 4}), T, ("sizes", "False")),
    ("schedule-epoch-pair-of-1", lambda tmp: BatchSizeSchedule.by_epoch({0: (4,)}), T, ("sizes",)),  # type: ignore[dict-item]
    ("schedule-epoch-payload-mixed", lambda tmp: BatchSizeSchedule.by_epoch({0: 4, 5: (2, "x")}), V, ("sizes",)),
    ("schedule-samples-size-float", lambda tmp: BatchSizeSchedule.by_samples({0: 4, 10: 4.5}), T, ("sizes", "4.5")),  # type: ignore[dict-item]
    ("schedule-samples-key-float", lambda tmp: BatchSizeSchedule.by_samples({0: 4, 0.5: 2}), T, ("sizes", "0.5")),  # type: ignore[dict-item]
    ("schedule-ramp-start-zero", lambda tmp: BatchSizeSchedule.ramp(start=0, end=4, increment=1, over_samples=8), V, ("start", "0")),
    ("schedule-ramp-end-zero", lambda tmp: BatchSizeSchedule.ramp(start=1, end=0, increment=1, over_samples=8), V, ("end", "0")),
    ("schedule-ramp-increment-zero", lambda tmp: BatchSizeSchedule.ramp(start=1, end=4, increment=0, over_samples=8), V, ("increment", "0")),
    ("schedule-ramp-over-negative", lambda tmp: BatchSizeSchedule.ramp(start=1, end=4, increment=1, over_samples=-1), V, ("over_samples", "-1")),
    ("schedule-ramp-end-below-start", lambda tmp: BatchSizeSchedule.ramp(start=8, end=4, increment=1, over_samples=8), V, ("end", "4")),
    ("schedule-ramp-not-multiple", lambda tmp: BatchSizeSchedule.ramp(start=1, end=4, increment=2, over_samples=8), V, ("increment", "2")),
    ("schedule-ramp-start-bool", lambda tmp: BatchSizeSchedule.ramp(start=True, end=4, increment=1, over_samples=8), T, ("start", "True")),
    # -- cache_timeout: one check (_core.errors.check_seconds) for every sampler with a shared index ---
    ("bucket-cache-timeout-negative", _bucket(cache_timeout=-1), V, ("cache_timeout", "-1")),
    ("bucket-cache-timeout-nan", _bucket(cache_timeout=float("nan")), V, ("cache_timeout", "nan")),
    ("bucket-cache-timeout-str", _bucket(cache_timeout="10"), T, ("cache_timeout", "'10'")),
    ("balanced-cache-timeout-negative", _balanced(cache_timeout=-0.5), V, ("cache_timeout", "-0.5")),
    ("balanced-cache-timeout-bool", _balanced(cache_timeout=True), T, ("cache_timeout", "True")),
    ("two-cache-timeout-inf", _two(cache_timeout=float("inf")), V, ("cache_timeout", "inf")),
    ("two-cache-timeout-none", _two(cache_timeout=None), T, ("cache_timeout", "None")),
    ("weighted-cache-timeout-negative", _weighted(cache_timeout=-2), V, ("cache_timeout", "-2")),
    ("weighted-cache-timeout-str", _weighted(cache_timeout="1"), T, ("cache_timeout", "'1'")),
    ("packed-cache-timeout-negative", lambda tmp: PackedBatchSampler([3, 4], max_len=8, rows_per_batch=2,
                                                                      cache_timeout=-1), V, ("cache_timeout", "-1")),
    ("verify-timeout-bool", lambda tmp: shardwise.verify(ZOO, timeout=True), T, ("timeout", "True")),
    # -- provenance and the skip ledger (issue 23) --------------------------------------------------
    ("which-batch-size-missing", lambda tmp: shardwise.which(ShardedSampler(10, num_replicas=2, rank=0), epoch=0,
     step=0), V, ("batch_size", "None")),
    ("which-step-negative", lambda tmp: shardwise.which(ShardedSampler(10, num_replicas=2, rank=0), epoch=0, step=-1,
     batch_size=2), V, ("step", "-1")),
    ("which-rank-too-big", lambda tmp: shardwise.which(ShardedSampler(10, num_replicas=2, rank=0), epoch=0, step=0,
     rank=2, batch_size=2), V, ("rank", "2")),
    ("which-not-shardwise", lambda tmp: shardwise.which(SequentialSampler(range(3)), epoch=0, step=0), T,
     ("sampler", "SequentialSampler")),
    ("when-index-bool", lambda tmp: shardwise.when(ShardedSampler(10, num_replicas=2, rank=0), True, epochs=0,
     batch_size=2), T, ("index", "True")),
    ("skip-steps-empty", lambda tmp: shardwise.skip_steps(ShardedSampler(10, num_replicas=2, rank=0), epoch=0,
     steps=range(0), batch_size=2), V, ("steps", "range(0, 0)")),
    ("rebase-state-not-a-state", lambda tmp: shardwise.rebase_state("x", ShardedSampler(10, num_replicas=2, rank=0)),
     V, ("state", "'x'")),
    ("skip-positions-stop-before-first", lambda tmp: ShardedSampler(10, num_replicas=2, rank=0).skip_positions(0, 5, 3),
     V, ("stop", "3")),
    ("skip-ids-stop-not-after-first", lambda tmp: ShardedSampler(10, num_replicas=2, rank=0).skip_ids(5, 5), V,
     ("stop", "5")),
    ("skip-ids-first-bool", lambda tmp: ShardedSampler(10, num_replicas=2, rank=0).skip_ids(True, 5), T,
     ("first", "True")),
    ("skip-ids-out-of-range", lambda tmp: ShardedSampler(10, num_replicas=2, rank=0).skip_ids(8, 12), V,
     ("sample ids", "[0, 9]")),
    # -- sharded sources (issue 22) -------------------------------------------------------------------
    ("locality-window-zero", lambda tmp: shardwise.LocalitySampler([3, 4], window=0), V, ("window", "0")),
    ("locality-mixing-unknown", lambda tmp: shardwise.LocalitySampler([3, 4], mixing="stream"), V,
     ("mixing", "'stream'", "'streams'")),
    ("locality-sizes-negative", lambda tmp: shardwise.LocalitySampler([3, -4]), V, ("dataset[1]", "-4")),
    ("locality-sizes-str", lambda tmp: shardwise.LocalitySampler("abc"), T, ("dataset", "'abc'")),
    ("locality-shuffle-str", lambda tmp: shardwise.LocalitySampler([3, 4], shuffle="yes"), T, ("shuffle", "'yes'")),
    ("locality-partitions-zero", lambda tmp: shardwise.LocalitySampler([3, 4], partitions=0), V, ("partitions", "0")),
    ("locality-ranks-per-partition-bool", lambda tmp: shardwise.LocalitySampler([3, 4], partitions=2,
     ranks_per_partition=True), T, ("ranks_per_partition", "True")),
    ("source-open-shards-zero", lambda tmp: shardwise.ShardedSource([str(tmp / "absent.parquet")], open_shards=0), V,
     ("open_shards", "0")),
    ("source-length-column-int", lambda tmp: shardwise.ShardedSource([str(tmp / "absent.parquet")], length_column=3),
     T, ("length_column", "3")),
    ("source-urls-int", lambda tmp: shardwise.ShardedSource(5), T, ("urls", "5")),
    ("source-urls-empty", lambda tmp: shardwise.ShardedSource([]), V, ("urls", "[]")),
    ("source-format-csv", lambda tmp: shardwise.ShardedSource(["a.parquet"], format="csv"), V, ("format", "'csv'")),
    ("source-output-format-np", lambda tmp: shardwise.ShardedSource(["a.parquet"], output_format="np"), V,
     ("output_format", "'np'")),
    ("source-decode-gpu", lambda tmp: shardwise.ShardedSource(["a.parquet"], decode="gpu"), V, ("decode", "'gpu'")),
    ("shard-cache-budget-negative", lambda tmp: shardwise.ShardCache(tmp, budget_bytes=-1), V, ("budget_bytes", "-1")),
    ("shard-cache-retries-negative", lambda tmp: shardwise.ShardCache(tmp, retries=-1), V, ("retries", "-1")),
    ("shard-cache-backoff-negative", lambda tmp: shardwise.ShardCache(tmp, backoff=-1.0), V, ("backoff", "-1.0")),
    ("shard-cache-directory-int", lambda tmp: shardwise.ShardCache(3), T, ("directory", "3")),
    ("shard-cache-prefetch-threads-negative", lambda tmp: shardwise.ShardCache(tmp, prefetch_threads=-1), V,
     ("prefetch_threads", "-1")),
    ("shard-cache-prefetch-threads-float", lambda tmp: shardwise.ShardCache(tmp, prefetch_threads=2.0), T,
     ("prefetch_threads", "2.0")),
]


PREFIXES = {
    "sharded": "ShardedSampler", "shard": "shard", "shard-batches": "shard_batches", "wrapper": "ShardedWrapper",
    "batch-wrapper": "ShardedBatchWrapper", "bucket": "BucketBatchSampler", "balanced": "ClassBalancedBatchSampler",
    "two": "TwoStreamBatchSampler", "weighted": "WeightedSampler", "scheduled": "ScheduledBatchSampler",
    "schedule": "BatchSizeSchedule", "pad": "pad_collate", "collate": "PadCollate", "writer": "RaggedWriter",
    "array": "RaggedArray", "set-epoch": "set_epoch", "sampler": "ShardedSampler", "worker-seed": "worker_seed",
    "seed-worker": "seed_worker", "state": "ShardedSampler", "mixture": "MixtureSampler",
    "adaptive": "AdaptiveWeights", "exp3": "Exp3", "exp-gradient": "ExponentiatedGradient",
    "mixture-datasets": "Mixture", "weight-schedule": "WeightSchedule", "temperature": "temperature_weights",
    "verify": "verify", "verify-report": "VerifyReport",
    "packed": "PackedBatchSampler", "packed-mixture": "PackedMixtureSampler", "pack-collate": "pack_collate", "packcollate": "PackCollate",
    "packed-dataset": "PackedDataset", "packed-index": "PackedIndex",
    "column": "column",
    "which": "which", "when": "when", "skip-steps": "skip_steps", "skip-positions": "ShardedSampler", "skip-ids": "ShardedSampler",
    "rebase-state": "rebase_state",
    "locality": "LocalitySampler", "source": "ShardedSource", "shard-cache": "ShardCache",
}
# Enums, exceptions and results: nothing to pass badly (the enums' values are rows of the samplers).
NOTHING_TO_PASS = {"BatchOrder", "Even", "MixtureStop", "Oversized", "SmallClasses", "MalformedStateError", "StateMismatchError",
                   "RaggedStoreError", "PaddedBatch", "worker_seeds", "__version__", "TooLong", "PackedSample",
                   "PackedBatch", "ProvenanceUnsupported", "Trained", "TrainedBatch", "ShardError",
                   "PendingWeightsError", "PolicyStep", "SourceStatistics", "WeightLedger"}  # fmt: skip


def _public_name(row_id: str) -> str:
    prefix = max((p for p in PREFIXES if row_id.startswith(p + "-")), key=len)
    return PREFIXES[prefix]


def test_the_table_has_150_rows_covering_every_public_name() -> None:
    """At least 150 rows with unique ids, and rows for every public name that takes arguments."""
    ids = [row[0] for row in ROWS + DATA_ROWS]
    assert len(ids) == len(set(ids)) >= 150
    covered = {_public_name(row_id) for row_id in ids}
    assert covered == set(shardwise.__all__) - NOTHING_TO_PASS


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("call", "error", "names"), [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_bad_input_raises_naming_the_parameter(tmp_path: Path, call: Call, error: type, names: tuple[str, ...]) -> None:
    """The call raises the expected exception type, and its message names the parameter (and value)."""
    check_row(tmp_path, call, error, names)
