"""What several benchmarks share: the WikiText-2 and stdlib function lengths, and readings of /proc (Linux).

Benchmarks run as scripts (``python bench/bench_x.py``), so this module is imported as ``_common``.
"""

from __future__ import annotations

import ast
import io
import os
import textwrap
import tokenize
from pathlib import Path

import numpy as np

DATA = "/work/shared/data/wikitext-2"
"""The WikiText-2 text files (``valid.txt``, ``test.txt``): a real length distribution."""


def wikitext_lengths() -> np.ndarray:
    """Whitespace tokens of every WikiText-2 valid and test paragraph (headings and blank lines skipped)."""
    lengths = []
    for split in ("valid", "test"):
        with open(f"{DATA}/{split}.txt", encoding="utf-8") as lines:
            for line in lines:
                if not line.strip() or line.startswith(" = "):
                    continue
                lengths.append(len(line.split()))
    return np.array(lengths, dtype=np.int64)


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


STDLIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"
"""The CPython 3.11.7 standard library on this machine: real source code, for code-length distributions."""

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
"""Where benchmarks cache derived arrays (gitignored)."""

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


def function_lengths(root: str = STDLIB) -> np.ndarray:
    """Tokens of every function of the Python standard library: a real, long-tailed length distribution.

    Every ``.py`` file under ``root`` (``site-packages`` excluded; test suites included: they are
    real code too) is parsed with :mod:`ast`; each ``FunctionDef``/``AsyncFunctionDef`` node
    (top-level functions, methods, nested functions), from its first decorator to its last line,
    dedented, is one document whose length is its :mod:`tokenize` tokens, layout tokens
    (``NEWLINE``, ``NL``, ``INDENT``, ``DEDENT``, ``ENCODING``, ``ENDMARKER``) not counted:
    names, operators, literals and comments are. Files in sorted path order, functions in
    :func:`ast.walk` order. Cached in ``bench/out/function_lengths.npy`` (about 40 s to build).
    """
    cache = os.path.join(OUT, "function_lengths.npy")
    if os.path.exists(cache):
        return np.load(cache)
    sizes: list[int] = []
    for path in sorted(Path(root).rglob("*.py")):
        if "site-packages" in path.relative_to(root).parts:
            continue
        sizes += _function_tokens(path.read_text(encoding="utf-8", errors="replace"))
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
