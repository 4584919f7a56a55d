"""Lightning: every shardwise sampler under real ``Trainer(strategy="ddp", devices=2)`` runs on CPU.

Each test starts two real gloo ranks (``run_distributed``; five tests share one start, the module
fixture ``fits``, with the Lightning runs of test_crash_resume.py and test_skip_ledger.py) and runs several ``Trainer.fit`` calls inside them: Lightning's DDP strategy finds the
process group already initialised (``LOCAL_RANK`` set, processes created externally, as under torchrun)
and joins it, so one process start serves many fits. DDP all-reduces gradients every step, so ranks
with different step counts would time out rather than hang. Every rank returns what it saw; the
assertions run in the test process.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

import shardwise
from shardwise.samplers.base import PlanSampler
from shardwise.tools.launch import run_distributed
from shardwise.tools.scenarios import IndexDataset as Indices

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

N = 40
TWO_STREAM_N, PRIMARY = 120, 24


def make(name: str, **world: Any) -> Any:
    """A shardwise sampler (index: units are ints) or batch sampler by name, over ``N`` samples."""
    rng = np.random.default_rng(0)
    schedule = shardwise.BatchSizeSchedule.by_samples({0: 2, 16: 4})
    makers: dict[str, Any] = {
        "ShardedSampler": lambda: shardwise.ShardedSampler(N, **world),
        "shard": lambda: shardwise.shard(RandomSampler(range(N)), **world),
        "WeightedSampler": lambda: shardwise.WeightedSampler(rng.random(N) + 0.1, num_samples=N, **world),
        "shard_batches": lambda: shardwise.shard_batches(BatchSampler(RandomSampler(range(N)), 4, False), **world),
        "TwoStreamBatchSampler": lambda: shardwise.TwoStreamBatchSampler(
            range(PRIMARY), range(PRIMARY, TWO_STREAM_N), primary_batch_size=4, secondary_batch_size=4, **world
        ),
        "BucketBatchSampler": lambda: shardwise.BucketBatchSampler(rng.integers(1, 50, N), max_tokens=120, **world),
        "ClassBalancedBatchSampler": lambda: shardwise.ClassBalancedBatchSampler(
            np.arange(N) % 5, classes_per_batch=2, samples_per_class=2, **world
        ),
        "ScheduledBatchSampler": lambda: shardwise.ScheduledBatchSampler(N, batch_size=schedule, **world),
    }
    return makers[name]()


INDEX = ["ShardedSampler", "shard", "WeightedSampler"]
BATCH = [
    "shard_batches", "TwoStreamBatchSampler", "BucketBatchSampler", "ClassBalancedBatchSampler",
    "ScheduledBatchSampler",
]  # fmt: skip


def loader_for(name: str, *, stateful: bool = False) -> DataLoader[Any]:
    sampler = make(name)
    data = Indices(TWO_STREAM_N if name == "TwoStreamBatchSampler" else N)
    kind: Any = DataLoader
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        kind = StatefulDataLoader
    if name in INDEX:
        return kind(data, sampler=sampler, batch_size=4)  # type: ignore[no-any-return]
    return kind(data, batch_sampler=sampler)  # type: ignore[no-any-return]


def expected(name: str, rank: int, epoch: int) -> list[list[int]]:
    """What rank ``rank`` of 2 must see in ``epoch``: the sampler built with an explicit world."""
    sampler = make(name, num_replicas=2, rank=rank)
    sampler.set_epoch(epoch)
    units = list(sampler)
    if name in INDEX:
        return [units[i : i + 4] for i in range(0, len(units), 4)]
    return [list(map(int, u)) for u in units]


# -- what runs on each rank ----------------------------------------------------------------------


def _join_as_ddp(rank: int) -> None:
    """Make Lightning treat this process as one it did not start (as under torchrun)."""
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE="2", RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")  # fmt: skip
    import logging
    import warnings

    warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging is noise here
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _module(loader_factory: Any, *, in_hook: bool) -> Any:
    from lightning.pytorch import LightningModule

    class Recorder(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[tuple[int, list[int]]] = []
            self.sampler_epochs: list[tuple[int, int]] = []

        def on_train_epoch_start(self) -> None:
            loader = self.trainer.train_dataloader
            sampler = loader.batch_sampler if isinstance(loader.batch_sampler, PlanSampler) else loader.sampler
            self.sampler_epochs.append((self.current_epoch, getattr(sampler, "epoch", -1)))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            self.seen.append((self.current_epoch, [int(i) for i in batch]))
            return self.layer(batch.float().unsqueeze(1)).sum() * 0.0

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class HookRecorder(Recorder):
        def train_dataloader(self) -> Any:
            return loader_factory()

    # Without the hook, the loader is built outside Lightning's hook (passed to fit).
    return HookRecorder() if in_hook else Recorder()


def _trainer(**overrides: Any) -> Any:
    from lightning.pytorch import Trainer

    settings: dict[str, Any] = {
        "accelerator": "cpu", "devices": 2, "strategy": "ddp", "max_epochs": 2, "logger": False,
        "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }  # fmt: skip
    settings.update(overrides)
    return Trainer(**settings)


def _by_epoch(seen: list[tuple[int, list[int]]]) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = {}
    for epoch, batch in seen:
        out.setdefault(epoch, []).append(batch)
    return out


def _fit_every_sampler(rank: int, world_size: int, names: list[str]) -> dict[str, Any]:
    _join_as_ddp(rank)
    results: dict[str, Any] = {}
    for name in names:
        for mode in ("hook", "fit", "nodist"):
            module = _module(lambda name=name: loader_for(name), in_hook=mode != "fit")
            trainer = _trainer(use_distributed_sampler=mode != "nodist")
            if mode == "fit":
                trainer.fit(module, train_dataloaders=loader_for(name))
            else:
                trainer.fit(module)
            results[f"{name}/{mode}"] = _by_epoch(module.seen)
    # Lightning stops after 2 batches without exhausting the iterator: epoch 1 must still start afresh.
    module = _module(lambda: loader_for("TwoStreamBatchSampler"), in_hook=True)
    _trainer(limit_train_batches=2).fit(module)
    results["limited"] = _by_epoch(module.seen)
    results["epochs_seen_by_sampler"] = module.sampler_epochs
    # A torchdata StatefulDataLoader passed to fit is rebuilt by Lightning too: the sampler survives.
    module = _module(None, in_hook=False)
    _trainer().fit(module, train_dataloaders=loader_for("TwoStreamBatchSampler", stateful=True))
    results["stateful/fit"] = _by_epoch(module.seen)
    return results


def _two_stream(rank: int, world_size: int) -> dict[str, dict[int, list[list[int]]]]:
    _join_as_ddp(rank)
    from lightning.pytorch import seed_everything

    runs = {}
    for seeded in (False, True):
        if seeded:
            seed_everything(1234, verbose=False)
        module = _module(lambda: loader_for("TwoStreamBatchSampler"), in_hook=True)
        _trainer(max_epochs=3).fit(module)
        runs[f"seeded={seeded}"] = _by_epoch(module.seen)
    return runs


def _resume(rank: int, world_size: int, directory: str, stop_at: int) -> dict[str, Any]:
    _join_as_ddp(rank)
    from lightning.pytorch.callbacks import ModelCheckpoint

    name = "TwoStreamBatchSampler"
    whole = _module(lambda: loader_for(name, stateful=True), in_hook=True)
    every = ModelCheckpoint(dirpath=directory, filename="mid", every_n_train_steps=stop_at, save_top_k=1,
                            monitor=None)  # fmt: skip
    # The first checkpoint, taken mid-epoch, is the one resumed from: keep only it.
    _trainer(max_epochs=2, enable_checkpointing=True, callbacks=[every], max_steps=stop_at).fit(whole)
    rest = _module(lambda: loader_for(name, stateful=True), in_hook=True)
    _trainer(max_epochs=2).fit(rest)  # the uninterrupted reference, from scratch
    resumed = _module(lambda: loader_for(name, stateful=True), in_hook=True)
    _trainer(max_epochs=2).fit(resumed, ckpt_path=os.path.join(directory, "mid.ckpt"))
    return {"first": whole.seen, "whole": rest.seen, "second": resumed.seen}


LAST_STEP = [("ShardedSampler", "stateful", True), ("TwoStreamBatchSampler", "plain", False)]


def _resume_at_last_step(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    """A step checkpoint at epoch 0's last batch (the run stopped by max_steps), 2 workers; resumed to 2 epochs.

    ``(name, loader, at_epoch_end)``: a torchdata ``StatefulDataLoader`` or a plain ``DataLoader``;
    ``at_epoch_end`` adds ``save_on_train_epoch_end=True`` to the same ``ModelCheckpoint``.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.contract.test_crash_resume import _lightning_loader

    def loader(name: str, kind: str) -> Any:
        made = _lightning_loader(name, 2)
        if kind == "stateful":
            return made
        settings = {"num_workers": 2, "multiprocessing_context": made.multiprocessing_context}
        if name in INDEX:
            return DataLoader(made.dataset, sampler=made.sampler, batch_size=4, **settings)
        return DataLoader(made.dataset, batch_sampler=made.batch_sampler, **settings)

    out = {}
    for name, kind, at_epoch_end in LAST_STEP:
        steps = len(expected(name, rank, 0))
        filename = f"{name}-{kind}-{at_epoch_end}"
        first = _module(lambda name=name, kind=kind: loader(name, kind), in_hook=True)
        saver = ModelCheckpoint(dirpath=directory, filename=filename, every_n_train_steps=steps, save_top_k=1,
                                monitor=None, save_on_train_epoch_end=at_epoch_end)  # fmt: skip
        _trainer(enable_checkpointing=True, callbacks=[saver], max_steps=steps).fit(first)
        second = _module(lambda name=name, kind=kind: loader(name, kind), in_hook=True)
        _trainer().fit(second, ckpt_path=os.path.join(directory, filename + ".ckpt"))
        out[filename] = first.seen + second.seen
    return out


PREDICTED = ["shard_batches", "BucketBatchSampler"]


def _predict(rank: int, world_size: int) -> dict[str, Any]:
    """Lightning's own test_prediction_loop_batch_sampler_set_epoch_called, on shardwise batch samplers (2 ranks).

    Lightning sets the epoch to ``fit_loop.epoch_progress.current.processed`` (2 here) on the
    ``_IndexBatchSamplerWrapper`` it puts around the batch sampler, which copies the instance's
    ``__dict__``; then a BucketBatchSampler built with ``drop_last=True``, which Lightning cannot
    make predict every sample.
    """
    import warnings

    from lightning.pytorch import LightningModule

    _join_as_ddp(rank)

    class Predictor(LightningModule):
        def __init__(self, loader: Any) -> None:
            super().__init__()
            self.layer, self.loader = torch.nn.Linear(1, 1), loader

        def predict_step(self, batch: torch.Tensor, batch_idx: int) -> list[int]:
            return [int(i) for i in batch]

        def predict_dataloader(self) -> Any:
            return self.loader()

    def run(loader: Any, **settings: Any) -> tuple[Any, list[str], str]:
        trainer = _trainer(**settings)
        trainer.fit_loop.epoch_progress.current.processed = 2
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            predictions = trainer.predict(Predictor(loader))
        said = [str(w.message) for w in caught if "drop_last" in str(w.message)]
        return predictions, said, type(trainer.predict_dataloaders.batch_sampler).__name__

    out: dict[str, Any] = {}
    for name in PREDICTED:
        for distributed in (True, False):
            out[f"{name}/{distributed}"] = run(lambda name=name: loader_for(name), use_distributed_sampler=distributed)
    dropping = lambda: DataLoader(
        Indices(N), batch_sampler=shardwise.BucketBatchSampler(np.arange(N) % 7 + 1, batch_size=3, drop_last=True)
    )
    out["dropping"] = run(dropping)
    return out


def _three_tests(rank: int, world_size: int, names: list[str], directories: dict[str, str]) -> dict[str, Any]:
    """What the next five tests check, and the Lightning runs of tests/contract/test_crash_resume.py and
    tests/integrations/test_skip_ledger.py, from one process start: _two_stream last (its seed_everything stays)."""
    from tests.contract.test_crash_resume import LIGHTNING_COMBOS, _lightning_resumes
    from tests.integrations.test_skip_ledger import _lightning_save_skip_resume

    directory = directories["lightning"]
    return {"every": _fit_every_sampler(rank, world_size, names), "resume": _resume(rank, world_size, directory, 2),
            "last_step": _resume_at_last_step(rank, world_size, directory), "predict": _predict(rank, world_size),
            "crash_resume": _lightning_resumes(rank, world_size, directories["crash_resume"], LIGHTNING_COMBOS),
            "skip": _lightning_save_skip_resume(rank, world_size, directories["skip"]),
            "two_stream": _two_stream(rank, world_size)}  # fmt: skip


def lightning_ranks(directories: dict[str, str]) -> list[dict[str, Any]]:
    """Per rank, what _three_tests returns: one pair of ranks (starting one, with Lightning, is ~10 s) for this
    module's fits and the other modules' (tests/conftest.py's session fixture ``lightning_ranks`` calls this)."""
    return run_distributed(_three_tests, 2, INDEX + BATCH, directories, timeout=600)


# -- tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fits(lightning_ranks: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rank, the results of _fit_every_sampler, _resume, _resume_at_last_step, _predict and _two_stream."""
    return lightning_ranks["ranks"]  # type: ignore[no-any-return]


@pytest.mark.timeout(480)
def test_every_sampler_with_default_settings_and_without_distributed_sampler(fits: list[dict[str, Any]]) -> None:
    """Every shardwise sampler, in the hook or passed to fit, with or without Lightning's sampler: exact shares."""
    names = INDEX + BATCH
    results = [rank["every"] for rank in fits]  # _fit_every_sampler(names)
    for name in names:
        for mode in ("hook", "fit", "nodist"):
            for rank in (0, 1):
                seen = results[rank][f"{name}/{mode}"]
                for epoch in (0, 1):
                    assert seen[epoch] == expected(name, rank, epoch), (name, mode, rank, epoch)
            assert results[0][f"{name}/{mode}"][0] != results[0][f"{name}/{mode}"][1], (name, mode)
    for rank in (0, 1):
        limited = results[rank]["limited"]
        assert limited == {e: expected("TwoStreamBatchSampler", rank, e)[:2] for e in (0, 1)}
        assert results[rank]["epochs_seen_by_sampler"] == [(0, 0), (1, 1)]
        assert results[rank]["stateful/fit"] == {e: expected("TwoStreamBatchSampler", rank, e) for e in (0, 1)}


@pytest.mark.timeout(480)
def test_two_stream_scenario_with_and_without_seed_everything(fits: list[dict[str, Any]]) -> None:
    """Two-stream 120 samples, 24 primary, 4+4, 2 ranks, 3 epochs: primary once per epoch, disjoint, orders differ."""
    results = [rank["two_stream"] for rank in fits]  # _two_stream
    for run in ("seeded=False", "seeded=True"):
        ranks = [results[0][run], results[1][run]]
        orders = []
        for epoch in range(3):
            assert [len(ranks[r][epoch]) for r in (0, 1)] == [3, 3]
            primary = [[i for b in ranks[r][epoch] for i in b[:4]] for r in (0, 1)]
            assert all(i < PRIMARY for p in primary for i in p)
            assert not set(primary[0]) & set(primary[1])
            assert Counter(primary[0] + primary[1]) == Counter(range(PRIMARY))
            assert all(i >= PRIMARY for r in (0, 1) for b in ranks[r][epoch] for i in b[4:])
            orders.append(primary)
        assert orders[0] != orders[1] != orders[2] != orders[0]
    # The plan is a function of the sampler's own seed: seed_everything changes nothing in it.
    assert results[0]["seeded=False"] == results[0]["seeded=True"]


@pytest.mark.timeout(480)
def test_mid_epoch_resume_with_stateful_dataloader_sees_the_uninterrupted_batches(fits: list[dict[str, Any]]) -> None:
    """StatefulDataLoader + Lightning checkpoint mid-epoch: the resumed run equals the uninterrupted one, every rank."""
    ranks = [rank["resume"] for rank in fits]  # _resume(directory, stop_at=2)
    for rank in (0, 1):
        run = ranks[rank]
        assert len(run["first"]) == 2
        assert run["first"] + run["second"] == run["whole"], rank


@pytest.mark.timeout(480)
def test_a_step_checkpoint_at_an_epochs_last_batch_with_workers_resumes_at_the_next_epoch(
    fits: list[dict[str, Any]],
) -> None:
    """Saved at epoch 0's last batch (max_steps), 2 workers: the resumed fit trains epoch 1 then 2 as uninterrupted.

    Before, the restored iterator's workers drew the empty rest of epoch 0 before Lightning set epoch 1:
    epoch 1 was never trained (StatefulDataLoader), or ran epoch 0's order (plain DataLoader)."""
    for rank in (0, 1):
        runs = fits[rank]["last_step"]  # _resume_at_last_step
        for name, kind, at_epoch_end in LAST_STEP:
            whole = [(epoch, batch) for epoch in (0, 1) for batch in expected(name, rank, epoch)]
            assert runs[f"{name}-{kind}-{at_epoch_end}"] == whole, (name, kind, at_epoch_end, rank)


@pytest.mark.timeout(480)
def test_predict_sets_the_epoch_of_a_shardwise_batch_sampler_and_says_what_drop_last_does(
    fits: list[dict[str, Any]],
) -> None:
    """trainer.predict with fit_loop at epoch 2 predicts epoch 2's batches (was epoch 0's: the relay did not reach the
    sampler through _IndexBatchSamplerWrapper), with and without Lightning's sampler; no "predictions might be
    incomplete" from Lightning, and a warning naming drop_last where the sampler does drop units."""
    for rank in (0, 1):
        results = fits[rank]["predict"]  # _predict
        for name in PREDICTED:
            for distributed in (True, False):
                predictions, said, wrapper = results[f"{name}/{distributed}"]
                assert wrapper == "_IndexBatchSamplerWrapper"
                assert predictions == expected(name, rank, 2), (name, distributed, rank)
                assert said == [], (name, distributed)  # drop_last=False: every sample predicted, nothing to say
        predictions, said, _ = results["dropping"]
        sampler = shardwise.BucketBatchSampler(np.arange(N) % 7 + 1, batch_size=3, drop_last=True, num_replicas=2,
                                               rank=rank)  # fmt: skip
        sampler.set_epoch(2)
        assert predictions == [list(map(int, b)) for b in sampler]
        assert sum(len(b) for b in predictions) < N // 2  # it drops units: not every sample is predicted
        assert len(said) == 1 and "was built with drop_last=True and is kept as built" in said[0], said
        assert "might be incomplete" not in said[0]  # Lightning's own warning (rank 0) no longer comes


class Filtered(torch.utils.data.Sampler[list[int]]):
    """A user's wrapper that nests a shardwise batch sampler where Lightning does not look."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __iter__(self) -> Any:
        return iter(self.batch_sampler)

    def __len__(self) -> int:
        return len(self.batch_sampler)


@pytest.mark.timeout(60)
def test_epoch_callback_reaches_a_nested_shardwise_batch_sampler() -> None:
    """ShardwiseEpochCallback sets the epoch on a shardwise sampler nested in a user's wrapper."""
    import warnings

    from shardwise.integrations.lightning import ShardwiseEpochCallback

    inner = make("TwoStreamBatchSampler", num_replicas=1, rank=0)
    epochs: list[int] = []

    def loader() -> Any:
        return DataLoader(Indices(TWO_STREAM_N), batch_sampler=Filtered(inner))

    module = _module(loader, in_hook=True)
    module.on_train_epoch_end = lambda: epochs.append(inner.epoch)  # type: ignore[method-assign]
    inner.set_epoch(5)  # a stale epoch: only the callback can correct it at each epoch start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        _trainer(devices=1, strategy="auto", limit_train_batches=1, callbacks=[ShardwiseEpochCallback()]).fit(module)
    assert epochs == [0, 1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_validation_after_the_sanity_check_sees_every_sample(workers: int) -> None:
    """Lightning's 2-step sanity check breaks off a validation pass: the first real validation still sees all 10
    samples (it saw [4..9] when a new pass continued a partial one; issue 34, item 0)."""
    import warnings

    from lightning.pytorch import LightningModule

    class Validated(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.validated: list[tuple[bool, list[int]]] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch.float().unsqueeze(1)).sum() * 0.0

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            self.validated.append((self.trainer.sanity_checking, [int(i) for i in batch]))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    sampler = shardwise.ShardedSampler(10, num_replicas=1, rank=0, shuffle=False)
    val = DataLoader(Indices(10), sampler=sampler, batch_size=2, num_workers=workers)
    train = DataLoader(Indices(2), batch_size=2)
    module = Validated()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        _trainer(devices=1, strategy="auto", max_epochs=1, num_sanity_val_steps=2).fit(module, train, val)
    sanity = [i for checking, batch in module.validated if checking for i in batch]
    first = [i for checking, batch in module.validated if not checking for i in batch]
    assert sanity == [0, 1, 2, 3]
    assert first == list(range(10))
