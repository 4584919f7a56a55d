"""MixtureSampler with adaptive weights in one process: the update cycle, resume, which/when, refusals."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardwise
from shardwise import AdaptiveWeights, Exp3, ExponentiatedGradient, Mixture, MixtureSampler, PendingWeightsError
from shardwise._core.errors import StateMismatchError

SIZES = [100, 60, 30]
BATCH = 16


def _data() -> Mixture:
    return Mixture({"easy": range(100), "code": range(1000, 1060), "noise": range(2000, 2030)})


def _sampler(policy: Any = None, interval: int = 128, **kwargs: Any) -> MixtureSampler:
    adaptive = AdaptiveWeights(policy or Exp3(), interval=interval)
    kwargs.setdefault("num_replicas", 1)
    kwargs.setdefault("rank", 0)
    return MixtureSampler(_data(), adaptive, num_samples=640, block=64, seed=5, **kwargs)


def loss_of(indices: Any) -> np.ndarray:
    """A made-up per-sample loss, a function of the sample alone (so any split reports the same sums)."""
    array = np.asarray(indices)
    return (array % 7) / 3.0 + (array // 1000)


def train(sampler: MixtureSampler, epochs: range, *, stop: int | None = None, workers: int = 0) -> list[list[int]]:
    """The loop of the recipe: record every batch's losses, update when due; stop after ``stop`` batches."""
    batches: list[list[int]] = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        for batch in DataLoader(_data(), batch_size=BATCH, sampler=sampler, num_workers=workers):
            indices = batch.tolist()
            sampler.record(loss_of(indices), sampler.sources_of(sampler_indices(indices)))
            batches.append(indices)
            if sampler.update_due():
                sampler.update()
            if stop is not None and len(batches) == stop:
                return batches
    return batches


def sampler_indices(values: list[int]) -> list[int]:
    """The concatenated index of each dataset value (the Mixture's sources are ranges)."""
    starts = {0: 0, 1000: 100, 2000: 160}
    return [starts[v // 1000 * 1000] + v % 1000 for v in values]


@pytest.mark.parametrize("policy", [Exp3(), ExponentiatedGradient(rate=0.5)])
def test_a_resume_mid_run_continues_the_identical_ledger_and_draws(policy: Any) -> None:
    """Checkpoint at an update (24 of 80 batches, two epochs), resume: the same batches and ledger, bit for bit."""
    whole = _sampler(policy)
    expected = train(whole, range(2))
    assert whole.ledger.updates == 2 * 640 // 128 and len(expected) == 80
    first = _sampler(policy)
    head = train(first, range(2), stop=24)
    state = first.state_dict()
    resumed = _sampler(policy)
    resumed.load_state_dict(state)
    tail = train(resumed, range(state["epoch"], 2))
    assert head + tail == expected
    assert (resumed.ledger.shares == whole.ledger.shares).all() and (resumed.ledger.state == whole.ledger.state).all()
    assert not np.allclose(whole.ledger.weights[-1], whole.ledger.weights[0])  # the weights did move


def test_weights_move_toward_the_source_with_the_higher_loss() -> None:
    """With the 'noise' source reporting the highest loss, both policies give it the largest weight by the end."""
    for policy in (Exp3(), ExponentiatedGradient(rate=0.5)):
        sampler = _sampler(policy)
        train(sampler, range(3))
        assert int(np.argmax(sampler.ledger.weights[-1])) == 2


def test_the_sampler_refuses_to_pass_an_interval_boundary_without_the_update() -> None:
    """A loop that never updates gets PendingWeightsError naming the fix at the first unknown position."""
    sampler = _sampler()
    drawn = []
    with pytest.raises(PendingWeightsError, match=r"run position 256.*sampler\.update\(\) when sampler\.update_due"):
        for index in sampler:
            drawn.append(index)
    assert len(drawn) == 256  # (updates + 2) * interval: the initial weights hold for two intervals


def test_update_before_it_is_due_and_update_without_reports() -> None:
    """update() before the interval's end raises naming the fix; an update with nothing recorded warns."""
    sampler = _sampler()
    iterator = iter(sampler)
    for _ in range(100):
        next(iterator)
    with pytest.raises(
        RuntimeError, match=r"due once the loop has trained through run position 128.*trained through 100"
    ):
        sampler.update()
    for _ in range(28):
        next(iterator)
    assert sampler.update_due()
    with pytest.warns(RuntimeWarning, match="no reported samples"):
        weights = sampler.update()
    assert sum(weights) == pytest.approx(1.0) and sampler.ledger.updates == 1


def test_which_and_when_answer_across_an_update() -> None:
    """which() gives each step's samples and sources, and when() each sample's steps, before and after an update."""
    sampler = _sampler(ExponentiatedGradient(rate=2.0))
    batches = train(sampler, range(1))
    data = _data()
    assert sampler.ledger.updates == 5
    changed = sampler.weights_at(0, 300) != sampler.weights_at(0, 200)
    assert changed
    for step in (0, 15, 16, 30, 39):
        trained = shardwise.which(sampler, epoch=0, step=step, rank=0, batch_size=BATCH, world_size=1)
        assert [data[i] for i in trained[0].indices] == batches[step]
    late = sampler_indices(batches[30])[0]
    steps = [t.step for t in shardwise.when(sampler, late, epochs=0, batch_size=BATCH, world_size=1)]
    assert 30 in steps and all(sampler_indices(batches[s]).count(late) for s in steps)


def test_a_state_of_another_policy_is_refused() -> None:
    """The fingerprint covers the policy and its parameters: a state of another configuration names the field."""
    sampler = _sampler(Exp3())
    train(sampler, range(1), stop=10)
    other = _sampler(Exp3(floor=0.03))
    with pytest.raises(StateMismatchError, match="weights"):
        other.load_state_dict(sampler.state_dict())
    plain = MixtureSampler(_data(), [1, 1, 1], num_samples=640, block=64, seed=5, num_replicas=1, rank=0)
    with pytest.raises(StateMismatchError):
        plain.load_state_dict(sampler.state_dict())


def test_describe_and_state_show_the_weights_in_force() -> None:
    """describe() shows the weights in force at the position; the state carries the ledger (plain values)."""
    sampler = _sampler(ExponentiatedGradient(rate=2.0))
    train(sampler, range(1), stop=20)  # position 320: update 1's weights in force from 256
    weights = [source["weight"] for source in sampler.describe()["sources"]]
    assert weights == pytest.approx(sampler.ledger.weights[1].tolist(), abs=1e-9)
    state = sampler.state_dict()
    assert state["adaptive"]["updates"] == 2 and len(state["adaptive"]["shares"]) == 3 * 3
    assert torch.load(_saved(state), weights_only=True)["adaptive"] == state["adaptive"]


def _saved(state: dict[str, Any]) -> Any:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_dataloader_workers_prefetch_within_an_interval() -> None:
    """Two workers prefetching 4 batches ahead run through updates with an interval of 4 batches (the lag)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = train(_sampler(interval=64), range(1))
        assert train(_sampler(interval=64), range(1), workers=2) == expected


FACTORY = """
from shardwise import AdaptiveWeights, ExponentiatedGradient, Mixture, MixtureSampler

def make_adaptive(rank=0, world_size=1):
    data = Mixture({"easy": range(100), "code": range(1000, 1060), "noise": range(2000, 2030)})
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=2.0), interval=128)
    return MixtureSampler(data, adaptive, num_samples=640, block=64, seed=5, num_replicas=world_size, rank=rank)
"""


def test_the_which_command_shows_the_weights_in_force_at_a_step(tmp_path: Any, capsys: Any) -> None:
    """`shardwise which --state` gives a step's samples and the weights in force; a step past the ledger exits 2."""
    import json

    from shardwise.tools.cli import main

    (tmp_path / "factory.py").write_text(FACTORY)
    batches = train(_sampler(ExponentiatedGradient(rate=2.0)), range(1))  # the uninterrupted run
    sampler = _sampler(ExponentiatedGradient(rate=2.0))
    train(sampler, range(1), stop=8)  # saved at 128: update 1 recorded, in force from 256, known until 384
    torch.save(sampler.state_dict(), tmp_path / "state.pt")
    target = f"{tmp_path / 'factory.py'}:make_adaptive"
    base = ["which", target, "-w", "1", "-b", str(BATCH), "--state", str(tmp_path / "state.pt"), "--epoch", "0"]
    for step in (3, 20):  # before update 1 takes effect (at 256), and after
        with pytest.raises(SystemExit) as exited:
            main([*base, "--start", "0", "--step", str(step), "--json"])
        row = json.loads(capsys.readouterr().out)["batches"][0]
        assert exited.value.code == 0 and [_data()[i] for i in row["indices"]] == batches[step]
        assert list(row["weights"].values()) == pytest.approx(sampler.weights_at(0, step * BATCH), abs=1e-6)
    assert list(row["weights"].values()) != pytest.approx(sampler.weights_at(0, 0), abs=1e-6)
    with pytest.raises(SystemExit) as exited:
        main([*base, "--step", "16"])  # from the state's position 128: 128 + 16 * 16 = 384, past the ledger
    assert exited.value.code == 2 and "no update has set yet" in capsys.readouterr().err


def test_skipped_steps_and_adaptive_weights_resume_together() -> None:
    """skip_steps on an adaptive mixture: the skipped steps never train, and a resume at an update gives the same run."""
    policy = ExponentiatedGradient(rate=2.0)
    sampler = _sampler(policy)
    train(sampler, range(1), stop=8)
    state = sampler.state_dict()
    skipped = _sampler(policy)
    skipped.load_state_dict(state)
    shardwise.skip_steps(skipped, epoch=0, steps=range(2, 4), batch_size=BATCH, start=state["consumed"])
    state = skipped.state_dict()  # the skip ledger and the weight ledger, together
    whole = _sampler(policy)
    whole.load_state_dict(state)
    rest = train(whole, range(1))
    assert len(rest) * BATCH == 640 - 128 - 2 * BATCH
    head_sampler = _sampler(policy)
    head_sampler.load_state_dict(state)
    head: list[list[int]] = []
    for batch in DataLoader(_data(), batch_size=BATCH, sampler=head_sampler):
        indices = batch.tolist()
        head_sampler.record(loss_of(indices), head_sampler.sources_of(sampler_indices(indices)))
        head.append(indices)
        if head_sampler.update_due():
            head_sampler.update()
            break  # checkpoint at the update
    tail_sampler = _sampler(policy)
    tail_sampler.load_state_dict(head_sampler.state_dict())
    assert head + train(tail_sampler, range(1)) == rest
    assert (tail_sampler.ledger.shares == whole.ledger.shares).all()


def test_lag_zero_takes_an_update_at_once_without_workers() -> None:
    """AdaptiveWeights(lag=0): update u is in force from u * interval (a loop without prefetching workers)."""
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=2.0), interval=128, lag=0)
    sampler = MixtureSampler(_data(), adaptive, num_samples=640, block=64, seed=5, num_replicas=1, rank=0)
    assert len(train(sampler, range(1))) == 40 and sampler.ledger.updates == 5
    assert sampler.weights_at(0, 127) != sampler.weights_at(0, 128)
    assert sampler.weights_at(0, 128) == pytest.approx(sampler.ledger.weights[1].tolist(), abs=1e-9)


def test_a_checkpoint_between_updates_warns_that_it_misses_the_recorded_losses() -> None:
    """pending counts what this rank recorded since the last update; warn_if_pending (the integrations' save hooks)."""
    sampler = _sampler()
    train(sampler, range(1), stop=8)  # an update at 128: nothing pending
    assert sampler.pending == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.warn_if_pending()
    sampler.record([1.0, 2.0], [0, 2])
    assert sampler.pending == 2
    with pytest.warns(RuntimeWarning, match=r"misses the 2 losses this rank recorded towards update 2"):
        sampler.warn_if_pending()
