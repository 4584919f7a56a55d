"""PackedMixtureSampler over ShardedSources: each source's lengths from its shards' index, rows read from the shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardwise
from shardwise.data.sharded import ShardCache, ShardedSource
from tests.data.shards import write_shards

pa = pytest.importorskip("pyarrow")


def _tokens(source: int) -> Any:
    def table(first: int, count: int) -> Any:
        ids = np.arange(first, first + count)
        tokens = [[int(1000 * source + i)] * int(5 + (i * 7) % (30 * (source + 1))) for i in ids]
        return pa.table({"id": ids, "text": ["w"] * count, "tokens": tokens})

    return table


def test_sharded_sources_mix_in_tokens_and_batches_read_their_pieces(tmp_path: Path) -> None:
    sources = []
    for number, sizes in enumerate(([30, 11, 25], [9, 14])):
        (tmp_path / f"s{number}").mkdir()
        paths = write_shards(tmp_path / f"s{number}", sizes, _tokens(number))["parquet"]
        sources.append(ShardedSource([str(p) for p in paths], cache=ShardCache(tmp_path / f"cache{number}"),
                                     index_dir=tmp_path / f"index{number}", length_column="tokens"))  # fmt: skip
    sampler = shardwise.PackedMixtureSampler(sources, [0.6, 0.4], max_len=64, rows_per_batch=2, num_batches=12,
                                             seed=3, num_replicas=1, rank=0)  # fmt: skip
    assert sampler.source_tokens == [int(s.lengths.sum()) for s in sources]  # the shards' index, not a pass over rows
    data = shardwise.PackedDataset(shardwise.Mixture(sources), field="tokens")
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=shardwise.PackCollate(max_len=64, rows=2))
    for plan_batch, batch in zip(sampler, loader, strict=True):
        assert int((batch.sample_ids >= 0).sum()) == 128  # two full rows
        per_source = np.zeros(2, dtype=np.int64)
        for piece in plan_batch:
            per_source[0 if int(piece) < len(sources[0]) else 1] += piece.stop - piece.start
        assert abs(per_source[0] - 0.6 * 128) < 2 and per_source.sum() == 128
        # every token holds its document's id: the pieces were read from the right rows of the right shards
        ids = batch.input_ids[batch.sample_ids >= 0]
        samples = batch.sample_ids[batch.sample_ids >= 0]
        offsets = np.asarray([0, len(sources[0])])
        source_of = (samples.numpy() >= len(sources[0])).astype(int)
        assert (ids.numpy() == 1000 * source_of + samples.numpy() - offsets[source_of]).all()


def test_a_sharded_source_without_lengths_is_refused_naming_length_column(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, [5], _tokens(0))["parquet"]
    source = ShardedSource([str(p) for p in paths], cache=ShardCache(tmp_path / "cache"), index_dir=tmp_path / "i")
    with pytest.raises(ValueError, match="length_column"):
        shardwise.PackedMixtureSampler([source, [5, 6]], [1, 1], max_len=8, rows_per_batch=2)
