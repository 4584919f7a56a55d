"""MosaicML Streaming's side of ``bench_sharded_sources.py``, run by the interpreter of a venv where it is installed.

mosaicml-streaming is not a dependency of this repository: it imports torchvision at import, and
PyPI's torchvision does not import beside this machine's torch 2.13.0, so it runs in a scratch venv
with torch 2.14.1 and torchvision 0.29.1 (``$TMPDIR/scratch-venv-streaming``, or
``$SHARDWISE_STREAMING_PYTHON``; docs/benchmarks/sharded-sources.md and ``bench_sharded_sources.py``'s
docstring give the commands), run from the repository root with this worktree's ``src`` on
``PYTHONPATH``. Commands:

- ``python -m bench._lib.streaming_venv mds SHARDS OUT COUNT``: the Parquet shards' rows written with
  ``streaming.MDSWriter`` (columns ``id: int64``, ``tokens: ndarray:int32``, no compression) as
  about ``COUNT`` shards of even bytes (``size_limit`` = the rows' bytes / ``COUNT``); prints
  ``MDS <json>``: samples and bytes of each shard;
- ``python -m bench._lib.streaming_venv ranks SPEC.json``: ``rank_main`` over the ``streaming`` loader on real
  gloo ranks; prints one JSON line of the ranks' reports (``bench/_lib/venv_ranks.py``);
- ``python -m bench._lib.streaming_venv py1e SIZES.npy OUT.npy --block-size B --canonical-nodes C --seed S
  --epoch E``: the global sample order of one epoch that Streaming's ``py1e`` shuffle gives for
  shards of ``SIZES`` samples (``streaming.base.shuffle.get_shuffle_py1e``, what
  ``StreamingDataset(shuffle_algo="py1e")`` partitions over nodes, ranks and workers), written to
  ``OUT`` (``.npy`` int64, or a JSON list if ``OUT`` ends in ``.json``). No S3, no ranks.

The loader itself is ``streaming_loader.py`` (what ``rank_loop`` builds for ``loader="streaming"``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench._lib.venv_ranks import parquet_shards, rows_of, run_ranks

COLUMNS = {"id": "int64", "tokens": "ndarray:int32"}


ROW_OVERHEAD = 16  # bytes an MDS sample of COLUMNS takes beyond its id and tokens: offsets, a size, a shape


def write_mds(shards: str, out: str, count: int) -> list[dict[str, int]]:
    """The rows of the Parquet shards of ``shards``, in id order, as about ``count`` MDS shards of even bytes.

    ``size_limit`` is the rows' bytes over ``count``: the shards hold the mean shard's bytes, where
    the Parquet shards are uneven (MDSWriter cuts by bytes only).
    """
    from streaming import MDSWriter

    payload = sum(8 + row["tokens"].nbytes + ROW_OVERHEAD for path in parquet_shards(shards) for row in rows_of(path))
    size_limit = -(-payload // count)
    with MDSWriter(out=out, columns=COLUMNS, size_limit=size_limit) as writer:
        for path in parquet_shards(shards):
            for row in rows_of(path):
                writer.write(row)
    index = json.loads((Path(out) / "index.json").read_text())
    return [{"samples": s["samples"], "bytes": s["raw_data"]["bytes"]} for s in index["shards"]]


def py1e(argv: list[str]) -> None:
    """The ``py1e`` command (the module docstring); bad arguments: one line on stderr, exit 2."""
    parser = argparse.ArgumentParser(prog="python -m bench._lib.streaming_venv py1e",
                                     description="Streaming's py1e global sample order of one epoch")
    parser.add_argument("sizes", help=".npy of the samples in each shard (1-D, integers >= 1), in shard order")
    parser.add_argument("out", help="where to write the order: .npy (int64) or .json")
    parser.add_argument("--block-size", type=int, default=None,
                        help="shuffle_block_size (default: Streaming's, max(4_000_000 // canonical nodes, 1 << 18))")
    parser.add_argument("--canonical-nodes", type=int, default=1, help="num_canonical_nodes (default 1)")
    parser.add_argument("--seed", type=int, default=9176, help="shuffle_seed (default 9176, Streaming's)")
    parser.add_argument("--epoch", type=int, default=0, help="epoch (default 0)")
    args = parser.parse_args(argv)
    import numpy as np

    try:
        sizes = np.load(args.sizes)
    except (OSError, ValueError) as error:
        parser.error(f"sizes={args.sizes!r} should be a readable .npy file: {error}")
    if sizes.ndim != 1 or len(sizes) == 0 or sizes.dtype.kind not in "iu" or int(sizes.min()) < 1:
        parser.error(f"sizes={args.sizes!r} should hold a non-empty 1-D array of integers >= 1, "
                     f"but holds shape {sizes.shape} of {sizes.dtype}")
    for name in ("canonical_nodes", "block_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} should be >= 1, but got {value}")
    if args.epoch < 0 or args.seed < 0:
        parser.error(f"--seed and --epoch should be >= 0, but got --seed {args.seed} --epoch {args.epoch}")
    block = args.block_size if args.block_size is not None else max(4_000_000 // args.canonical_nodes, 1 << 18)
    from streaming.base.shuffle import get_shuffle_py1e

    order = get_shuffle_py1e(sizes.astype(np.int64), args.canonical_nodes, args.seed, args.epoch, block)
    if args.out.endswith(".json"):
        Path(args.out).write_text(json.dumps(order.tolist()))
    else:
        np.save(args.out, order.astype(np.int64))


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "mds":
        shards, out, count = sys.argv[2], sys.argv[3], int(sys.argv[4])
        print("MDS " + json.dumps(write_mds(shards, out, count)))
        return
    if command == "ranks":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()  # what an earlier run's ranks left in /dev/shm, as Streaming's docs advise
        run_ranks(sys.argv[2])
        return
    if command == "py1e":
        py1e(sys.argv[2:])
        return
    print(f"command should be 'mds', 'ranks' or 'py1e', but got {command!r}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
