"""The skip ledger through every checkpoint path: a skip added to a saved state is honoured after resuming.

Each test trains a few steps, saves the framework's checkpoint, adds a skip to it (with
``shardwise.skip_steps`` or the ``shardwise skip`` command on the real checkpoint file), resumes
through the framework and checks the epoch: the skipped samples never train, every other sample
exactly once, and every rank trains the same number of steps. The skipped samples are what
``shardwise.which`` says the skipped steps would have trained.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

import shardwise
from shardwise.tools.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")]

N, BATCH = 96, 4


def torchdata_loader(rank: int = 0, world_size: int = 1, num_workers: int = 0) -> Any:
    """The training script's factory (also the ``shardwise skip`` target)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    sampler = shardwise.ShardedSampler(N, num_replicas=world_size, rank=rank, seed=5)
    return StatefulDataLoader(list(range(N)), sampler=sampler, batch_size=BATCH, num_workers=num_workers)


def skipped_samples(sampler: Any, *, epoch: int, steps: range, world_size: int, start: int,
                    batch_size: int | None = BATCH) -> set[int]:  # fmt: skip
    """What ``steps`` after a checkpoint at ``start`` would train on every rank (before any skip)."""
    return {i for s in steps for b in shardwise.which(sampler, epoch=epoch, step=s, batch_size=batch_size,
                                                       world_size=world_size, start=start) for i in b.indices}  # fmt: skip


def check_epoch(before: Iterable[list[int]], after: list[list[list[int]]], skipped: set[int], n: int) -> None:
    """The epoch's batches before the checkpoint and per resumed rank: skipped never, the rest once, equal steps."""
    trained = Counter(i for batch in [*before, *(b for rank in after for b in rank)] for i in batch)
    assert skipped and not skipped & set(trained), sorted(skipped & set(trained))
    assert trained == Counter(set(range(n)) - skipped), "a sample lost or repeated"
    assert len({len(rank) for rank in after}) == 1, [len(rank) for rank in after]


def run_cli(argv: list[str]) -> None:
    """``shardwise ...`` in this process; fails the test with its stderr on a non-zero exit."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code in (0, None), argv


def _batches(loader: Any, count: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append([int(i) for i in batch])
        if len(out) == count:
            break
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["api", "cli"])
def test_torchdata_stateful_dataloader_resumes_without_the_skipped_steps(how: str, tmp_path: Path) -> None:
    """2 ranks save a StatefulDataLoader state after 3 steps; with workers; a skip of steps 2-4 holds when 3 ranks resume."""
    ranks = [torchdata_loader(rank, 2, num_workers=2) for rank in (0, 1)]
    before = [b for loader in ranks for b in _batches(loader, 3)]
    state = ranks[0].state_dict()  # with workers: the sampler's state sits in the main process's snapshot
    sampler_state = state["_snapshot"]["_main_snapshot"]["_sampler_iter_state"]["sampler_state"]
    skipped = skipped_samples(torchdata_loader(0, 2).sampler, epoch=0, steps=range(2, 5), world_size=2,
                              start=sampler_state["consumed"])  # fmt: skip
    if how == "api":
        sampler = torchdata_loader(0, 2).sampler
        sampler.load_state_dict(sampler_state)
        shardwise.skip_steps(sampler, epoch=0, steps=range(2, 5), batch_size=BATCH, world_size=2,
                             start=sampler_state["consumed"])  # fmt: skip
        state["_snapshot"]["_main_snapshot"]["_sampler_iter_state"]["sampler_state"] = sampler.state_dict()
    else:
        torch.save(state, tmp_path / "loader.pt")
        run_cli(["skip", f"{__file__}:torchdata_loader", "-w", "2", "--state", str(tmp_path / "loader.pt"),
                 "--steps", "2:5", "-b", str(BATCH), "--out", str(tmp_path / "skipped.pt")])  # fmt: skip
        state = torch.load(tmp_path / "skipped.pt", weights_only=True)
    after = []
    for rank in range(3):
        loader = torchdata_loader(rank, 3, num_workers=2)
        loader.load_state_dict(state)
        after.append(_batches(loader))
    check_epoch(before, after, skipped, N)
    assert len(skipped) == 3 * 2 * BATCH  # 48 left: 16 a rank, nothing padded
