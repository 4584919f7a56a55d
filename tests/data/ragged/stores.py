"""Shared by the ragged store's tests: sample arrays, leftover files, a child process under RLIMIT_DATA."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np


def _samples(n: int = 50, features: tuple[int, ...] = (3,), dtype: type = np.float32, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 12, n)
    rows[:2] = 0  # zero-row samples at the start are legal
    return [(rng.standard_normal((int(r), *features)) * 100).astype(dtype) for r in rows]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


_LIMITED = """
import os, resource, sys
import numpy as np
import torch
from shardwise import RaggedArray, RaggedWriter, pad_collate

torch.set_num_threads(1)

def status(key):
    with open("/proc/self/status") as file:
        return next(int(line.split()[1]) * 1024 for line in file if line.startswith(key + ":"))

headroom = int(sys.argv[2])
# RLIMIT_DATA caps private writable memory (heap, anonymous mmaps), never read-only file mappings.
limit = status("VmData") + headroom
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
anon_before = status("RssAnon")
size = int(sys.argv[3])
try:
    np.ones(size, np.uint8)
except MemoryError:
    pass
else:
    raise SystemExit("the limit does not bite: this process could allocate the whole store")
if sys.argv[1] == "read":
    store = RaggedArray(sys.argv[4])
    assert store.nbytes >= size, (store.nbytes, size)
    total, rows = 0.0, 0
    order = np.argsort(store.lengths, kind="stable")
    for start in range(0, len(store), 8):
        batch = pad_collate(store.__getitems__(order[start:start + 8]))
        total += float(batch.data[:, 0, 0].sum())
        rows += int(batch.lengths.sum())
    expected = float(np.arange(len(store)).sum())
    assert rows == store.total_rows and total == expected, (rows, total, expected)
else:
    with RaggedWriter(sys.argv[4]) as writer:
        for i in range(size // (1 << 20) + 8):
            writer.append(np.full((1 << 18,), i, np.float32))
grown = status("RssAnon") - anon_before
assert grown < headroom, grown
print("anon growth MB", grown >> 20)
"""


def _run_limited(mode: str, headroom: int, size: int, path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LIMITED), mode, str(headroom), str(size), str(path)],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
