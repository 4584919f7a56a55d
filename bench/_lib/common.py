"""What several benchmarks share: the WikiText-2 and stdlib function lengths, and readings of /proc (Linux).

Benchmarks run as modules from the repository root (``python -m bench.bench_x``) and import this one as
``bench._lib.common``.
Every input comes from the repository (``bench/data/``) or from the running Python
(:mod:`sysconfig`); a missing one is an error that names it, never an empty array.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import os
import sys
import sysconfig
import textwrap
import tokenize
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: where ``python -m bench.<name>`` runs, and the working folder of a benchmark's children."""

DATA = ROOT / "bench" / "data" / "wikitext-2"
"""The WikiText-2 validation and test splits shipped with the repository (``valid.txt.gz``, ``test.txt.gz``).

A real length distribution, CC BY-SA 3.0 (``bench/data/wikitext-2/LICENSE.md``); ``--data DIR``
points a benchmark at another copy (``valid.txt`` and ``test.txt``, plain or gzipped).
"""


def add_data_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--data DIR`` option of every benchmark that reads WikiText-2 (default: the repository's copy)."""
    parser.add_argument("--data", type=Path, default=DATA, metavar="DIR",
                        help="a folder with WikiText-2's valid.txt and test.txt, plain or .gz "
                             "(default: the copy in bench/data/wikitext-2)")  # fmt: skip


def _split_file(data: Path, split: str) -> Path:
    """``<data>/<split>.txt`` or ``<data>/<split>.txt.gz``, whichever exists; a clear error when neither does."""
    for name in (f"{split}.txt", f"{split}.txt.gz"):
        if (Path(data) / name).is_file():
            return Path(data) / name
    raise FileNotFoundError(
        f"WikiText-2's {split} split is not in {str(data)!r}: expected {split}.txt or {split}.txt.gz there; "
        f"pass --data with a folder that has them (the repository ships them in bench/data/wikitext-2)"
    )


def wikitext_paragraphs(split: str, data: Path = DATA) -> list[list[str]]:
    """The whitespace-split words of every paragraph of one WikiText-2 split (headings and blank lines skipped)."""
    path = _split_file(data, split)
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")) as lines:
        return [line.split() for line in lines if line.strip() and not line.startswith(" = ")]


def wikitext_lengths(data: Path = DATA) -> np.ndarray:
    """Whitespace tokens of every WikiText-2 valid and test paragraph (headings and blank lines skipped)."""
    return np.array([len(p) for split in ("valid", "test") for p in wikitext_paragraphs(split, data)], dtype=np.int64)


def status_bytes(field: str, pid: int | str = "self") -> int:
    """A memory field of ``/proc/<pid>/status`` (e.g. ``RssAnon``) in bytes; 0 if absent (an exited process)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def smaps_rollup() -> dict[str, int]:
    """Every field of this process's ``/proc/self/smaps_rollup`` (``Pss``, ``Pss_Anon``, ...) in bytes."""
    values = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                values[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return values


STDLIB = Path(sysconfig.get_paths()["stdlib"])
"""The standard library of the Python running the benchmark: real source code, for code-length distributions.

The figures in BENCHMARKS.md were measured on CPython 3.11.7's; another version gives a similar,
not identical, distribution.
"""

OUT = str(ROOT / "bench" / "out")
"""Where benchmarks cache derived arrays (gitignored)."""



def module_command(module: str, *args: str) -> list[str]:
    """``python -m <module> <args>`` on this interpreter: a benchmark rerun (or a sibling run) in a fresh process.

    Run it with ``cwd=ROOT``, where ``bench`` and ``tests.s3_server`` import as packages (no ``sys.path`` edit).
    """
    return [sys.executable, "-m", module, *args]


_LAYOUT = {tokenize.ENCODING, tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def _function_tokens(source: str) -> list[int]:
    """Tokens of every function (``def``/``async def``, methods and nested ones too) of one module's source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a file of another Python version (lib2to3 test data): not code of this one
        return []
    lines = source.splitlines(keepends=True)
    sizes = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        segment = textwrap.dedent("".join(lines[first - 1 : node.end_lineno]))
        try:
            tokens = tokenize.generate_tokens(io.StringIO(segment).readline)
            sizes.append(sum(1 for token in tokens if token.type not in _LAYOUT))
        except (tokenize.TokenError, IndentationError, SyntaxError):  # pragma: no cover - a segment that dedent mangles
            sizes.append(len(segment) // 4)
    return sizes


def function_lengths(root: Path = STDLIB) -> np.ndarray:
    """Tokens of every function of the Python standard library: a real, long-tailed length distribution.

    Every ``.py`` file under ``root`` (``site-packages`` excluded; test suites included: they are
    real code too) is parsed with :mod:`ast`; each ``FunctionDef``/``AsyncFunctionDef`` node
    (top-level functions, methods, nested functions), from its first decorator to its last line,
    dedented, is one document whose length is its :mod:`tokenize` tokens, layout tokens
    (``NEWLINE``, ``NL``, ``INDENT``, ``DEDENT``, ``ENCODING``, ``ENDMARKER``) not counted:
    names, operators, literals and comments are. Files in sorted path order, functions in
    :func:`ast.walk` order. Cached in ``bench/out/function_lengths-<root digest>.npy`` (about 40 s
    to build), one file a root.

    Raises:
        FileNotFoundError: ``root`` is not a folder or holds no function (nothing is cached then).
    """
    root = Path(root)
    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]
    cache = os.path.join(OUT, f"function_lengths-{digest}.npy")
    if os.path.exists(cache):
        return np.load(cache)
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library to measure is not a folder: root={str(root)!r}")
    sizes: list[int] = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.relative_to(root).parts:
            continue
        sizes += _function_tokens(path.read_text(encoding="utf-8", errors="replace"))
    if not sizes:
        raise FileNotFoundError(f"no Python function under root={str(root)!r}: is it a standard library folder?")
    lengths = np.array(sizes, dtype=np.int64)
    os.makedirs(OUT, exist_ok=True)
    np.save(cache, lengths)
    return lengths


def shuffle_quality(ids: np.ndarray, shard_of: np.ndarray) -> dict[str, float]:
    """How well an order of ids is mixed: same-shard consecutive pairs, mean |id step| / n, Spearman(position, id).

    ``shard_of`` maps every sample id of the dataset to its shard; ``n`` is the dataset's size, also for
    one rank's order (a uniform one scores 1/3 either way).
    """
    ids = np.asarray(ids, dtype=np.int64)
    shards = shard_of[ids]
    ranks = np.argsort(np.argsort(ids))
    return {"same_shard": float(np.mean(shards[1:] == shards[:-1])),
            "id_step": float(np.mean(np.abs(np.diff(ids)))) / len(shard_of),  # over the dataset's n, for a rank too
            "spearman": float(np.corrcoef(np.arange(len(ids)), ranks)[0, 1])}  # fmt: skip


def uneven_sizes(n: int, shards: int, seed: int = 0) -> np.ndarray:
    """Samples per shard from uniform random cuts of ``[0, n)``: ``shards`` uneven shards (the sharded benches')."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, n), size=shards - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [n]])).astype(np.int64)
