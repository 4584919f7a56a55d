"""Sharded sources against a real S3 endpoint (moto's server on 127.0.0.1): formats, samplers, ranks, failures."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from filelock import FileLock
from torch.utils.data import DataLoader

from shardwise import BucketBatchSampler, ShardedSampler
from shardwise.data.sharded import ShardCache, ShardedSource, ShardError
from shardwise.samplers.locality import LocalitySampler
from shardwise.tools.launch import run_distributed
from tests.data.shards import write_shards
from tests.s3_server import make_bucket, s3_endpoint, storage_options

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SIZES = [37, 5, 60, 23, 41, 12, 50]  # 7 uneven shards: 7 % 3 and 7 % 4 are not 0
TOTAL = sum(SIZES)
BUCKET = "data"


def _table(first: int, count: int) -> Any:
    ids = np.arange(first, first + count)
    return pa.table({"id": ids, "text": ["w" * int(i % 17 + 1) for i in ids], "label": ids % 3})


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The endpoint, with the same samples as Parquet, Arrow IPC (file format and HF save_to_disk) and WebDataset shards."""
    import datasets

    local = tmp_path_factory.mktemp("shards")
    with s3_endpoint() as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        for suffix, paths in write_shards(local, SIZES, _table).items():
            for s, path in enumerate(paths):
                fs.put(str(path), f"{BUCKET}/{suffix}/shard-{s:02d}.{suffix}")
        datasets.Dataset.from_dict(_table(0, TOTAL).to_pydict()).save_to_disk(str(local / "hf"), num_shards=3)
        fs.put(str(local / "hf"), f"{BUCKET}/hf", recursive=True)
        yield {"endpoint": endpoint, "fs": fs, "local": local}


def _source(s3: dict[str, Any], tmp_path: Path, prefix: str, **kwargs: Any) -> ShardedSource:
    cache = kwargs.pop("cache", None) or ShardCache(tmp_path / "cache", storage_options=storage_options(s3["endpoint"]))
    return ShardedSource(f"s3://{BUCKET}/{prefix}/", cache=cache, index_dir=tmp_path / "index", **kwargs)


@pytest.mark.parametrize("prefix", ["parquet", "arrow", "hf"])
def test_columnar_shards_serve_every_sample_by_global_id(s3: dict[str, Any], tmp_path: Path, prefix: str) -> None:
    """Parquet, Arrow IPC and an HF save_to_disk folder on S3: counts from metadata, row i holds id i."""
    source = _source(s3, tmp_path, prefix, length_column="text", label_column="label")
    assert len(source) == TOTAL
    if prefix != "hf":
        assert source.shard_sizes.tolist() == SIZES
    assert source.lengths is not None and source.labels is not None
    np.testing.assert_array_equal(source.lengths, np.arange(TOTAL) % 17 + 1)
    np.testing.assert_array_equal(source.labels, np.arange(TOTAL) % 3)
    sampler = LocalitySampler(source, window=2, num_replicas=1, rank=0, seed=3)
    ids = list(sampler)
    assert sorted(ids) == list(range(TOTAL))
    assert [source[i]["id"] for i in ids] == ids


def test_webdataset_shards(s3: dict[str, Any], tmp_path: Path) -> None:
    """WebDataset tars: one sample per key, counted from member names; labels from the .cls members."""
    source = _source(s3, tmp_path, "tar", label_column="cls")
    assert source.shard_sizes.tolist() == SIZES
    np.testing.assert_array_equal(source.labels, np.arange(TOTAL) % 3)
    assert source[100] == {"__key__": "s000100", "cls": b"1", "txt": b"w" * (100 % 17 + 1)}


def test_metadata_is_cached_and_keyed_by_etag(s3: dict[str, Any], tmp_path: Path) -> None:
    """A second source reuses the index entry; a rewritten shard (new ETag) is counted again."""
    fs = s3["fs"]
    for s in range(2):
        fs.put(str(s3["local"] / f"{s}.parquet"), f"{BUCKET}/etag/{s}.parquet")
    assert _source(s3, tmp_path, "etag").shard_sizes.tolist() == SIZES[:2]
    _source(s3, tmp_path, "etag")
    assert len([name for name in os.listdir(tmp_path / "index") if not name.startswith(".")]) == 1
    fs.put(str(s3["local"] / "2.parquet"), f"{BUCKET}/etag/1.parquet")
    assert _source(s3, tmp_path, "etag").shard_sizes.tolist() == [SIZES[0], SIZES[2]]


def test_other_samplers_work_over_the_source(s3: dict[str, Any], tmp_path: Path) -> None:
    """ShardedSampler and BucketBatchSampler (over the length column) index the source unchanged."""
    source = _source(s3, tmp_path, "parquet", length_column="text")
    loader = DataLoader(source, sampler=ShardedSampler(source, num_replicas=2, rank=1, seed=0), batch_size=8)
    rows = [int(i) for batch in loader for i in batch["id"]]
    assert len(rows) == TOTAL // 2 and len(set(rows)) == TOTAL // 2
    assert source.lengths is not None
    buckets = BucketBatchSampler(source.lengths, max_tokens=64, num_replicas=1, rank=0, seed=0)
    for batch in buckets:
        assert sum(len(source[i]["text"]) for i in batch) <= 64


def _ranks_main(
    rank: int, world_size: int, endpoint: str, root: str, steps: int, state: Any, workers: int,
    mixing: str = "windows",
) -> dict[str, Any]:
    cache = ShardCache(Path(root) / "cache", storage_options=storage_options(endpoint))
    source = ShardedSource(f"s3://{BUCKET}/parquet/", cache=cache, index_dir=Path(root) / "index")
    sampler = LocalitySampler(source, window=3, mixing=mixing, seed=5)
    if state is not None:
        sampler.load_state_dict(state)
    context = "spawn" if workers else None
    loader = DataLoader(source, sampler=sampler, batch_size=4, num_workers=workers, multiprocessing_context=context)
    ids: list[int] = []
    received = 0
    for batch in loader:
        ids.extend(int(i) for i in batch["id"])
        received += 1
        if received == steps:
            break
    return {"ids": ids, "steps": received, "len": len(loader), "state": sampler.state_dict()}


def _runs_main(rank: int, world_size: int, endpoint: str, runs: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """_ranks_main of every (root, steps, state, workers, mixing) of ``runs``, in turn."""
    return [_ranks_main(rank, world_size, endpoint, *run) for run in runs]


@pytest.fixture(scope="module")
def ranks(s3: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The runs of the two tests below, per world size one start of the ranks: on 3, test_equal_steps_on_every_rank[3]
    then the resume's first job (5 steps, 2 workers, staggered streams); on 4, test_equal_steps_on_every_rank[4] then
    the resume from rank 0's state. Each equal-steps run has a folder (cache and index) of its own; the resume's
    two jobs share theirs."""
    equal = {w: str(tmp_path_factory.mktemp(f"equal{w}")) for w in (3, 4)}
    resume = str(tmp_path_factory.mktemp("resume"))
    mixing = "streams"
    three = run_distributed(_runs_main, 3, s3["endpoint"], [(equal[3], 0, None, 0), (resume, 5, None, 2, mixing)],
                            timeout=240)  # fmt: skip
    state = three[0][1]["state"]
    four = run_distributed(_runs_main, 4, s3["endpoint"], [(equal[4], 0, None, 0), (resume, 0, state, 0, mixing)],
                           timeout=240)  # fmt: skip
    return {"equal3": [r[0] for r in three], "equal4": [r[0] for r in four], "first": [r[1] for r in three],
            "second": [r[1] for r in four]}  # fmt: skip


@pytest.mark.parametrize("world_size", [3, 4])
def test_equal_steps_on_every_rank(ranks: dict[str, list[dict[str, Any]]], world_size: int) -> None:
    """Real gloo ranks over 7 uneven shards on S3: every rank takes the same number of steps; every sample is read."""
    reports = ranks[f"equal{world_size}"]
    assert len({r["len"] for r in reports}) == 1
    assert len({r["steps"] for r in reports}) == 1 and reports[0]["steps"] == reports[0]["len"]
    seen = Counter(i for r in reports for i in r["ids"])
    assert set(seen) == set(range(TOTAL))
    assert sum(seen.values()) - TOTAL < world_size  # only the padding of the last step repeats


def test_exact_resume_at_another_world_size(ranks: dict[str, list[dict[str, Any]]]) -> None:
    """3 ranks stop after 5 steps with workers; 4 ranks resume from rank 0's state: nothing lost or repeated.

    With staggered streams (the window plan resumes 4 -> 2 on real ranks in test_sharded_partitions).
    """
    first, second = ranks["first"], ranks["second"]
    state = first[0]["state"]
    assert all(r["state"] == state for r in first)
    assert state["consumed"] == 5 * 4 * 3
    seen = Counter(i for r in first + second for i in r["ids"])
    assert set(seen) == set(range(TOTAL))
    assert sum(seen.values()) - TOTAL < 4


def test_shard_missing_mid_epoch_names_url_and_sample(s3: dict[str, Any], tmp_path: Path) -> None:
    """A shard deleted after the index was built: reading its sample raises naming the URL and the sample id."""
    fs = s3["fs"]
    for s in range(3):
        fs.put(str(s3["local"] / f"{s}.parquet"), f"{BUCKET}/gone/{s}.parquet")
    source = _source(s3, tmp_path, "gone")
    assert source[0]["id"] == 0
    fs.rm(f"{BUCKET}/gone/1.parquet")
    with pytest.raises(ShardError, match=rf"s3://{BUCKET}/gone/1.parquet \(needed for sample 40\) does not exist"):
        source[40]


def test_corrupt_parquet_footer_is_a_clear_error(s3: dict[str, Any], tmp_path: Path) -> None:
    """A shard with a garbled footer fails at construction (metadata), or garbled after indexing at read, naming the URL."""
    fs = s3["fs"]
    data = (s3["local"] / "0.parquet").read_bytes()
    fs.pipe(f"{BUCKET}/corrupt/a.parquet", data[:-12] + b"\0" * 12)
    with pytest.raises(ShardError, match=rf"metadata of shard s3://{BUCKET}/corrupt/a.parquet as parquet"):
        _source(s3, tmp_path, "corrupt")
    fs.pipe(f"{BUCKET}/corrupt/a.parquet", data)
    source = _source(s3, tmp_path, "corrupt")
    fs.pipe(f"{BUCKET}/corrupt/a.parquet", data[:-12] + b"\0" * 12)  # same size, new content, after indexing
    with pytest.raises(ShardError, match=rf"shard s3://{BUCKET}/corrupt/a.parquet \(needed for sample 3\) changed"):
        source[3]


def _fetch(directory: str, endpoint: str, url: str, size: int) -> None:
    ShardCache(directory, storage_options=storage_options(endpoint)).path(url, size)


def test_killed_download_never_becomes_visible(s3: dict[str, Any], tmp_path: Path) -> None:
    """A download killed halfway leaves only a temporary file; the next fetch replaces it with the whole shard."""
    payload = np.random.default_rng(0).bytes(48 << 20)
    url = f"s3://{BUCKET}/big/blob.parquet"
    s3["fs"].pipe(url, payload)
    cache_dir = tmp_path / "cache"
    cache = ShardCache(cache_dir, storage_options=storage_options(s3["endpoint"]))
    final = cache_dir / cache.name(url)
    process = mp.get_context("spawn").Process(target=_fetch, args=(str(cache_dir), s3["endpoint"], url, len(payload)))
    process.start()
    deadline = time.monotonic() + 60
    while not any(cache_dir.glob("*.part*")) and process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.kill()
    process.join(10)
    assert any(cache_dir.glob("*.part*")), "the download finished before it could be killed"
    assert not final.exists()
    assert Path(cache.path(url, len(payload))).read_bytes() == payload
    assert not any(cache_dir.glob("*.part*"))


def test_a_held_lock_is_a_timeout_not_a_hang(s3: dict[str, Any], tmp_path: Path) -> None:
    """Another process stuck holding a shard's download lock: the fetch gives up after `timeout`, naming the lock."""
    cache = ShardCache(tmp_path, timeout=0.5, storage_options=storage_options(s3["endpoint"]))
    url = f"s3://{BUCKET}/parquet/shard-00.parquet"
    with FileLock(str(tmp_path / cache.name(url)) + ".lock"):
        started = time.monotonic()
        with pytest.raises(ShardError, match=r"for more than 0\.5 s; raise ShardCache"):
            cache.path(url, 1, sample=7)
        assert time.monotonic() - started < 10


def _kept(directory: Path) -> dict[str, int]:
    """What a cache directory holds: ``{file name: bytes}`` of its whole files (no locks, no temporary files)."""
    kept: dict[str, int] = {}
    if not directory.exists():
        return kept
    for path in directory.iterdir():  # a prefetch thread may evict a file between listing and stat
        if path.suffix != ".lock" and ".part" not in path.name and not path.name.startswith("."):
            with contextlib.suppress(FileNotFoundError):
                kept[path.name] = path.stat().st_size
    return kept


@pytest.mark.parametrize("decode", ["node", "worker"])
def test_prefetch_in_plan_order_within_budget(s3: dict[str, Any], tmp_path: Path, decode: str) -> None:
    """LocalitySampler tells the cache what comes next: shards arrive ahead of reads, and the cache stays in budget.

    decode="node": the cache keeps each shard decoded (an Arrow file, larger than the Parquet); the budget counts it.
    """
    plain = _source(s3, tmp_path, "parquet", decode=decode)
    for first_id in np.cumsum(plain.shard_sizes) - plain.shard_sizes:
        plain[int(first_id)]  # every shard in the default cache, as this test's cache will keep it
    kept = {name.partition("-")[0]: size for name, size in _kept(tmp_path / "cache").items()}
    sizes = [kept[plain.cache.name(url).partition("-")[0]] for url in plain.urls]
    budget = sum(sorted(sizes)[-4:])  # the four largest shards as kept: two windows of two
    cache = ShardCache(tmp_path / "small", budget_bytes=budget, storage_options=storage_options(s3["endpoint"]))
    source = _source(s3, tmp_path, "parquet", cache=cache, decode=decode)
    # the window plan: its first two windows are the first four shards of its order
    sampler = LocalitySampler(source, window=2, mixing="windows", num_replicas=1, rank=0, seed=1)
    sampler._FIRST_CHUNK = 8  # several chunks per epoch, so the plan is followed as it advances
    iterator = iter(sampler)
    first = next(iterator)
    permutation = sampler.permutation(0)
    assert permutation is not None
    suffix = ".arrow" if decode == "node" else ".parquet"
    planned = {cache.name(source.urls[s]).partition("-")[0] for s in permutation.shard_order()[:4]}

    def arrived() -> bool:
        return planned <= {name.partition("-")[0] for name in _kept(tmp_path / "small") if name.endswith(suffix)}

    deadline = time.monotonic() + 30
    while not arrived() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert arrived()
    ids = [first, *iterator]
    assert [source[i]["id"] for i in ids] == ids
    assert sum(_kept(tmp_path / "small").values()) <= budget
    cache.close()


def test_prefetch_moves_past_a_shard_another_process_is_fetching(s3: dict[str, Any], tmp_path: Path) -> None:
    """The node's ranks follow one plan: a shard whose lock is held is put off, the next ones fetched meanwhile.

    (Each rank's prefetch thread used to wait on the lock the first rank held, so a node downloaded
    one shard at a time.) Once the lock is free, the put-off shard is fetched too.
    """
    plain = _source(s3, tmp_path, "parquet", decode="worker")
    shards = [(url, int(size), None) for url, size in zip(plain.urls[:3], plain.file_sizes[:3], strict=True)]
    cache = ShardCache(tmp_path / "node", storage_options=storage_options(s3["endpoint"]))
    names = [cache.name(url) for url, _, _ in shards]
    held = FileLock(str(tmp_path / "node" / names[0]) + ".lock")
    (tmp_path / "node").mkdir()
    with held:
        cache.follow(shards)
        deadline = time.monotonic() + 30
        while not all((tmp_path / "node" / n).exists() for n in names[1:]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all((tmp_path / "node" / n).exists() for n in names[1:])
        assert not (tmp_path / "node" / names[0]).exists()
    deadline = time.monotonic() + 30
    while not (tmp_path / "node" / names[0]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp_path / "node" / names[0]).stat().st_size == shards[0][1]
    cache.close()


def test_bad_arguments_name_the_parameter(tmp_path: Path) -> None:
    """Bad construction arguments fail naming the parameter and the value."""
    with pytest.raises(ValueError, match="budget_bytes should be a positive integer, but got budget_bytes=0"):
        ShardCache(tmp_path, budget_bytes=0)
    with pytest.raises(ValueError, match="urls should name shard files, but urls="):
        ShardedSource(str(tmp_path))
    with pytest.raises(ValueError, match="window should be a positive integer, but got window=0"):
        LocalitySampler([3, 4], window=0)
    with pytest.raises(ValueError, match="format should be one of 'parquet', 'arrow', 'webdataset'"):
        (tmp_path / "a.parquet").write_bytes(b"")
        ShardedSource([str(tmp_path / "a.parquet")], format="csv", index_dir=False)


def test_retries_are_bounded_and_named(s3: dict[str, Any], tmp_path: Path) -> None:
    """A download that keeps failing (here: fewer bytes than the metadata says) is retried, then raises naming the URL."""
    cache = ShardCache(tmp_path, retries=2, backoff=0.01, storage_options=storage_options(s3["endpoint"]))
    url = f"s3://{BUCKET}/parquet/shard-01.parquet"
    size = int(s3["fs"].info(url)["size"])
    with pytest.raises(ShardError, match=rf"could not fetch shard {url} \(needed for sample 9\) after 3 attempts: .* "
                                         rf"has {size} bytes, but its metadata says {size + 1}"):
        cache.path(url, size + 1, sample=9)
    assert [p.suffix for p in tmp_path.iterdir()] == [".lock"]  # no shard, no temporary file
    assert Path(cache.path(url, size)).stat().st_size == size


def test_local_shards_are_read_in_place(s3: dict[str, Any], tmp_path: Path) -> None:
    """Local paths are not copied into the cache; with ``decode="worker"`` the source reads them where they are."""
    paths = [str(s3["local"] / f"{s}.parquet") for s in range(len(SIZES))]
    cache = ShardCache(tmp_path / "cache")
    source = ShardedSource(paths, cache=cache, index_dir=tmp_path / "index", decode="worker")
    ids = list(LocalitySampler(source, window=3, num_replicas=1, rank=0, seed=2))
    assert [source[i]["id"] for i in ids] == ids
    assert not (tmp_path / "cache").exists()


def test_local_parquet_is_decoded_once_a_node(s3: dict[str, Any], tmp_path: Path) -> None:
    """By default each local Parquet shard is decoded once into the node cache (prefetched in plan order), never
    copied: two epochs with 2 workers read every sample from one decoded file a shard, made in the first."""
    paths = [str(s3["local"] / f"{s}.parquet") for s in range(len(SIZES))]
    source = ShardedSource(paths, cache=ShardCache(tmp_path / "cache"), index_dir=tmp_path / "index",
                           output_format="numpy")
    sampler = LocalitySampler(source, window=3, num_replicas=1, rank=0, seed=2)
    loader = DataLoader(source, sampler=sampler, batch_size=8, num_workers=2, collate_fn=lambda rows: rows,
                        multiprocessing_context="fork", timeout=60)
    twin = LocalitySampler(source.shard_sizes, window=3, num_replicas=1, rank=0, seed=2)  # the plan, counts alone
    made: dict[str, int] = {}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        twin.set_epoch(epoch)
        assert [int(row["id"]) for batch in loader for row in batch] == list(twin)
        # inode numbers: a file made again is another file renamed into place (reading one touches its mtime)
        kept = {p.name: p.stat().st_ino for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")}
        assert made in ({}, kept)  # the second epoch made nothing again
        made = kept
    assert len(made) == len(SIZES) and all(name.endswith(".arrow") for name in made)


def test_a_cache_directory_that_cannot_be_made_names_the_fix(s3: dict[str, Any], tmp_path: Path) -> None:
    """Local Parquet is decoded into the cache by default: a cache folder that cannot be made says how to place it,
    or to read the shards in place."""
    paths = [str(s3["local"] / f"{s}.parquet") for s in range(len(SIZES))]
    (tmp_path / "a-file").write_text("")
    source = ShardedSource(paths, cache=ShardCache(tmp_path / "a-file" / "cache"), index_dir=tmp_path / "index")
    with pytest.raises(ShardError, match=r"cannot be kept in the cache directory .*a-file/cache .*ShardCache\(directory="
                                         r"\.\.\.\) a folder this process can write .*decode=\"worker\""):
        source[0]
    in_place = ShardedSource(paths, cache=ShardCache(tmp_path / "a-file" / "cache"), index_dir=tmp_path / "index",
                             decode="worker")
    assert in_place[0]["id"] == 0


def test_mixture_and_class_balanced_over_sources(s3: dict[str, Any], tmp_path: Path) -> None:
    """MixtureSampler over a Parquet and a WebDataset source, ClassBalanced over a label column: unchanged samplers."""
    from shardwise import ClassBalancedBatchSampler, Mixture, MixtureSampler

    parquet = _source(s3, tmp_path, "parquet", label_column="label")
    tars = _source(s3, tmp_path, "tar")
    data = Mixture({"parquet": parquet, "tar": tars})
    sampler = MixtureSampler(data, [0.75, 0.25], num_samples=64, num_replicas=1, rank=0, seed=0)
    drawn = [data.locate(i)[0] for i in sampler]
    assert Counter(drawn) == {0: 48, 1: 16}
    for i in list(sampler)[:12]:
        source, k = data.locate(i)
        row = data[i]
        assert (row["id"] if source == 0 else int(row["__key__"][1:])) == k
    assert parquet.labels is not None
    batches = ClassBalancedBatchSampler(parquet.labels, classes_per_batch=2, samples_per_class=3, num_replicas=1,
                                        rank=0, seed=0)
    for batch in list(batches)[:5]:
        labels = Counter(int(parquet[i]["label"]) for i in batch)
        assert sorted(labels.values()) == [3, 3]


def test_a_pinned_shard_is_not_evicted_before_its_reader_opens_it(s3: dict[str, Any], tmp_path: Path) -> None:
    """Between fetching a shard and opening it, this process's own downloads (the prefetch thread's) never evict it.

    Under a budget of about one shard, the prefetch thread's next download used to delete the shard the
    reader had just fetched: the bench's tight-budget epochs died with a raw FileNotFoundError.
    """
    plain = _source(s3, tmp_path, "parquet")
    urls, sizes = plain.urls, [int(s) for s in plain.file_sizes]
    cache = ShardCache(tmp_path / "tight", budget_bytes=max(sizes[:2]), storage_options=storage_options(s3["endpoint"]))
    with cache.pinned(urls[0]):
        path = cache.path(urls[0], sizes[0])
        cache.path(urls[1], sizes[1])  # over budget: evicts what it may, never the pinned shard
        assert os.path.exists(path)
    cache.path(urls[2], sizes[2])
    assert not os.path.exists(path)  # unpinned, it is evicted like any other
