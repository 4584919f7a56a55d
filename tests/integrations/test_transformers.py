"""HF transformers Trainer: 2 real processes (torchrun, gloo) running examples/transformers_trainer.py.

The three multi-process Trainer tests read the runs of one module fixture (``trainer_runs``): 4 launches of
example_phases.py, each running the example once per phase, instead of 10 launches of the example.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

import shardwise
from tests.lockstep import fork_is_safe

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "transformers_trainer.py"
PHASES = Path(__file__).with_name("example_phases.py")  # several runs of an example in one launch
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
WORKERS_CONTEXT = () if fork_is_safe() else ("--mp-context", "forkserver")  # gh-112275: see lockstep.worker_context
BATCH, PER_EPOCH = 4, 12  # 96 samples, 4 per batch, 2 ranks: 12 batches per rank and epoch


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("transformers_trainer_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(out: Path, world_size: int, *options: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world_size), "--standalone",
               str(EXAMPLE), "--out", str(out), *options]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=150, check=False)
    assert result.returncode == 0, result.stderr[-4000:]


def _seen(out: Path, phase: str, world_size: int = 2) -> list[list[list[int]]]:
    """Per rank, the samples of every trained batch (global step dropped)."""
    ranks = [json.loads((out / f"{phase}-rank{rank}.json").read_text()) for rank in range(world_size)]
    return [[batch[1:] for batch in rank["seen"]] for rank in ranks]


def _epochs(ranks: list[list[list[int]]]) -> list[list[int]]:
    """All samples trained per epoch, over both ranks (PER_EPOCH batches per rank and epoch)."""
    return [[i for rank in ranks for batch in rank[e * PER_EPOCH:(e + 1) * PER_EPOCH] for i in batch] for e in (0, 1)]


def _waste(batches: list[list[int]], lengths: np.ndarray) -> float:
    """Padded positions over all positions when each batch is padded to its longest sample."""
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    return 1 - sum(int(lengths[b].sum()) for b in batches) / padded


def _records(out: Path, phase: str, world_size: int) -> list[tuple[int, int, list[int]]]:
    """Every batch trained, over all ranks: (global step before it, epoch, samples)."""
    records = []
    for rank in range(world_size):
        saved = json.loads((out / f"{phase}-rank{rank}.json").read_text())
        records += [(batch[0], epoch, batch[1:]) for batch, epoch in zip(saved["seen"], saved["epochs"], strict=True)]
    return records


def _states(out: Path) -> dict[int, dict[str, Any]]:
    """shardwise_sampler.json of every checkpoint, by global step."""
    folders = (out / "checkpoints").glob("checkpoint-*")
    return {int(folder.name.split("-")[1]): json.loads((folder / "shardwise_sampler.json").read_text()) for folder in folders}


# The chain test's links: (world size, resumed from (link, step)); "replay" resumes from "plain", a copy of
# run's checkpoint-2 as a plain Trainer saves it (without shardwise_sampler.json): it replays 2 steps of 2
# batches, with the warning. World size 1 saves checkpoint-12 4 steps into epoch 1 (8 steps an epoch).
CHAIN = ("--strategy", "random", "--grad-accum", "2", "--save-steps", "2")  # 6 optimizer steps an epoch on 2 ranks
LINKS: dict[str, tuple[int, tuple[str, int] | None]] = {
    "run": (2, None), "replay": (2, ("run", 2)), "same": (2, ("replay", 4)), "one": (1, ("replay", 4)),
    "two": (2, ("one", 12)),
}  # fmt: skip


def _launch_phases(spec: Path, world_size: int, phases: list[Any]) -> None:
    """One launch of ``world_size`` ranks running the example once per phase, in turn (example_phases.py)."""
    spec.write_text(json.dumps(phases))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world_size), "--standalone",
               str(PHASES), EXAMPLE.stem, str(spec)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, (phases, result.stderr[-4000:])


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The example's runs of the three Trainer tests below, each test in its own folder, in 3 launches.

    A launch costs ~10 s of process starts and imports (a phase ~1 s), so runs of one world size share a
    launch: the first runs and the chain's "replay" (2 ranks), the resumes on 1 rank, then the other
    resumes on 2 ranks. Every resume runs in processes started after its checkpoint was written, as a
    launch per run did, except "replay", which resumes the copy of "run"'s checkpoint in the processes
    that wrote it (a plain checkpoint: Trainer replays, shardwise warns).
    """
    base = tmp_path_factory.mktemp("trainer")
    two, group, chain = base / "two_ranks", base / "group_by_length", base / "chain"

    def link(name: str) -> list[str]:
        origin = LINKS[name][1]
        if origin is None:
            return ["--out", str(chain / name), *CHAIN]
        parent, step = origin
        folder = chain / "plain" if name == "replay" else chain / parent / "checkpoints" / f"checkpoint-{step}"
        return ["--out", str(chain / name), *CHAIN, "--resume", str(folder)]

    five, gbl = str(two / "checkpoints" / "checkpoint-5"), ("--strategy", "group_by_length", "--grad-accum", "2")
    # "plain": checkpoint-2 as a plain Trainer saves it, without shardwise_sampler.json (a copy step).
    plain = {"copy": str(chain / "run" / "checkpoints" / "checkpoint-2"), "to": str(chain / "plain"),
             "without": "shardwise_sampler.json"}  # fmt: skip
    _launch_phases(base / "first.json", 2, [
        ["--out", str(two), "--strategy", "random", "--save-steps", "5", "--workers", "2", *WORKERS_CONTEXT],
        ["--out", str(group), *gbl, "--save-steps", "2"],
        link("run"),
        plain,
        link("replay"),
    ])  # fmt: skip
    _launch_phases(base / "one.json", 1, [
        ["--out", str(two), "--strategy", "random", "--phase", "elastic", "--resume", five],
        ["--out", str(group), *gbl, "--workers", "2", *WORKERS_CONTEXT,
         "--resume", str(group / "checkpoints" / "checkpoint-2")],
        link("one"),
    ])  # fmt: skip
    _launch_phases(base / "last.json", 2, [["--out", str(two), "--strategy", "random", "--resume", five],
                                           link("same"), link("two")])  # fmt: skip
    return {"two_ranks": two, "group_by_length": group, "chain": chain}


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_trainer_two_ranks_every_sample_once_and_resume_without_replay(trainer_runs: dict[str, Path]) -> None:
    """random: every sample once per epoch, equal steps, new order; a mid-epoch checkpoint resumes exactly, on 2 or 1 ranks."""
    tmp_path = trainer_runs["two_ranks"]  # run: 2 ranks, 2 workers, --save-steps 5
    run = _seen(tmp_path, "run")
    assert len(run[0]) == len(run[1]) == 2 * PER_EPOCH
    first, second = _epochs(run)
    assert Counter(first) == Counter(second) == Counter(range(96))
    assert first != second
    # The checkpoint after 5 steps: the resumed run (no workers, new processes) trains exactly the rest.
    resumed = _seen(tmp_path, "resume")
    assert [rank[5:] for rank in run] == resumed
    state = json.loads((tmp_path / "checkpoints" / "checkpoint-5" / "shardwise_sampler.json").read_text())
    assert (state["sampler"]["epoch"], state["sampler"]["consumed"], state["world_size"]) == (0, 5 * BATCH * 2, 2)
    # The same checkpoint on ONE process: the rest of epoch 0 is exactly the samples the 2 ranks had not trained.
    elastic = _seen(tmp_path, "elastic", world_size=1)[0]
    rest = 96 // BATCH - 5 * 2  # batches of 4 left in epoch 0 at world size 1
    before = [i for rank in run for batch in rank[:5] for i in batch]
    assert Counter(before + [i for batch in elastic[:rest] for i in batch]) == Counter(range(96))
    assert len(elastic) == rest + 96 // BATCH
    assert Counter(i for batch in elastic[rest:] for i in batch) == Counter(range(96))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_trainer_group_by_length_pads_less_and_resumes_at_another_world_size(trainer_runs: dict[str, Path]) -> None:
    """group_by_length: BucketBatchSampler, less padding than LengthGroupedSampler; resume on 1 rank continues the plan."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    tmp_path = trainer_runs["group_by_length"]  # run: 2 ranks, --grad-accum 2 --save-steps 2
    run = _seen(tmp_path, "run")
    assert len(run[0]) == len(run[1]) == 2 * PER_EPOCH
    first, second = _epochs(run)
    assert Counter(first) == Counter(second) == Counter(range(96))
    assert first != second

    lengths = np.array([len(s) for s in _example().TokenDataset(96).samples])
    ours = _waste([batch for rank in run for batch in rank], lengths)
    theirs = []
    for seed in range(4):  # what Trainer's own group_by_length trains on, over the same data and batch size
        order = list(LengthGroupedSampler(BATCH * 2, lengths=lengths.tolist(), generator=torch.Generator().manual_seed(seed)))
        theirs.append(_waste([order[i:i + BATCH] for i in range(0, 96, BATCH)], lengths))
    assert ours < 0.5 * float(np.mean(theirs)), (ours, theirs)

    # checkpoint-2 (2 optimizer steps x 2 accumulated batches per rank), resumed on ONE process with
    # 2 workers: it trains the rest of the global plan in plan order, i.e. the 2 ranks' batches interleaved.
    resumed = _seen(tmp_path, "resume", world_size=1)[0]
    assert resumed == [run[rank][step] for step in range(4, 2 * PER_EPOCH) for rank in (0, 1)]
    final: dict[str, Any] = json.loads((tmp_path / "resume-rank0.json").read_text())
    assert final["global_step"] == 2 + (2 * 2 * PER_EPOCH - 8) // 2  # the step budget follows the world size


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_trainer_resume_chains_from_a_plain_checkpoint_across_world_sizes(trainer_runs: dict[str, Path]) -> None:
    """plain -> shardwise -> shardwise on 2 ranks, and on 2 -> 1 -> 2, accumulating 2: nothing lost or repeated, states exact."""
    tmp_path, links = trainer_runs["chain"], LINKS  # each link's run in tmp_path / link (see LINKS and trainer_runs)
    history: dict[str, list[tuple[int, int, list[int]]]] = {"run": _records(tmp_path / "run", "run", 2)}
    for name, (world_size, origin) in links.items():
        if origin is None:
            continue
        parent, step = origin
        # What the chain trained: the parent's history before the checkpoint, then this link's batches.
        history[name] = [r for r in history[parent] if r[0] < step] + _records(tmp_path / name, "resume", world_size)

    for name, records in history.items():
        for epoch in (0, 1):  # every sample exactly once an epoch: 0 lost, 0 repeated
            assert Counter(i for _, e, ids in records if e == epoch for i in ids) == Counter(range(96)), (name, epoch)
        for step, state in _states(tmp_path / name).items():  # each saved position: the samples trained in its epoch
            epoch, consumed = state["sampler"]["epoch"], state["sampler"]["consumed"]
            trained = sum(len(ids) for s, e, ids in records if s < step and e == epoch)
            assert (consumed, state["world_size"]) == (trained, links[name][0]), (name, step)
    run, states = _seen(tmp_path / "run", "run"), _states(tmp_path / "run")
    for name, start in (("replay", 2), ("same", 4)):  # same world size: the uninterrupted run's batches and states
        assert _seen(tmp_path / name, "resume") == [rank[start * 2:] for rank in run], name
        assert _states(tmp_path / name) == {step: states[step] for step in states if step > start}, name
    assert json.loads((tmp_path / "two" / "resume-rank0.json").read_text())["global_step"] == 12 + 4


def test_default_sampler_follows_training_arguments() -> None:
    """train_sampling_strategy picks ShardedSampler (shuffled or not) or BucketBatchSampler; others are refused."""
    from transformers import TrainingArguments

    import shardwise
    from shardwise.integrations.transformers import default_train_sampler

    data = [{"input_ids": [1] * (i % 7 + 1)} for i in range(20)]

    def args(strategy: str) -> Any:
        return TrainingArguments("unused", train_sampling_strategy=strategy, per_device_train_batch_size=3,
                                 seed=5, report_to="none", use_cpu=True)  # fmt: skip

    random, sequential = default_train_sampler(data, args("random")), default_train_sampler(data, args("sequential"))
    assert isinstance(random, shardwise.ShardedSampler) and random.shuffle and random.seed == 5
    assert isinstance(sequential, shardwise.ShardedSampler) and not sequential.shuffle
    bucket = default_train_sampler(data, args("group_by_length"))
    assert isinstance(bucket, shardwise.BucketBatchSampler) and bucket.batch_size == 3
    assert bucket.lengths.tolist() == [i % 7 + 1 for i in range(20)]
    with pytest.raises(ValueError, match=r"train_sampling_strategy='batch_rebalance'.*train_sampler="):
        default_train_sampler(data, args("batch_rebalance"))
    with pytest.raises(ValueError, match=r"reads lengths from each sample's 'input_ids'"):
        default_train_sampler([{"text": [1]}] * 4, args("group_by_length"))


def test_trainer_refuses_a_train_sampler_that_is_not_shardwise() -> None:
    """train_sampler must be a shardwise sampler or a factory; the message names the value."""
    from shardwise.integrations.transformers import ShardwiseTrainer

    with pytest.raises(TypeError, match=r"train_sampler should be a shardwise sampler.*got train_sampler=3"):
        ShardwiseTrainer(train_sampler=3)


WANTED = r"train_sampler should be a shardwise sampler or batch sampler instance, or a callable \(train_dataset, args\)"


@pytest.mark.parametrize(
    ("make", "names"),
    [
        pytest.param(lambda: shardwise.ShardedSampler,
                     r"the class ShardedSampler with signature \(dataset, num_replicas.*instead: train_sampler=Sharded", id="class"),
        pytest.param(lambda: shardwise.BucketBatchSampler,
                     r"the class BucketBatchSampler with signature \(lengths, .*does not take the 2", id="batch-class"),
        pytest.param(lambda: functools.partial(shardwise.ShardedSampler, seed=3),
                     r"ShardedSampler'>, seed=3\) with signature \(dataset, num_replicas.*instead: train_sampler=", id="partial"),
        pytest.param(lambda: torch.utils.data.RandomSampler,
                     r"the class RandomSampler, which does not build a shardwise sampler or batch", id="torch-class"),
        pytest.param(lambda: functools.partial(torch.utils.data.RandomSampler, replacement=True),
                     r"RandomSampler'>, replacement=True\), which does not build a shardwise", id="torch-partial"),
        pytest.param(lambda: torch.utils.data.RandomSampler(range(4)),
                     r"got train_sampler=<torch.utils.data.sampler.RandomSampler object .*\(RandomSampler\)", id="torch"),
        pytest.param(lambda: lambda dataset: 0,
                     r"with signature \(dataset\), which does not take the 2 positional arguments", id="1-argument"),
        pytest.param(lambda: lambda dataset, args, seed: 0,
                     r"with signature \(dataset, args, seed\), which does not take the 2", id="3-arguments"),
    ],
)  # fmt: skip
def test_trainer_refuses_a_sampler_class_or_a_factory_of_another_arity_at_construction(
    make: Callable[[], object], names: str
) -> None:
    """A sampler class (or partial), a torch sampler, a factory of 1 or 3 arguments: TypeError at construction."""
    from shardwise.integrations.transformers import ShardwiseTrainer

    with pytest.raises(TypeError, match=WANTED + ".*" + names):
        ShardwiseTrainer(train_sampler=make())


def test_trainer_takes_a_sampler_an_instance_factory_or_a_sampler_class_of_the_factory_arity(tmp_path: Path) -> None:
    """An instance, a (train_dataset, args) callable, a shardwise class built from (train_dataset, args): all train."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    import shardwise

    example = _example()
    data = example.TokenDataset(8)

    class FromArgs(shardwise.ShardedSampler):
        def __init__(self, dataset: Any, args: Any) -> None:
            super().__init__(dataset, seed=args.seed)

    def factory(dataset: Any, args: Any) -> shardwise.ShardedSampler:
        return shardwise.ShardedSampler(dataset, seed=args.seed)

    for source in (shardwise.ShardedSampler(data, seed=7), factory, FromArgs):
        args = TrainingArguments(str(tmp_path), per_device_train_batch_size=BATCH, max_steps=2, use_cpu=True, seed=7,
                                 remove_unused_columns=False, report_to="none", disable_tqdm=True, save_strategy="no")  # fmt: skip
        config = GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
        trainer = example.RecordingTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data,
                                           data_collator=example.collate, train_sampler=source)  # fmt: skip
        trainer.train()
        assert isinstance(trainer.train_sampler, shardwise.ShardedSampler) and trainer.train_sampler.seed == 7
        assert sorted(i for batch in trainer.seen for i in batch[1:]) == list(range(8))


def test_missing_transformers_names_the_install_command() -> None:
    """Without transformers, importing the integration says exactly what to install."""
    code = "import sys; sys.modules['transformers'] = None; import shardwise.integrations.transformers"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=ENV)
    assert result.returncode != 0
    assert "shardwise.integrations.transformers needs 'transformers'; install it with: pip install " \
           "'shardwise[transformers]'" in result.stderr  # fmt: skip


def test_progressive_batch_sizes_resume_at_the_step_they_stopped(tmp_path: Path) -> None:
    """ScheduledBatchSampler (batch size 2, then 4 from sample 8) under the Trainer: a resume from a checkpoint after
    the size change trains exactly the rest (the saved position counts the steps of their sizes)."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    import shardwise

    example = _example()

    def train(resume: str | None) -> list[list[int]]:
        args = TrainingArguments(str(tmp_path / "checkpoints"), per_device_train_batch_size=BATCH, num_train_epochs=2,
                                 save_strategy="steps", save_steps=5, use_cpu=True, remove_unused_columns=False,
                                 report_to="none", disable_tqdm=True, logging_strategy="no")  # fmt: skip
        config = GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
        data = example.TokenDataset(20)
        schedule = shardwise.BatchSizeSchedule.by_samples({0: 2, 8: 4})  # samples of the run: 4 steps of 2, then 4s
        sampler = shardwise.ScheduledBatchSampler(data, batch_size=schedule, seed=3)
        trainer = example.RecordingTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data,
                                           data_collator=example.collate, train_sampler=sampler)  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return [batch[1:] for batch in trainer.seen]

    run = train(None)
    assert [len(batch) for batch in run] == [2, 2, 2, 2, 4, 4, 4] + [4] * 5
    assert train(str(tmp_path / "checkpoints" / "checkpoint-5")) == run[5:]  # mid-epoch 0, after the size change
    assert train(str(tmp_path / "checkpoints" / "checkpoint-10")) == run[10:]  # mid-epoch 1


def test_single_process_resume_with_drop_last_and_from_a_plain_trainer_checkpoint(tmp_path: Path, caplog: Any) -> None:
    """One process, ShardedSampler with drop_last: resume equals the rest; without the shardwise file, Trainer replays."""
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    import shardwise

    example = _example()

    def train(resume: str | None, size: int = 22, ignore_data_skip: bool = False) -> list[list[int]]:
        args = TrainingArguments(str(tmp_path / "checkpoints"), per_device_train_batch_size=BATCH, num_train_epochs=2,
                                 save_strategy="steps", save_steps=6, dataloader_drop_last=True, use_cpu=True,
                                 remove_unused_columns=False, report_to="none", disable_tqdm=True, logging_strategy="no",
                                 ignore_data_skip=ignore_data_skip)  # fmt: skip
        config = GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
        data = example.TokenDataset(size)  # 22: 5 batches of 4 per epoch, 2 samples dropped
        trainer = example.RecordingTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data,
                                           data_collator=example.collate, train_sampler=shardwise.ShardedSampler(data, seed=3))  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return [batch[1:] for batch in trainer.seen]

    run = train(None)  # saves checkpoint-6 only (save_steps=6): the one every resume below reads
    assert len(run) == 10 and all(len(batch) == BATCH for batch in run)
    assert train(str(tmp_path / "checkpoints" / "checkpoint-6")) == run[6:]  # mid-epoch 1
    plain = tmp_path / "plain-checkpoint"
    shutil.copytree(tmp_path / "checkpoints" / "checkpoint-6", plain)
    (plain / "shardwise_sampler.json").unlink()
    with caplog.at_level("WARNING", logger="shardwise"):
        assert train(str(plain)) == run[6:]
    assert "resuming as Trainer does, by replaying" in caplog.text
    # A checkpoint of other data: refused before the first step, naming what a Trainer user does (not rebase_state)
    with pytest.raises(shardwise.StateMismatchError, match=r"num_samples=22.*ignore_data_skip=True") as refused:
        train(str(tmp_path / "checkpoints" / "checkpoint-6"), size=26)
    assert "rebase_state" not in str(refused.value)
    assert len(train(str(tmp_path / "checkpoints" / "checkpoint-6"), size=26, ignore_data_skip=True)) == 6
