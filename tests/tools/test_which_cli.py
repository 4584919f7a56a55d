"""``shardwise which``: the table and JSON agree with the API, a saved state numbers the steps, bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from shardwise import ShardedSampler, when, which
from shardwise.tools.cli import main

FACTORY = """
from torch.utils.data import DataLoader
from shardwise import Mixture, MixtureSampler, ScheduledBatchSampler, ShardedSampler

def make_loader(rank=0, world_size=1):
    return DataLoader(range(500), batch_size=4, sampler=ShardedSampler(500, num_replicas=world_size, rank=rank, seed=7))

def make_other(rank=0, world_size=1):
    return DataLoader(range(499), batch_size=4, sampler=ShardedSampler(499, num_replicas=world_size, rank=rank, seed=7))

def make_scheduled(rank=0, world_size=1):
    return ScheduledBatchSampler(1000, batch_size=4, num_replicas=world_size, rank=rank, seed=1)

def make_broken(rank=0, world_size=1):
    raise RuntimeError("no such bucket: s3://nowhere\\nsecond line")

def make_mixture(rank=0, world_size=1):
    data = Mixture({"web": range(100), "code": range(40)})
    return MixtureSampler(data, [0.7, 0.3], num_samples=200, num_replicas=world_size, rank=rank, seed=7)
"""


@pytest.fixture
def factory(tmp_path: Path) -> Path:
    path = tmp_path / "factory.py"
    path.write_text(FACTORY)
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def _sampler(world_size: int = 3) -> ShardedSampler:
    return ShardedSampler(500, num_replicas=world_size, rank=0, seed=7)


def test_json_and_table_give_what_which_gives(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints every rank's batch of the step, as the API computes it; the table shows the same ids."""
    code, out, _ = _run(["which", f"{factory}:make_loader", "-w", "3", "--step", "5", "--epoch", "2", "--json"], capsys)
    assert code == 0
    expected = [b.to_dict() for b in which(_sampler(), epoch=2, step=5, batch_size=4)]
    assert json.loads(out) == {"batches": expected}
    code, out, _ = _run(
        ["which", f"{factory}:make_loader", "-w", "3", "--step", "5", "--epoch", "2", "-r", "1"], capsys
    )
    assert code == 0 and ", ".join(map(str, expected[1]["indices"])) in out


def test_sample_lookup_over_epochs(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--sample with --epochs lists every (epoch, step, rank) at which the sample trains."""
    argv = ["which", f"{factory}:make_loader", "-w", "3", "--sample", "123", "--epochs", "0:4", "--json"]
    code, out, _ = _run(argv, capsys)
    expected = [t.to_dict() for t in when(_sampler(), 123, epochs=range(4), batch_size=4)]
    assert code == 0 and json.loads(out) == {"trained": expected} and len(expected) == 4


def test_mixture_table_names_sources(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mixture's samples show as 'id (source[index within source])'."""
    code, out, _ = _run(["which", f"{factory}:make_mixture", "-w", "2", "--step", "0", "-b", "4", "--json"], capsys)
    batches = json.loads(out)["batches"]
    assert code == 0 and {name for b in batches for name in b["sources"]} <= {"web", "code"}


def test_state_numbers_steps_from_the_checkpoint(
    factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --state (a checkpoint dict saved by torch.save), step 0 is the first step after that checkpoint."""
    sampler = ShardedSampler(500, num_replicas=2, rank=0, seed=7)
    sampler.set_epoch(1)
    for step, _ in enumerate(DataLoader(range(500), batch_size=4, sampler=sampler)):
        if step == 9:
            break
    state = sampler.state_dict()
    torch.save({"model": {"w": torch.zeros(2)}, "sampler": state}, tmp_path / "ckpt.pt")
    argv = ["which", f"{factory}:make_loader", "-w", "3", "--step", "0", "--state", str(tmp_path / "ckpt.pt"), "--json"]
    code, out, _ = _run(argv, capsys)
    expected = which(_sampler(), epoch=1, step=0, batch_size=4, start=state["consumed"])
    assert code == 0 and json.loads(out)["batches"] == [b.to_dict() for b in expected]
    assert state["consumed"] == 80 and expected[0].epoch == 1


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--step", "1", "--sample", "3"], "either --step"),
        ([], "either --step"),
        (["--step", "999"], "step should be in [0, 41]"),
        (["--sample", "3", "--epochs", "2:1"], "--epochs should be a non-empty range"),
        (["--sample", "3", "--epochs", "a"], "--epochs 'a'"),
        (["--sample", "500"], "index should be a sample id in [0, 499]"),
        (["--step", "3", "--epochs", "9:1"], "--epochs should be a non-empty range 'first:stop'"),
        (["--step", "3", "--epochs", "1:2"], "--epochs applies to --sample"),
        (["--step", "0", "--state", "missing.pt"], "--state 'missing.pt' does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    factory: Path, extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every bad input is one stderr line naming the option and the accepted values, exit status 2."""
    code, _, err = _run(["which", f"{factory}:make_loader", "-w", "3", *extra], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_sample_past_the_data_is_one_line_exit_2(factory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--sample of an id the sampler does not have: one line naming the range, exit 2 (was a traceback, exit 1)."""
    code, _, err = _run(["which", f"{factory}:make_scheduled", "-w", "2", "--sample", "1000"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "index should be a sample id in [0, 999] (ScheduledBatchSampler draws from 1000 sample ids)" in err


def test_bad_target_and_state_of_other_data_exit_2(
    factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing factory, a mixture without --batch-size, and a state of other data are one-line errors."""
    code, _, err = _run(["which", f"{factory}:nope", "-w", "2", "--step", "0"], capsys)
    assert code == 2 and "has no attribute 'nope'" in err
    code, _, err = _run(["which", f"{factory}:make_mixture", "-w", "2", "--step", "0"], capsys)
    assert code == 2 and "pass --batch-size" in err
    torch.save(_sampler().state_dict(), tmp_path / "state.pt")
    code, _, err = _run(["which", f"{factory}:make_other", "-w", "2", "--step", "0", "--state",
                         str(tmp_path / "state.pt")], capsys)  # fmt: skip
    assert code == 2 and "num_samples=500, but this sampler has num_samples=499" in err
    (tmp_path / "junk.json").write_text(json.dumps({"model": 1}))
    code, _, err = _run(["which", f"{factory}:make_loader", "-w", "2", "--step", "0", "--state",
                         str(tmp_path / "junk.json")], capsys)  # fmt: skip
    assert code == 2 and "no shardwise sampler state" in err


@pytest.mark.parametrize("command", ["which", "skip"])
def test_a_factory_that_raises_is_one_line_exit_2(
    command: str, factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A factory that raises: one line naming the call and the error, exit 2, as verify (was a traceback, exit 1)."""
    torch.save(_sampler().state_dict(), tmp_path / "state.pt")
    extra = ["--step", "0"] if command == "which" else ["--state", str(tmp_path / "state.pt"), "--steps", "0:1",
                                                        "--out", str(tmp_path / "out.pt")]  # fmt: skip
    code, _, err = _run([command, f"{factory}:make_broken", "-w", "2", *extra], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"calling {factory}:make_broken as rank 0 of 2 raised RuntimeError: no such bucket: s3://nowhere" in err


def _state_after_ten_steps() -> dict[str, Any]:
    """Rank 0 of 2 over 500 samples (seed 7), saved after 10 steps of batch 4 through a DataLoader."""
    sampler = ShardedSampler(500, num_replicas=2, rank=0, seed=7)
    for step, _ in enumerate(DataLoader(range(500), batch_size=4, sampler=sampler)):
        if step == 9:
            break
    return sampler.state_dict()


def test_skip_edits_a_checkpoint_so_the_steps_never_train(
    factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`shardwise skip` adds steps 2-4 after a checkpoint to its ledger: the resumed step 2 is the old step 5."""
    state = _state_after_ten_steps()
    torch.save({"model": {"w": torch.zeros(2)}, "sampler": state}, tmp_path / "ckpt.pt")
    argv = ["skip", f"{factory}:make_loader", "-w", "3", "--state", str(tmp_path / "ckpt.pt"), "--steps", "2:5",
            "--out", str(tmp_path / "edited.pt")]  # fmt: skip
    code, out, _ = _run(argv, capsys)
    assert code == 0 and "never trained" in out
    edited = torch.load(tmp_path / "edited.pt", weights_only=True)
    assert edited["model"]["w"].shape == (2,) and edited["sampler"]["consumed"] == state["consumed"]
    skipped = {i for s in range(2, 5) for b in which(_sampler(), epoch=0, step=s, batch_size=4,
                                                     start=state["consumed"]) for i in b.indices}  # fmt: skip
    rest = []
    for rank in range(3):
        resumed = ShardedSampler(500, num_replicas=3, rank=rank, seed=7)
        resumed.load_state_dict(edited["sampler"])
        rest += list(resumed)
    assert len(skipped) == 36 and not skipped & set(rest) and len(rest) == len(set(rest))
    old_step_5 = which(_sampler(), epoch=0, step=5, batch_size=4, start=state["consumed"])
    resumed = ShardedSampler(500, num_replicas=3, rank=0, seed=7)
    resumed.load_state_dict(edited["sampler"])
    new_step_2 = which(resumed, epoch=0, step=2, batch_size=4, start=state["consumed"])
    assert [b.indices for b in new_step_2] == [b.indices for b in old_step_5]
    code, _, err = _run([*argv[:-4], "--steps", "5:2", "--out", str(tmp_path / "x.pt")], capsys)
    assert code == 2 and "--steps should be a non-empty range" in err


def test_skip_ids_edits_a_checkpoint_so_the_ids_never_train_again(
    factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`shardwise skip --ids` records id ranges in a JSON state: a resume at another W and the next epoch lack them."""
    state = _state_after_ten_steps()
    (tmp_path / "state.json").write_text(json.dumps(state))
    argv = ["skip", f"{factory}:make_loader", "-w", "3", "--state", str(tmp_path / "state.json"), "--ids", "100-149",
            "--ids", "7,300-301", "--out", str(tmp_path / "edited.json")]  # fmt: skip
    code, out, _ = _run(argv, capsys)
    assert code == 0 and "100-149, 7-7, 300-301" in out
    edited = json.loads((tmp_path / "edited.json").read_text())
    assert edited["skip_ids"] == [[0, state["consumed"], 100, 150], [0, state["consumed"], 7, 8],
                                  [0, state["consumed"], 300, 302]]  # fmt: skip
    skipped = set(range(100, 150)) | {7, 300, 301}
    for epoch in (0, 1):
        seen = []
        for rank in range(3):
            resumed = ShardedSampler(500, num_replicas=3, rank=rank, seed=7)
            resumed.load_state_dict(edited)
            if epoch:
                resumed.set_epoch(epoch)
            seen += list(resumed)
        assert not skipped & set(seen) and len(seen) - len(set(seen)) < 3  # padding repeats at most W - 1
        if epoch == 1:
            assert set(seen) == set(range(500)) - skipped
    code, _, err = _run([*argv[:6], "--ids", "9-3", "--out", str(tmp_path / "x.json")], capsys)
    assert code == 2 and "--ids should be ranges 'A-B' with 0 <= A <= B" in err
    code, _, err = _run([*argv[:6], "--ids", "1-2", "--steps", "1:2", "--out", str(tmp_path / "x.json")], capsys)
    assert code == 2 and "exactly one of --steps" in err
    code, _, err = _run([*argv[:6], "--ids", "499-500", "--out", str(tmp_path / "x.json")], capsys)
    assert code == 2 and "--ids should hold sample ids in [0, 499]" in err
