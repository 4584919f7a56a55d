"""Many nodes over shard partitions (NOTE [ Shard partitions ]): real gloo ranks, a real S3 server on 127.0.0.1.

Two "nodes" of two ranks each are simulated on this machine: ranks ``2k`` and ``2k + 1`` share the
node cache directory ``node{k}``, as a node's ranks share its local disk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from shardwise.data.sharded import ShardCache, ShardedSource
from shardwise.samplers.locality import LocalitySampler
from shardwise.tools.launch import run_distributed
from tests.data.shards import put_parquet_shards
from tests.s3_server import make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# 13 uneven shards with a one-row and an empty one: the greedy layout must split one to balance.
SIZES = [40, 1, 33, 27, 0, 45, 18, 36, 29, 22, 41, 15, 30]
TOTAL = sum(SIZES)
BUCKET = "parts"
G = 2  # ranks per node
P = 2  # partitions: one per node


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The endpoint, with the shards as Parquet files under s3://parts/."""
    local = tmp_path_factory.mktemp("shards")
    with s3_endpoint() as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        put_parquet_shards(fs, local, f"{BUCKET}/shard-{{s:02d}}.parquet", SIZES,
                           lambda first, size: pa.table({"id": np.arange(first, first + size), "text": ["x" * 200] * size}))
        yield {"endpoint": endpoint, "index": str(local / "index")}


def _source(endpoint: str, index: str, cache_dir: Path) -> ShardedSource:
    cache = ShardCache(cache_dir, storage_options=storage_options(endpoint))
    return ShardedSource(f"s3://{BUCKET}/", cache=cache, index_dir=index)


def _node_main(rank: int, world_size: int, endpoint: str, index: str, root: str, partitions: int, epochs: int,
               steps: int, state: Any, drop_last: bool) -> dict[str, Any]:  # fmt: skip
    node = rank // G
    source = _source(endpoint, index, Path(root) / f"node{node}")
    sampler = LocalitySampler(source, window=2, partitions=partitions, ranks_per_partition=G, seed=4,
                              drop_last=drop_last)  # fmt: skip
    if state is not None:
        sampler.load_state_dict(state)
    loader = DataLoader(source, sampler=sampler, batch_size=3)
    ids: list[list[int]] = []
    fetched: list[int] = []
    for _ in range(epochs):
        ids.append([])
        for received, batch in enumerate(loader, start=1):
            ids[-1].extend(int(i) for i in batch["id"])
            if received == steps:
                break
        source.cache.close()  # the prefetch thread finishes what it queued: all of it is counted
        fetched.append(source.cache.fetched_bytes - sum(fetched))
    return {"node": node, "ids": ids, "fetched": fetched, "state": sampler.state_dict()}


def _layout(s3: dict[str, Any], tmp_path: Path) -> tuple[ShardedSource, Any]:
    source = _source(s3["endpoint"], s3["index"], tmp_path / "probe")
    layout = LocalitySampler(source, window=2, partitions=P, ranks_per_partition=G, seed=4,
                             num_replicas=1, rank=0).partition_layout()  # fmt: skip
    return source, layout


# The 4-rank runs of the tests below, (partitions, epochs, steps, drop_last) each: one start of the 4 ranks runs them
# in turn, each in its own folder (its own 2 node caches).
FOUR_RANKS = {"only": (P, 2, 0, True), "padding": (P, 2, 0, False), "one": (1, 1, 0, True), "resume": (P, 1, 7, False)}


def _runs_main(rank: int, world_size: int, endpoint: str, index: str, runs: dict[str, tuple[str, int, int, int, bool]]
               ) -> dict[str, dict[str, Any]]:  # fmt: skip
    return {name: _node_main(rank, world_size, endpoint, index, root, partitions, epochs, steps, None, drop_last)
            for name, (root, partitions, epochs, steps, drop_last) in runs.items()}  # fmt: skip


@pytest.fixture(scope="module")
def four(s3: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Per run of FOUR_RANKS, what each of the 4 ranks (2 nodes) returned."""
    runs = {name: (str(tmp_path_factory.mktemp(f"four-{name}")), *run) for name, run in FOUR_RANKS.items()}
    ranks = run_distributed(_runs_main, 4, s3["endpoint"], s3["index"], runs, timeout=300)
    return {name: [rank[name] for rank in ranks] for name in FOUR_RANKS}


def test_each_node_fetches_only_its_partition(s3: dict[str, Any], four: dict[str, Any], tmp_path: Path) -> None:
    """4 ranks as 2 nodes, P=2, G=2: each node fetches exactly its partition's shards, once; the next epoch nothing."""
    source, layout = _layout(s3, tmp_path)
    reports = four["only"]
    partition_bytes = layout.shard_bytes(source.file_sizes)
    total = int(source.file_sizes.sum())
    for node in range(2):
        first_epoch = sum(r["fetched"][0] for r in reports if r["node"] == node)
        assert first_epoch == partition_bytes[node]  # its shards, each once, nothing of the other node's
        assert sum(r["fetched"][1] for r in reports if r["node"] == node) == 0  # the layout is fixed across epochs
        share = total * layout.quotas[node] / TOTAL
        assert first_epoch < share + int(source.file_sizes.max())  # the split shard is the only excess
    for epoch in range(2):
        seen = Counter(i for r in reports for i in r["ids"][epoch])
        assert max(seen.values()) == 1 and TOTAL - len(seen) < 4  # drop_last leaves out at most W - 1


def test_padding_fetches_nothing_of_another_partition(s3: dict[str, Any], four: dict[str, Any], tmp_path: Path) -> None:
    """drop_last=False, 337 samples at W=4: the 3 padded samples wrap within each rank's partition, so each node
    still fetches exactly its partition's shards (before the partition-local wrap, one more shard of the other's)."""
    source, layout = _layout(s3, tmp_path)
    reports = four["padding"]
    partition_bytes = layout.shard_bytes(source.file_sizes)
    for node in range(2):
        assert sum(r["fetched"][0] for r in reports if r["node"] == node) == partition_bytes[node]
        assert sum(r["fetched"][1] for r in reports if r["node"] == node) == 0
        ids = [i for r in reports if r["node"] == node for i in r["ids"][0]]
        assert set(layout.locals_of(np.asarray(ids))[0].tolist()) == {node}
    for epoch in range(2):
        seen = Counter(i for r in reports for i in r["ids"][epoch])
        assert set(seen) == set(range(TOTAL)) and sum(seen.values()) - TOTAL == 4 - TOTAL % 4  # padding only


def test_one_partition_fetches_everything_on_every_node(s3: dict[str, Any], four: dict[str, Any], tmp_path: Path) -> None:
    """The baseline: with partitions=1 the same 2 nodes each fetch every shard their ranks read (drop_last: nearly all)."""
    source, _ = _layout(s3, tmp_path)
    reports = four["one"]
    for node in range(2):
        read = {source.shard_of(i) for r in reports for i in r["ids"][0]}  # the dropped tail may hold a whole shard
        assert len(read) >= len(SIZES) - 1
        assert sum(r["fetched"][0] for r in reports if r["node"] == node) == int(source.file_sizes[sorted(read)].sum())


def test_exact_resume_from_four_ranks_to_two(s3: dict[str, Any], four: dict[str, Any], tmp_path: Path) -> None:
    """4 ranks stop after 7 steps; 2 ranks (one node) resume from the state: nothing lost, nothing repeated."""
    first = four["resume"]
    state = first[0]["state"]
    assert all(r["state"] == state for r in first)
    assert state["consumed"] == 7 * 3 * 4
    assert state["fingerprint"]["partitions"] == P and state["fingerprint"]["ranks_per_partition"] == G
    second = run_distributed(_node_main, 2, s3["endpoint"], s3["index"], str(tmp_path / "b"), P, 1, 0, state, False,
                             timeout=300)  # fmt: skip
    seen = Counter(i for r in first + second for i in r["ids"][0])
    assert set(seen) == set(range(TOTAL))
    assert sum(seen.values()) - TOTAL < 2  # only the padding of the last step at W=2 repeats


def test_resume_needs_the_same_partitions(s3: dict[str, Any], tmp_path: Path) -> None:
    """A state saved with partitions=2 is refused by a sampler with partitions=1, naming the field."""
    from shardwise import StateMismatchError

    sizes = np.asarray(SIZES)
    saved = LocalitySampler(sizes, partitions=2, ranks_per_partition=2, num_replicas=1, rank=0, seed=1).state_dict()
    with pytest.raises(StateMismatchError, match="partitions"):
        LocalitySampler(sizes, num_replicas=1, rank=0, seed=1).load_state_dict(saved)
