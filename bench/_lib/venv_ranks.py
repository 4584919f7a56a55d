"""What the scratch-venv sides of ``bench_sharded_sources.py`` share (``litdata_venv.py``, ``streaming_venv.py``).

A loader that is not a dependency of this repository (its install pulls its own pins) runs in a
scratch venv, as a subprocess of the benchmark (``python -m bench._lib.<name>`` from the repository
root), with this worktree's ``src`` on ``PYTHONPATH``. Each such module converts the Parquet shards'
rows to the loader's own format (``rows_of``) and runs ``rank_main`` over that loader on real gloo
ranks (``run_ranks``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def rows_of(path: str) -> Iterator[dict[str, Any]]:
    """Every row of one Parquet shard as ``{"id": int, "tokens": int32 array}``."""
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for i, tokens in zip(table["id"].to_pylist(), table["tokens"].to_pylist(), strict=True):
        yield {"id": int(i), "tokens": np.asarray(tokens, dtype=np.int32)}


def parquet_shards(folder: str) -> list[str]:
    """The Parquet shards of ``folder``, in order (ids ascend across them)."""
    return sorted(str(p) for p in Path(folder).glob("*.parquet"))


def run_ranks(spec_file: str) -> None:
    """``rank_main`` on ``spec["world_size"]`` gloo ranks; prints ``REPORTS <json>`` (a list, or ``{"error": ...}``)."""
    from bench._lib.rank_loop import rank_main
    from shardwise.tools.launch import run_distributed

    spec = json.loads(Path(spec_file).read_text())
    world_size = spec.pop("world_size")
    try:
        reports: Any = run_distributed(rank_main, world_size, spec, timeout=900)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        lines = [line for line in str(error).splitlines() if "Error" in line]
        reports = {"error": (lines[-1] if lines else str(error))[:160]}
    print("REPORTS " + json.dumps(reports))
