"""MosaicML Streaming as a rank of the multi-process figures reads it (``rank_loop``, ``loader="streaming"``).

``StreamingDataset(remote="s3://...", local=<one cache dir for the node>, shuffle=True,
shuffle_algo="py1e", batch_size=32)`` in a ``StreamingDataLoader`` (``spec`` may add ``cache_limit`` and
``shuffle_block_size``; ``fetch_log``: a folder where ``log_downloads`` counts the shard bytes
downloaded), rank and world from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (all
ranks on one node), the S3 endpoint from ``S3_ENDPOINT_URL`` and the credentials from ``AWS_*``, as
Streaming's docs say; resume through the loader's ``state_dict()`` / ``load_state_dict()`` (rank 0's
state on every rank). ``streaming`` is imported inside the functions, which run in its scratch venv
(``streaming_venv.py``); ``fetched_bytes`` also runs in the benchmark's. It imports no other bench
module: the ranks' loop imports it, never the other way round.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class Rows:
    """The loader's batches as lists of rows, as ``rank_main`` reads them; ``state_dict`` is the loader's.

    The batches stay column dicts inside the loader: ``StreamingDataLoader`` counts the samples of
    a batch as ``len(batch[0])`` unless it is a dict, so a list of rows (2 keys each) would be
    counted as 2 samples and its ``state_dict()`` would resume at the wrong sample.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        for batch in self.loader:
            yield [{"id": i, "tokens": t} for i, t in zip(batch["id"], batch["tokens"], strict=True)]

    def state_dict(self) -> Any:
        return self.loader.state_dict()


def columns_collate(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {"id": [int(row["id"]) for row in rows], "tokens": [row["tokens"] for row in rows]}


def log_downloads(folder: str) -> None:
    """Append the bytes of every shard file this process (and the workers it forks) downloads to a file in ``folder``.

    Wraps ``Stream._download_file``, through which Streaming fetches each file: it counts, changes nothing.
    """
    from streaming.base.stream import Stream

    download = Stream._download_file
    if getattr(download, "logged", False):
        return

    def logged(self: Any, from_basename: str, to_basename: str | None = None) -> str:
        local: str = download(self, from_basename, to_basename)
        if from_basename.startswith("shard."):
            with open(Path(folder) / f"{os.getpid()}.log", "a") as log:
                log.write(f"{os.path.getsize(local)}\n")
        return local

    logged.logged = True  # type: ignore[attr-defined]
    Stream._download_file = logged  # type: ignore[method-assign]


def fetched_bytes(folder: str) -> int:
    """What ``log_downloads`` logged in ``folder``: bytes of shard files downloaded."""
    return sum(int(line) for log in Path(folder).glob("*.log") for line in log.read_text().split())


def streaming_loader(rank: int, world_size: int, spec: dict[str, Any], context: Any) -> tuple[Any, Any, Any]:
    """``(loader, set_epoch, id of a row)`` for Streaming, resumed from ``spec["state"]`` if given."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), S3_ENDPOINT_URL=spec["endpoint"])
    from streaming import StreamingDataLoader, StreamingDataset

    local = Path(spec["root"]) / "streaming-cache" / spec["streaming_local"]
    if spec.get("fetch_log"):  # the bench's count of downloads (bytes fetched over the dataset's)
        Path(spec["fetch_log"]).mkdir(parents=True, exist_ok=True)
        log_downloads(spec["fetch_log"])
    ds = StreamingDataset(remote=spec["streaming_url"], local=str(local), shuffle=True, shuffle_algo="py1e",
                          shuffle_seed=0, batch_size=spec["batch"], cache_limit=spec.get("cache_limit"),
                          shuffle_block_size=spec.get("shuffle_block_size"))
    loader = StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"],
                                 collate_fn=columns_collate, multiprocessing_context=context)
    if spec.get("state") is not None:
        loader.load_state_dict(spec["state"])
    # The dataset moves to its next epoch by itself at each iter(): no set_epoch.
    return Rows(loader), lambda epoch: None, lambda row: row["id"]
