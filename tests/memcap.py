"""Run a snippet in a fresh process whose private memory is capped by RLIMIT_DATA, after its imports.

The cap counts private writable mappings (heap, anonymous mmaps), not file-backed shared ones, so a
sampler that reads memory-mapped inputs and a shared index fits under a cap far below its O(n)
size, while one that copies an O(n) array fails with MemoryError.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PRELUDE = """
import resource
import numpy as np
import shardwise

for _name in shardwise.__all__:  # every module loaded before the cap: import shardwise alone loads none (lazy)
    getattr(shardwise, _name)

def _vm_data() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData")

def cap(mib: int) -> None:
    limit = _vm_data() + mib * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
"""


def run_capped(body: str, *, timeout: float = 120) -> str:
    """Run ``PRELUDE + body`` (which calls ``cap(mib)`` when ready) in a fresh process; return its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), env.get("PYTHONPATH", "")])
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # no thread pools (and their stacks) started after the cap
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode:
        raise AssertionError(f"capped process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def first_units_under_cap(load: str, make: str, *, n: int, first: int, skip: int, mib: int = 64) -> str:
    """Build a sampler under a ``mib`` cap and iterate ``first + skip`` units; return ``str`` of the first ones.

    ``load`` is the code that opens the memory-mapped inputs (run before the cap), ``make`` the
    expression that builds the sampler (run after it). Fails unless the cap is real: one O(n)
    int64 array of the process's own must raise MemoryError under it.
    """
    out = run_capped(
        f"""
{textwrap.dedent(load).strip()}
cap({mib})
sampler = {make}
units = iter(sampler)
first = [next(units) for _ in range({first})]
for _ in range({skip}):
    next(units)
try:
    np.ones({n}, dtype=np.int64)  # what one O(n) array of its own would take
except MemoryError:
    print("capped")
print(first)
"""
    )
    capped, shown = out.splitlines()
    if capped != "capped":
        raise AssertionError(f"the cap did not hold an O(n) array back: {out!r}")
    return shown
