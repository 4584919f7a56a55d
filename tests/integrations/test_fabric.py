"""Lightning Fabric: 2 real processes (ddp, gloo) running examples/fabric_ddp.py, every shardwise sampler kind.

The two multi-process tests read the runs of one fixture (``fabric_runs``, tests/integrations/conftest.py): 2 launches
instead of 3; tests/integrations/test_skip_ledger.py reads its --save run too.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("lightning.fabric")

ROOT = Path(__file__).resolve().parents[2]
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
@pytest.mark.timeout(300)
def test_fabric_setup_dataloaders_deals_every_sampler_kind_as_planned(fabric_runs: dict[str, Path]) -> None:
    """Fabric(devices=2, strategy="ddp"), default setup_dataloaders: each rank trains its share of the plan, new each epoch."""
    tmp_path = fabric_runs["setup"]  # the example's run without --save or --resume
    ranks = [json.loads((tmp_path / f"run-rank{rank}.json").read_text()) for rank in (0, 1)]
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


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_fabric_resume_in_a_new_run_continues_every_sampler_kind_exactly(fabric_runs: dict[str, Path]) -> None:
    """--save stops each kind mid-epoch 1 or after epoch 0's loop; --resume (new processes) trains the rest exactly.

    Fabric's epoch count restarts at 0 in the new run: without load_state_dict moving it, the first
    iter(loader) would set epoch 0 and the resumed run would train epoch 0 again.
    """
    tmp_path = fabric_runs["resume"]  # --save, then --resume from its checkpoints
    example = _example()
    for rank in (0, 1):
        saved, resumed = (
            json.loads((tmp_path / f"{phase}-rank{rank}.json").read_text()) for phase in ("save", "resume")
        )
        for kind in example.KINDS:
            epoch, steps = example.save_point(kind)
            assert resumed[kind][0][0] == 1, kind  # the first resumed batch is in epoch 1 in both save points
            assert saved[kind] + resumed[kind] == _planned(example, kind, rank), (kind, rank, epoch, steps)


def test_load_state_dict_continues_fabric_epoch_count_and_refuses_other_loaders() -> None:
    """One process: the next epoch after a mid-epoch and an epoch-end state; clear errors for other loaders."""
    import torch
    from lightning.fabric.wrappers import _FabricDataLoader
    from torch.utils.data import DataLoader, RandomSampler

    from shardwise.integrations import fabric as shardwise_fabric

    example = _example()

    def fabric_loader() -> Any:
        return _FabricDataLoader(example.build_loader("BucketBatchSampler", num_replicas=2, rank=1))

    whole = _planned(example, "BucketBatchSampler", 1)
    first = fabric_loader()
    trained = []
    for epoch, steps in ((0, None), (1, 2)):
        for step, batch in enumerate(first, start=1):
            trained.append([epoch, *batch.tolist()])
            if step == steps:
                break
        state = shardwise_fabric.state_dict(first)
        resumed = fabric_loader()
        start = shardwise_fabric.load_state_dict(resumed, state)
        assert start == 1  # after epoch 0's loop: epoch 1; mid-epoch 1: epoch 1
        rest = [[e, *batch.tolist()] for e in range(start, example.EPOCHS) for batch in resumed]
        assert trained + rest == whole, (epoch, steps)

    with pytest.raises(TypeError, match=r"fabric\.setup_dataloaders"):
        shardwise_fabric.load_state_dict(example.build_loader("ShardedSampler", num_replicas=2, rank=0), state)
    plain = _FabricDataLoader(DataLoader(list(range(8)), sampler=RandomSampler(range(8)), batch_size=2))
    with pytest.raises(TypeError, match=r"sampler=<shardwise sampler>.*BatchSampler over RandomSampler"):
        shardwise_fabric.state_dict(plain)
    assert torch.is_tensor(next(iter(plain)))
