"""LitData's side of ``bench_sharded_sources.py``, run by the interpreter of a venv where litdata is installed.

litdata is not a dependency of this repository (its install pulls its own pins), so the benchmark
runs this module as a subprocess in a scratch venv with torch 2.13 and litdata (and pyarrow, to read
the Parquet shards), from the repository root with this worktree's ``src`` on ``PYTHONPATH``
(``bench/_lib/venv_ranks.py`` holds what it shares with ``streaming_venv.py``):

- ``python -m bench._lib.litdata_venv optimize SHARDS OUT CHUNK``: the Parquet shards' rows (id, tokens) written
  as LitData chunks of ``CHUNK`` samples (the mean shard size) with ``litdata.optimize``, its
  documented way in, one input per shard;
- ``python -m bench._lib.litdata_venv ranks SPEC.json``: ``rank_main`` over the ``litdata`` loader on real gloo
  ranks (``shardwise.tools.launch.run_distributed``); prints one JSON line of the ranks' reports.
"""

from __future__ import annotations

import sys

from bench._lib.venv_ranks import parquet_shards, rows_of, run_ranks


def main() -> None:
    command = sys.argv[1]
    if command == "optimize":
        import litdata

        shards, out, chunk = sys.argv[2], sys.argv[3], int(sys.argv[4])
        litdata.optimize(fn=rows_of, inputs=parquet_shards(shards), output_dir=out, chunk_size=chunk, num_workers=2,
                         verbose=False)
        return
    if command == "ranks":
        run_ranks(sys.argv[2])
        return
    raise SystemExit(f"command should be 'optimize' or 'ranks', but got {command!r}")


if __name__ == "__main__":
    main()
