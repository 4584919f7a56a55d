"""Fixtures of tests/integrations/ shared by more than one of its modules (session scope: one run for all)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = Path(__file__).with_name("example_phases.py")  # several runs of an example in one launch


@pytest.fixture(scope="session")
def fabric_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example's uninterrupted run and its --save run, then its --resume run (new processes).

    The first two are phases of one torchrun launch (example_phases.py: the example's main() twice in the
    same 2 ranks, ~10 s of process starts and imports saved); --resume starts the example as its docstring
    does, Fabric's launcher starting rank 1. test_fabric.py reads all three runs; test_skip_ledger.py the --save
    run's ShardedSampler checkpoint and batches (it edits a copy, then resumes it in a launch of its own).
    """
    from tests.integrations.test_fabric import ENV, EXAMPLE

    base = tmp_path_factory.mktemp("fabric")
    setup, resume = base / "setup", base / "resume"
    for folder in (setup, resume):
        folder.mkdir()
    (base / "phases.json").write_text(json.dumps([["--out", str(setup)], ["--out", str(resume), "--save"]]))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
               str(PHASES), EXAMPLE.stem, str(base / "phases.json")]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=150, check=False)
    assert result.returncode == 0, ("run, --save", result.stderr[-4000:])
    command = [sys.executable, str(EXAMPLE), "--out", str(resume), "--resume"]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=150, check=False)
    assert result.returncode == 0, ("--resume", result.stderr[-4000:])
    return {"setup": setup, "resume": resume}
