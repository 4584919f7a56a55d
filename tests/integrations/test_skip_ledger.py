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
from shardwise.tools.which import load_state_file

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
    assert not skipped & set(trained), sorted(skipped & set(trained))
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


def run_cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``shardwise ...`` that must fail as bad input: exit 2, one line on stderr (returned)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def _epoch_batches(ranks: list[dict[str, Any]], epoch: int) -> list[list[list[int]]]:
    """Per rank, the samples of the batches of ``epoch`` (the examples record ``[epoch, *ids]``)."""
    return [[batch[1:] for batch in rank["seen"] if batch[0] == epoch] for rank in ranks]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_accelerate_save_state_then_shardwise_skip_on_dl_state_dict(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Accelerate save_state after 2 steps (1 process); `shardwise skip` on dl_state_dict.bin; 2 ranks resume without them."""
    import importlib.util

    from accelerate import Accelerator, DataLoaderConfiguration

    from tests.integrations.test_accelerate import EXAMPLE, _launch, _seen

    spec = importlib.util.spec_from_file_location("accelerate_ddp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    folder = tmp_path / "state"
    # The first run in this process (world size 1, to save a process start); the ledger is world-size free.
    example.SAVE_AT = 2  # 2 batches trained, 4 skipped: 10 left, 5 a rank, nothing padded
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    run, _ = example.train(accelerator, str(folder), resume=False)
    err = run_cli_error(["skip", f"{EXAMPLE}:build_loader", "-w", "2", "--state", str(folder), "--steps", "1:3",
                         "--out", str(tmp_path / "x.bin")], capsys)  # fmt: skip
    assert str(folder / "dl_state_dict.bin") in err
    saved = load_state_file(folder / "dl_state_dict.bin")
    skipped = skipped_samples(_example_loader(EXAMPLE, "build_loader"), epoch=0, steps=range(1, 3), world_size=2,
                              start=saved["consumed"], batch_size=None)  # fmt: skip
    run_cli(["skip", f"{EXAMPLE}:build_loader", "-w", "2", "--state", str(folder / "dl_state_dict.bin"),
             "--steps", "1:3", "--out", str(folder / "dl_state_dict.bin")])  # fmt: skip
    _launch(tmp_path, "--resume")
    resumed = _seen(tmp_path, "resume")
    check_epoch([b[1:] for b in run[:2]], _epoch_batches(resumed, 0), skipped, example.N)
    assert len(skipped) == 2 * 2 * 4  # 2 steps of 2 ranks, 4 samples a batch
    check_epoch([], _epoch_batches(resumed, 1), set(), example.N)  # the next epoch whole: the ledger is per epoch


def _example_loader(path: Path, name: str) -> Any:
    """Build a loader with an example's factory, as ``shardwise skip`` does."""
    from shardwise.tools.verify.target import call_factory, load_spec

    return call_factory(load_spec(f"{path}:{name}"), 0, 2)


def _train_three_steps(example: Any, out: Path) -> list[list[int]]:
    """The example's Trainer in this process (world size 1, to save a process start), stopped at checkpoint-3."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=example.VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0)  # fmt: skip
    args = TrainingArguments(str(out / "checkpoints"), train_sampling_strategy="random", per_device_train_batch_size=4,
                             max_steps=3, save_strategy="steps", save_steps=3, remove_unused_columns=False,
                             use_cpu=True, seed=7, report_to="none", disable_tqdm=True, logging_strategy="no")  # fmt: skip
    trainer = example.RecordingTrainer(model=GPT2LMHeadModel(config), args=args,
                                       train_dataset=example.TokenDataset(example.N), data_collator=example.collate)  # fmt: skip
    trainer.train()
    return trainer.seen  # type: ignore[no-any-return]


def trainer_sampler(rank: int = 0, world_size: int = 1) -> Any:
    """The sampler ShardwiseTrainer builds in examples/transformers_trainer.py for ``--strategy random``."""
    from tests.integrations.test_transformers import _example

    example = _example()
    return shardwise.ShardedSampler(example.TokenDataset(example.N), num_replicas=world_size, rank=rank, seed=7)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_trainer_checkpoint_then_shardwise_skip_on_shardwise_sampler_json(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """ShardwiseTrainer checkpoint-3 (1 process); `shardwise skip` on its shardwise_sampler.json; 2 ranks resume without them."""
    from tests.integrations.test_transformers import _example, _launch

    example = _example()
    run = _train_three_steps(example, tmp_path)
    folder = tmp_path / "checkpoints" / "checkpoint-3"
    err = run_cli_error(["skip", f"{__file__}:trainer_sampler", "-w", "2", "--state", str(folder), "--steps", "2:4",
                         "-b", "4", "--out", str(tmp_path / "x.json")], capsys)  # fmt: skip
    assert str(folder / "shardwise_sampler.json") in err
    saved = load_state_file(folder / "shardwise_sampler.json")
    skipped = skipped_samples(trainer_sampler(), epoch=0, steps=range(2, 4), world_size=2, start=saved["consumed"])
    run_cli(["skip", f"{__file__}:trainer_sampler", "-w", "2", "--state", str(folder / "shardwise_sampler.json"),
             "--steps", "2:4", "-b", "4", "--out", str(folder / "shardwise_sampler.json")])  # fmt: skip
    _launch(tmp_path, 2, "--strategy", "random", "--epochs", "1", "--save-steps", "100", "--resume", str(folder))
    resumed = [json.loads((tmp_path / f"resume-rank{rank}.json").read_text())["seen"] for rank in (0, 1)]
    check_epoch([b[1:] for b in run[:3]], [[b[1:] for b in rank] for rank in resumed], skipped, example.N)
    assert len(skipped) == 2 * 2 * 4 and len(resumed[0]) == 9  # 68 left: 34 a rank, in batches of 4


def lightning_loader(rank: int = 0, world_size: int = 1) -> Any:
    """tests/integrations/test_lightning.py's StatefulDataLoader over a ShardedSampler (also the `skip` target)."""
    from tests.integrations.test_lightning import loader_for

    return loader_for("ShardedSampler", stateful=True)


def _lightning_save_skip_resume(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    """Fit 1 step with a checkpoint; rank 0 runs `shardwise skip` on mid.ckpt; both ranks fit from the edited copy."""
    import time

    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.integrations.test_lightning import _join_as_ddp, _module, _trainer

    _join_as_ddp(rank)
    first = _module(lightning_loader, in_hook=True)
    every = ModelCheckpoint(dirpath=directory, filename="mid", every_n_train_steps=1, save_top_k=1, monitor=None)
    _trainer(max_epochs=1, enable_checkpointing=True, callbacks=[every], max_steps=1).fit(first)
    mid, edited, done = (Path(directory, name) for name in ("mid.ckpt", "skipped.ckpt", "skipped.done"))
    if rank == 0:
        run_cli(["skip", f"{__file__}:lightning_loader", "-w", "2", "--state", str(mid), "--steps", "1:2",
                 "-b", str(BATCH), "--out", str(edited)])  # fmt: skip
        done.touch()
    deadline = time.monotonic() + 60
    while not done.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("rank 0 did not write skipped.ckpt within 60 s")
        time.sleep(0.1)
    resumed = _module(lightning_loader, in_hook=True)
    _trainer(max_epochs=1).fit(resumed, ckpt_path=str(edited))
    return {"first": [b for _, b in first.seen], "second": [b for _, b in resumed.seen]}


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_lightning_checkpoint_then_shardwise_skip_on_the_ckpt(lightning_ranks: dict[str, Any]) -> None:
    """Lightning Trainer (2 ranks) checkpoints after 1 step; `shardwise skip` on mid.ckpt; fit(ckpt_path=) skips them.

    _lightning_save_skip_resume runs in the pair of ranks of tests/integrations/test_lightning.py (tests/conftest.py)."""
    from tests.integrations.test_lightning import N as LIGHTNING_N

    ranks = [rank["skip"] for rank in lightning_ranks["ranks"]]
    saved = load_state_file(lightning_ranks["directories"]["skip"] / "mid.ckpt")
    skipped = skipped_samples(shardwise.ShardedSampler(LIGHTNING_N), epoch=0, steps=range(1, 2), world_size=2,
                              start=saved["consumed"])  # fmt: skip
    assert saved["consumed"] == 2 * BATCH and len(skipped) == 2 * BATCH  # 24 left: 3 batches a rank
    check_epoch([b for rank in ranks for b in rank["first"]], [rank["second"] for rank in ranks], skipped, LIGHTNING_N)


def fabric_loader(rank: int = 0, world_size: int = 1) -> Any:
    """examples/fabric_ddp.py's ShardedSampler loader (the `shardwise skip` target)."""
    from tests.integrations.test_fabric import _example

    return _example().build_loader("ShardedSampler", num_replicas=world_size, rank=rank)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_fabric_save_then_shardwise_skip_on_the_ckpt_resumed_on_one_device(fabric_runs: dict[str, Path],
                                                                          tmp_path: Path) -> None:  # fmt: skip
    """fabric.save mid-epoch 1 on 2 ranks; `shardwise skip` on the .ckpt; fabric.load on 1 device trains the rest but those."""
    import shutil
    import subprocess
    import sys

    from tests.integrations.test_fabric import ENV, EXAMPLE, ROOT, _example

    def launch(*options: str) -> None:
        command = [sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--kinds", "ShardedSampler", *options]
        result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=150, check=False)
        assert result.returncode == 0, (options, result.stderr[-4000:])

    example = _example()
    # The example's --save run on 2 ranks (tests/integrations/conftest.py's fabric_runs, all kinds, ShardedSampler
    # first): its checkpoint and batches, copied here to be edited.
    for name in ("ShardedSampler.ckpt", "save-rank0.json", "save-rank1.json"):
        shutil.copy(fabric_runs["resume"] / name, tmp_path / name)
    ckpt = tmp_path / "ShardedSampler.ckpt"
    saved = load_state_file(ckpt)
    assert (saved["epoch"], saved["consumed"]) == (1, 2 * 2 * example.BATCH)  # save_point: 2 steps into epoch 1
    skipped = skipped_samples(fabric_loader(0, 2), epoch=1, steps=range(1, 2), world_size=1, start=saved["consumed"])
    run_cli(["skip", f"{__file__}:fabric_loader", "-w", "1", "--state", str(ckpt), "--steps", "1:2",
             "--out", str(ckpt)])  # fmt: skip
    launch("--resume", "--devices", "1")
    before = [json.loads((tmp_path / f"save-rank{rank}.json").read_text())["ShardedSampler"] for rank in (0, 1)]
    after = json.loads((tmp_path / "resume-rank0.json").read_text())["ShardedSampler"]
    check_epoch([b[1:] for rank in before for b in rank if b[0] == 1], [[b[1:] for b in after if b[0] == 1]],
                skipped, example.N)  # fmt: skip
    assert len(skipped) == example.BATCH and not [b for b in after if b[0] != 1]


def test_a_folder_without_a_known_state_file_names_each_frameworks_file(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`shardwise skip --state <folder>` with no known file in it: one line naming each framework's file."""
    err = run_cli_error(["skip", f"{__file__}:torchdata_loader", "-w", "2", "--state", str(tmp_path), "--steps", "0:1",
                         "--out", str(tmp_path / "x.pt")], capsys)  # fmt: skip
    assert "is a folder" in err and "shardwise_sampler.json" in err and "dl_state_dict.bin" in err and ".ckpt" in err
