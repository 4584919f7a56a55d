"""``PackedBatchSampler`` on the node's shared index: the compiled build (numba) gives the plan of the numpy build."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import shardwise
from shardwise._core.packing.compiled import ENV_NUMBA
from shardwise._core.threads import ENV_WORKERS
from shardwise.index.packing import SHARED_FROM


@pytest.mark.parametrize(
    "options",
    [
        {"rows_per_batch": 4, "drop_last": False},
        {"tokens_per_batch": 2048, "balance": "attention", "drop_last": True},
    ],
)
def test_compiled_and_numpy_builds_give_one_plan(options: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Split samples, several strata: the batches of an epoch on a rank (the first 60, the count) are the same."""
    pytest.importorskip("numba", reason="numba (the fast extra) is not installed: the compiled path is not tested")
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(4.0, 1.2, SHARED_FROM), 1, 1500).astype(np.int32)  # some over max_len: split
    monkeypatch.setenv(ENV_WORKERS, "1")
    plans = []
    for mode in ("0", "1"):
        monkeypatch.setenv(ENV_NUMBA, mode)
        sampler = shardwise.PackedBatchSampler(lengths, max_len=512, window=1 << 14, num_replicas=8, rank=5, seed=5,
                                               cache_dir=tmp_path / mode, **options)  # fmt: skip
        sampler.set_epoch(1)
        batches = itertools.islice(sampler, 60)
        plans.append((len(sampler), [[(int(i), i.row, i.start, i.stop) for i in batch] for batch in batches]))
    assert len(plans[0][1]) == 60
    assert plans[1] == plans[0]
