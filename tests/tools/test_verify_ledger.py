"""``verify --state``: a state's skip ledger, resumed on real gloo ranks, is listed and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import shardwise
from shardwise.tools.cli import main

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

FACTORY = """
from torch.utils.data import DataLoader
import shardwise

def make_loader(rank=0, world_size=1):
    return DataLoader(range(96), batch_size=4, sampler=shardwise.ShardedSampler(96, num_replicas=world_size, rank=rank, seed=3))

def _forgetting(key, rank, world_size):
    '''On its ranks (world_size > 1), a loader whose sampler drops state[key] on load.'''
    sampler = shardwise.ShardedSampler(96, num_replicas=world_size, rank=rank, seed=3)
    if world_size > 1:
        load = sampler.load_state_dict
        sampler.load_state_dict = lambda state: load({k: v for k, v in state.items() if k != key})
    return DataLoader(range(96), batch_size=4, sampler=sampler)

def make_forgetful(rank=0, world_size=1):
    '''A loader that loses the ledger on load, as a path keeping only the position.'''
    return _forgetting("skip", rank, world_size)

def make_forgetful_ids(rank=0, world_size=1):
    '''A loader that loses the skipped ids on load.'''
    return _forgetting("skip_ids", rank, world_size)
"""


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Path]:
    """The factory file, and a state saved after 3 steps on 2 ranks with steps 1-2 after it skipped."""
    factory = tmp_path / "factory.py"
    factory.write_text(FACTORY)
    sampler = shardwise.ShardedSampler(96, num_replicas=2, rank=0, seed=3)
    for step, _ in enumerate(torch.utils.data.DataLoader(range(96), batch_size=4, sampler=sampler)):
        if step == 2:
            break
    state = sampler.state_dict()
    sampler = shardwise.ShardedSampler(96, seed=3)
    sampler.load_state_dict(state)
    shardwise.skip_steps(sampler, epoch=0, steps=range(1, 3), batch_size=4, world_size=2, start=state["consumed"])
    torch.save({"step": 3, "sampler": sampler.state_dict()}, tmp_path / "ckpt.pt")
    return factory, tmp_path / "ckpt.pt"


def test_verify_state_lists_the_ranges_and_checks_them_on_real_ranks(
    saved: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`shardwise verify --state`: the skip_ledger check names the ranges, 16 skipped never trained, 0 lost."""
    factory, ckpt = saved
    with pytest.raises(SystemExit) as exited:
        main(["verify", f"{factory}:make_loader", "-w", "2", "-e", "1", "--state", str(ckpt), "--json", str(tmp_path / "r.json")])
    assert exited.value.code in (0, None), capsys.readouterr()
    report = json.loads((tmp_path / "r.json").read_text())
    check = next(c for c in report["checks"] if c["name"] == "skip_ledger")
    assert check["verdict"] == "pass", check
    assert "epoch 0 from position 24, 1 skipped range(s) [[0, 32, 48]]" in check["evidence"]
    assert "16 skipped samples never trained on 2 ranks, 0 lost, 0 repeated" in check["evidence"]
    assert "skip_ledger" in capsys.readouterr().out


def test_verify_state_finds_a_loader_that_loses_the_ledger(saved: tuple[Path, Path]) -> None:
    """A loader that drops state['skip'] on its ranks trains the skipped samples: an error naming them."""
    factory, ckpt = saved
    from shardwise.tools.verify.ledger import check_ledger
    from shardwise.tools.verify.target import as_ref

    check = check_ledger(as_ref(f"{factory}:make_forgetful"), ckpt, 2)  # the check verify(state=) adds
    assert check.verdict == "error"
    assert check.finding is not None and "16 skipped samples were trained" in check.finding.message


def test_verify_state_checks_skipped_ids_too(saved: tuple[Path, Path], tmp_path: Path) -> None:
    """A state's skip_ids are listed and checked as its skip ranges are: a loader that drops them is an error."""
    factory, _ = saved
    from shardwise.tools.verify.ledger import check_ledger
    from shardwise.tools.verify.target import as_ref

    sampler = shardwise.ShardedSampler(96, seed=3)
    for step, _ in enumerate(torch.utils.data.DataLoader(range(96), batch_size=4, sampler=sampler)):
        if step == 2:
            break
    editor = shardwise.ShardedSampler(96, seed=3)
    editor.load_state_dict(sampler.state_dict())
    editor.skip_ids(10, 30)  # 20 ids: those the rest of epoch 0 holds, and every later epoch
    state = editor.state_dict()
    assert state["skip_ids"] == [[0, 12, 10, 30]]
    sound = check_ledger(as_ref(f"{factory}:make_loader"), state, 2)
    assert sound.verdict == "pass", sound
    assert "1 skipped id range(s) [[0, 12, 10, 30]]" in sound.evidence
    skipped = int(sound.evidence.split(": ", 1)[1].split(" skipped samples", 1)[0])
    assert 0 < skipped <= 20, sound.evidence
    forgetful = check_ledger(as_ref(f"{factory}:make_forgetful_ids"), state, 2)
    assert forgetful.verdict == "error" and forgetful.finding is not None
    assert f"{skipped} skipped samples were trained" in forgetful.finding.message
