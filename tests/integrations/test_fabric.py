"""Lightning Fabric: 2 real processes (ddp, gloo) running examples/fabric_ddp.py, every shardwise sampler kind.

The two multi-process tests read the runs of one module fixture (``fabric_runs``): 2 launches instead of 3.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("lightning.fabric")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fabric_ddp.py"
PHASES = Path(__file__).with_name("example_phases.py")  # several runs of an example in one launch
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


@pytest.fixture(scope="module")
def fabric_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example's uninterrupted run and its --save run, then its --resume run (new processes).

    The first two are phases of one torchrun launch (example_phases.py: the example's main() twice in the
    same 2 ranks, ~10 s of process starts and imports saved); --resume starts the example as its docstring
    does, Fabric's launcher starting rank 1.
    """
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
