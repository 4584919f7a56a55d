"""The progressive-resizing Lightning example: 2 ddp_spawn ranks change batch and image size in lockstep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "progressive_resizing_lightning.py"

# (epoch, batch size, image size, steps): changes mid-epoch 0, at epochs 1 and 2, and mid-epoch 2
EXPECTED = [(0, 8, 16, 3), (0, 6, 24, 4), (1, 4, 32, 12), (2, 3, 40, 8), (2, 2, 48, 12)]


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_every_rank_runs_the_same_steps_with_the_same_sizes_and_no_sample_twice(tmp_path: Path) -> None:
    """Both ranks record identical per-step sizes that follow the schedule; each epoch covers the data once."""
    pytest.importorskip("lightning")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "GLOO_SOCKET_IFNAME": "lo"}
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=360,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    records = [r["records"] for r in ranks]
    assert len(records[0]) == len(records[1]) == sum(steps for *_, steps in EXPECTED)
    shapes = [[(x["epoch"], x["step"], x["batch_size"], x["image_size"]) for x in rank] for rank in records]
    assert shapes[0] == shapes[1]
    expected = [(epoch, size, side) for epoch, size, side, steps in EXPECTED for _ in range(steps)]
    assert [(e, b, s) for e, _, b, s in shapes[0]] == expected
    assert [step for _, step, _, _ in shapes[0]] == list(range(len(expected)))
    for epoch in range(3):
        seen = Counter(i for rank in records for x in rank if x["epoch"] == epoch for i in x["indices"])
        assert seen == Counter(range(96)), epoch  # every sample exactly once per epoch, over both ranks
    assert "rank0" in run.stdout and "2 x 48px" in run.stdout
