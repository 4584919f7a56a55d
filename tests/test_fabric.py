"""Lightning Fabric: 2 real processes (ddp, gloo) running examples/fabric_ddp.py, every shardwise sampler kind."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("lightning.fabric")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fabric_ddp.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
ONCE_PER_EPOCH = ("ShardedSampler", "shard", "BucketBatchSampler", "ScheduledBatchSampler", "shard_batches")


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fabric_ddp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _planned(example: ModuleType, kind: str, rank: int) -> list[list[int]]:
    """What the sampler's plan gives ``rank`` of 2 in epochs 0 and 1, batch by batch, built in this process."""
    loader = example.build_loader(kind, num_replicas=2, rank=rank)
    batches = []
    for epoch in range(example.EPOCHS):
        sampler = loader.batch_sampler if loader.batch_size is None else loader.sampler
        sampler.set_epoch(epoch)
        batches += [[epoch, *batch.tolist()] for batch in loader]
    return batches


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_fabric_setup_dataloaders_deals_every_sampler_kind_as_planned(tmp_path: Path) -> None:
    """Fabric(devices=2, strategy="ddp"), default setup_dataloaders: each rank trains its share of the plan, new each epoch."""
    command = [sys.executable, str(EXAMPLE), "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=150, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    example = _example()
    assert set(ranks[0]) == set(example.KINDS)
    for kind in example.KINDS:
        for rank in (0, 1):
            assert ranks[rank][kind] == _planned(example, kind, rank), kind
        assert len(ranks[0][kind]) == len(ranks[1][kind]), kind
        epochs = [[i for rank in ranks for batch in rank[kind] if batch[0] == e for i in batch[1:]] for e in (0, 1)]
        assert epochs[0] != epochs[1], kind
        if kind in ONCE_PER_EPOCH:  # every sample in every epoch (a plan that does not divide by 2 pads one batch)
            assert set(epochs[0]) == set(epochs[1]) == set(range(example.N)), kind
