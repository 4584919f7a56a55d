"""LitData's side of ``bench_sharded_sources.py``, run by the interpreter of a venv where litdata is installed.

litdata is not a dependency of this repository (its install pulls its own pins), so the benchmark
runs this script as a subprocess in a scratch venv with torch 2.13 and litdata (and pyarrow, to read
the Parquet shards), with this worktree's ``src`` and ``bench`` on ``PYTHONPATH``:

- ``python _litdata_ranks.py optimize SHARDS OUT CHUNK``: the Parquet shards' rows (id, tokens) written
  as LitData chunks of ``CHUNK`` samples (the mean shard size) with ``litdata.optimize``, its
  documented way in, one input per shard;
- ``python _litdata_ranks.py ranks SPEC.json``: ``rank_main`` over the ``litdata`` loader on real gloo
  ranks (``shardwise.tools.launch.run_distributed``); prints one JSON line of the ranks' reports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def rows_of(path: str) -> Any:
    """Every row of one Parquet shard as ``{"id": int, "tokens": int32 array}``."""
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for i, tokens in zip(table["id"].to_pylist(), table["tokens"].to_pylist(), strict=True):
        yield {"id": int(i), "tokens": np.asarray(tokens, dtype=np.int32)}


def main() -> None:
    command = sys.argv[1]
    if command == "optimize":
        import litdata

        shards, out, chunk = sys.argv[2], sys.argv[3], int(sys.argv[4])
        inputs = sorted(str(p) for p in Path(shards).glob("*.parquet"))
        litdata.optimize(fn=rows_of, inputs=inputs, output_dir=out, chunk_size=chunk, num_workers=2,
                         verbose=False)
        return
    if command == "ranks":
        from _sharded_ranks import rank_main
        from shardwise.tools.launch import run_distributed

        spec = json.loads(Path(sys.argv[2]).read_text())
        world_size = spec.pop("world_size")
        try:
            reports: Any = run_distributed(rank_main, world_size, spec, timeout=900)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            lines = [line for line in str(error).splitlines() if "Error" in line]
            reports = {"error": (lines[-1] if lines else str(error))[:160]}
        print("REPORTS " + json.dumps(reports))
        return
    raise SystemExit(f"command should be 'optimize' or 'ranks', but got {command!r}")


if __name__ == "__main__":
    main()
