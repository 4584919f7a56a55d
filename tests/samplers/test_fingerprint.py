"""The data fingerprint: a state loaded onto other data of the same size is refused, naming what differs."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import RandomSampler

import shardwise
from shardwise import RaggedArray, StateMismatchError

N = 24
LENGTHS = np.arange(N) % 7 + 1
LABELS = np.arange(N) % 3


def _stores(tmp_path: Path) -> tuple[RaggedArray, RaggedArray]:
    """Two stores of N samples each, other contents."""
    return tuple(  # type: ignore[return-value]
        RaggedArray.write(tmp_path / f"store-{name}", [np.full((2, 1), i + shift, np.int32) for i in range(N)])
        for name, shift in (("a", 0), ("b", 1))
    )


def _sources(tmp_path: Path) -> tuple[Any, Any]:
    """Two ShardedSources of local Parquet shards, the same sizes, other files."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    made = []
    for name in ("a", "b"):
        (tmp_path / f"shards-{name}").mkdir()
        for shard in range(2):
            pq.write_table(pa.table({"id": np.arange(N // 2) + shard * 100 + (name == "b")}), tmp_path / f"shards-{name}" / f"{shard}.parquet")
        made.append(shardwise.ShardedSource(sorted(str(p) for p in (tmp_path / f"shards-{name}").glob("*.parquet")),
                                            index_dir=tmp_path / "index"))  # fmt: skip
    return made[0], made[1]


def _other(array: Any, v: int) -> Any:
    """Data a (``v=0``) or other data of the same size (``v=1``): the array reversed."""
    return array if v == 0 else np.asarray(array)[::-1].copy()


# (kind, build(v, stores, sources) -> sampler over data a (v=0) or b (v=1), the field that must be named)
OTHER_DATA: list[tuple[str, Callable[[int, Any, Any], Any], str]] = [
    ("ShardedSampler over RaggedArray", lambda v, st, so: shardwise.ShardedSampler(st[v]), "dataset"),
    ("ShardedSampler over ShardedSource", lambda v, st, so: shardwise.ShardedSampler(so[v]), "dataset"),
    ("LocalitySampler over ShardedSource", lambda v, st, so: shardwise.LocalitySampler(so[v]), "dataset"),
    ("ScheduledBatchSampler over RaggedArray",
     lambda v, st, so: shardwise.ScheduledBatchSampler(st[v], batch_size=4), "dataset"),
    ("shard() of a RandomSampler over RaggedArray", lambda v, st, so: shardwise.shard(RandomSampler(st[v])), "dataset"),
    ("MixtureSampler over a RaggedArray", lambda v, st, so: shardwise.MixtureSampler(
        shardwise.Mixture({"web": st[v], "code": range(N)}), [0.5, 0.5], num_samples=N), "dataset"),
    ("WeightedSampler", lambda v, st, so: shardwise.WeightedSampler(_other(LENGTHS, v), num_samples=N),
     "weights_digest"),
    ("BucketBatchSampler", lambda v, st, so: shardwise.BucketBatchSampler(_other(LENGTHS, v), batch_size=4), "lengths"),
    ("PackedBatchSampler", lambda v, st, so: shardwise.PackedBatchSampler(_other(LENGTHS, v), max_len=8,
                                                                         rows_per_batch=2), "lengths"),
    ("ClassBalancedBatchSampler", lambda v, st, so: shardwise.ClassBalancedBatchSampler(
        _other(LABELS, v), classes_per_batch=2, samples_per_class=2), "labels_digest"),
    ("TwoStreamBatchSampler", lambda v, st, so: shardwise.TwoStreamBatchSampler(
        range(v, 8 + v), range(12, N), primary_batch_size=2, secondary_batch_size=2), "primary_digest"),
]  # fmt: skip


@pytest.fixture
def data(tmp_path: Path) -> tuple[tuple[RaggedArray, RaggedArray], tuple[Any, Any]]:
    return _stores(tmp_path), _sources(tmp_path)


@pytest.mark.parametrize(("kind", "build", "field"), OTHER_DATA, ids=[row[0] for row in OTHER_DATA])
def test_state_of_other_data_of_the_same_size_is_refused_naming_the_field(
    kind: str, build: Callable[[int, Any, Any], Any], field: str, data: Any
) -> None:
    """Every sampler kind: a state saved over data a, loaded over data b of the same size, names the field."""
    stores, sources = data
    state = build(0, stores, sources).state_dict()
    build(0, stores, sources).load_state_dict(state)  # the same data loads
    other = build(1, stores, sources)
    with pytest.raises(StateMismatchError, match=rf"state was saved for {field}=.*rebase_state"):
        other.load_state_dict(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.load_state_dict(shardwise.rebase_state(state, other))  # the documented override
    assert any(field in str(w.message) for w in caught), kind


def test_mixture_sources_swapped_with_the_same_sizes_are_refused_naming_names() -> None:
    """A mixture of named sources: the same sizes under other names (or swapped) is other data."""
    state = shardwise.MixtureSampler(shardwise.Mixture({"web": range(10), "code": range(10)}), [0.7, 0.3]).state_dict()
    swapped = shardwise.MixtureSampler(shardwise.Mixture({"code": range(10), "web": range(10)}), [0.7, 0.3])
    with pytest.raises(StateMismatchError, match=r"state was saved for names=\['web', 'code'\]"):
        swapped.load_state_dict(state)


def test_a_state_without_the_new_fields_loads_with_a_logged_warning(data: Any, caplog: Any) -> None:
    """A state saved before the dataset field (or over data without one) still loads; the log says it was not checked."""
    store_a = data[0][0]
    sampler = shardwise.ShardedSampler(store_a, num_replicas=1, rank=0)
    old = sampler.state_dict()
    del old["fingerprint"]["dataset"]
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        sampler.load_state_dict(old)
        shardwise.ShardedSampler(N).load_state_dict(sampler.state_dict())  # a length: nothing to check against
    assert "state was saved without dataset" in caplog.text
    assert "which this sampler's data does not have" in caplog.text


def test_a_plain_dataset_has_no_fingerprint_beyond_its_size() -> None:
    """Documented limit: a plain torch dataset records only its size, so another one of the same size loads."""
    state = shardwise.ShardedSampler(list(range(N))).state_dict()
    assert "dataset" not in state["fingerprint"]
    shardwise.ShardedSampler(list(range(100, 100 + N))).load_state_dict(state)
