"""HF Accelerate: 2 real processes (torchrun, gloo), every sample once per epoch, resume through save_state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, RandomSampler

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_ddp.py"
N = 64

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]


def _launch(out: Path, *extra: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
               str(EXAMPLE), "--out", str(out), *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150, check=False)
    assert result.returncode == 0, result.stderr[-4000:]


def _seen(out: Path, phase: str) -> list[dict[str, object]]:
    return [json.loads((out / f"{phase}-rank{rank}.json").read_text()) for rank in (0, 1)]


def test_two_processes_every_sample_once_refuse_double_sharding_and_resume(tmp_path: Path) -> None:
    """prepare_data_loader: each sample once per epoch; plain prepare refused; save_state/load_state resumes exactly."""
    _launch(tmp_path)
    run = _seen(tmp_path, "run")
    for epoch in (0, 1):
        drawn = [i for rank in run for batch in rank["seen"] if batch[0] == epoch for i in batch[1:]]  # type: ignore[attr-defined]
        assert Counter(drawn) == Counter(range(N))
    assert len(run[0]["seen"]) == len(run[1]["seen"]) == N // 4  # type: ignore[arg-type]
    for rank in run:
        assert rank["world"] == 2
        assert "would shard an already distributed sampler a second time" in rank["forgot"]  # type: ignore[operator]
        assert "shardwise.integrations.accelerate.prepare_data_loader(accelerator, loader)" in rank["forgot"]  # type: ignore[operator]
    _launch(tmp_path, "--resume")
    resumed = _seen(tmp_path, "resume")
    for before, after in zip(run, resumed, strict=True):
        assert after["seen"] == before["seen"][3:]  # type: ignore[index]


def test_prepare_data_loader_refuses_a_loader_shardwise_does_not_distribute() -> None:
    """A loader over a plain sampler goes through accelerator.prepare; the helper says so."""
    from accelerate import Accelerator

    from shardwise.integrations.accelerate import prepare_data_loader

    with pytest.raises(TypeError, match=r"accelerator.prepare\(loader\)"):
        prepare_data_loader(Accelerator(cpu=True), DataLoader(range(8), sampler=RandomSampler(range(8)), batch_size=2))


def test_batch_sampler_shard_around_a_shardwise_sampler_is_refused_before_any_batch() -> None:
    """Accelerate's BatchSamplerShard around a shardwise (batch) sampler raises at iter, naming the fix."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    import shardwise

    wrapped = [
        shardwise.TwoStreamBatchSampler(range(8), range(8, 16), primary_batch_size=2, secondary_batch_size=2,
                                        num_replicas=2, rank=0),
        BatchSampler(shardwise.ShardedSampler(16, num_replicas=2, rank=0), 2, False),
    ]
    for inner in wrapped:
        shard = BatchSamplerShard(inner, num_processes=2, process_index=0)
        with pytest.raises(RuntimeError, match=r"prepare_data_loader\(accelerator, loader\)"):
            next(iter(shard))
    # A sampler pinned to one replica is the whole plan: Accelerate may deal it out itself.
    whole = shardwise.ShardedSampler(16, num_replicas=1, rank=0, shuffle=False)
    assert list(BatchSamplerShard(BatchSampler(whole, 2, False), num_processes=2, process_index=1)) == [
        [2, 3], [6, 7], [10, 11], [14, 15]
    ]


def test_prepare_data_loader_keeps_the_shardwise_batches_in_one_process() -> None:
    """The prepared loader yields exactly the shardwise sampler's batches (index and batch samplers)."""
    from accelerate import Accelerator

    import shardwise
    from shardwise.integrations.accelerate import prepare_data_loader

    accelerator = Accelerator(cpu=True)
    index = shardwise.ShardedSampler(16, num_replicas=2, rank=1, seed=3)
    loader = prepare_data_loader(accelerator, DataLoader(list(range(16)), sampler=index, batch_size=4))
    reference = list(shardwise.ShardedSampler(16, num_replicas=2, rank=1, seed=3))
    assert [b.tolist() for b in loader] == [reference[i : i + 4] for i in range(0, 8, 4)]
    batches = shardwise.BucketBatchSampler(list(range(1, 17)), batch_size=2, num_replicas=2, rank=0)
    loader = prepare_data_loader(accelerator, DataLoader(list(range(16)), batch_sampler=batches))
    expected = [list(map(int, b)) for b in shardwise.BucketBatchSampler(list(range(1, 17)), batch_size=2,
                                                                         num_replicas=2, rank=0)]  # fmt: skip
    assert [b.tolist() for b in loader] == expected
    assert loader in accelerator._dataloaders  # registered: save_state includes it
    shardwise.set_epoch(loader, 3)  # Accelerate's own counter first, then the sampler
    assert loader.iteration == 3 and batches.epoch == 3


@pytest.mark.timeout(60)
def test_an_evaluation_loop_after_a_partial_one_sees_every_sample() -> None:
    """A prepared evaluation loader left after 2 batches (a quick check): the next evaluation sees all 10 samples."""
    from accelerate import Accelerator

    from shardwise import ShardedSampler
    from shardwise.integrations.accelerate import prepare_data_loader

    sampler = ShardedSampler(10, num_replicas=1, rank=0, shuffle=False)
    loader = prepare_data_loader(Accelerator(cpu=True), DataLoader(range(10), sampler=sampler, batch_size=2))
    for step, _batch in enumerate(loader):
        if step == 1:
            break
    assert [int(i) for batch in loader for i in batch] == list(range(10))
