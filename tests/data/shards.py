"""Shard files for the sharded-source tests: the same samples as Parquet, Arrow IPC and WebDataset tar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FORMATS = ("parquet", "arrow", "tar")


def write_shards(root: Path, sizes: Sequence[int], table_of: Callable[[int, int], Any]) -> dict[str, list[Path]]:
    """Write shard ``s`` (``table_of(first id, count)``) as ``root/{s}.parquet``, ``.arrow`` and ``.tar``.

    The tar shard holds, per sample, ``cls`` (``id % 3``) and ``txt`` (``"w" * (id % 17 + 1)``).
    Returns the paths by format, shard by shard.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset

    first = 0
    for s, size in enumerate(sizes):
        table = table_of(first, size)
        pq.write_table(table, root / f"{s}.parquet", row_group_size=16)
        with pa.OSFile(str(root / f"{s}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=10)
        with webdataset.TarWriter(str(root / f"{s}.tar")) as tar:
            for i in range(first, first + size):
                tar.write({"__key__": f"s{i:06d}", "cls": str(i % 3), "txt": "w" * (i % 17 + 1)})
        first += size
    return {suffix: [root / f"{s}.{suffix}" for s in range(len(sizes))] for suffix in FORMATS}


def put_parquet_shards(fs: Any, local: Path, remote: str, sizes: Sequence[int], table_of: Callable[[int, int], Any],
                       **write: Any) -> None:
    """Write shard ``s`` (``table_of(first id, count)``) as ``local/{s}.parquet`` and put it at ``remote.format(s=s)``.

    ``fs``: the object store's fsspec filesystem; ``write``: ``pyarrow.parquet.write_table`` options.
    """
    import pyarrow.parquet as pq

    first = 0
    for s, size in enumerate(sizes):
        pq.write_table(table_of(first, size), local / f"{s}.parquet", **write)
        fs.put(str(local / f"{s}.parquet"), remote.format(s=s))
        first += size
