"""What several benchmarks share: the WikiText-2 lengths, and readings of this machine's /proc (Linux).

Benchmarks run as scripts (``python bench/bench_x.py``), so this module is imported as ``_common``.
"""

from __future__ import annotations

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
