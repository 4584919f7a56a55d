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
from shardwise.samplers.adaptive import AdaptiveMixture

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
            sampler.adaptive.record(loss_of(indices), sampler.sources_of(sampler_indices(indices)))
            batches.append(indices)
            if sampler.adaptive.update_due():
                sampler.adaptive.update()
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
    assert whole.adaptive.ledger.updates == 2 * 640 // 128 and len(expected) == 80
    first = _sampler(policy)
    head = train(first, range(2), stop=24)
    state = first.state_dict()
    resumed = _sampler(policy)
    resumed.load_state_dict(state)
    tail = train(resumed, range(state["epoch"], 2))
    assert head + tail == expected
    assert (resumed.adaptive.ledger.shares == whole.adaptive.ledger.shares).all() and (
        resumed.adaptive.ledger.state == whole.adaptive.ledger.state
    ).all()
    assert not np.allclose(whole.adaptive.ledger.weights[-1], whole.adaptive.ledger.weights[0])  # the weights did move


def test_weights_move_toward_the_source_with_the_higher_loss() -> None:
    """With the 'noise' source reporting the highest loss, both policies give it the largest weight by the end."""
    for policy in (Exp3(), ExponentiatedGradient(rate=0.5)):
        sampler = _sampler(policy)
        train(sampler, range(3))
        assert int(np.argmax(sampler.adaptive.ledger.weights[-1])) == 2


def test_the_sampler_refuses_to_pass_an_interval_boundary_without_the_update() -> None:
    """A loop that never updates gets PendingWeightsError naming the fix at the first unknown position."""
    sampler = _sampler()
    drawn = []
    with pytest.raises(
        PendingWeightsError, match=r"run position 256.*sampler\.adaptive\.update\(\) when sampler\.adaptive\.update_due"
    ):
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
        sampler.adaptive.update()
    for _ in range(28):
        next(iterator)
    assert sampler.adaptive.update_due()
    with pytest.warns(RuntimeWarning, match="no reported samples"):
        weights = sampler.adaptive.update()
    assert sum(weights) == pytest.approx(1.0) and sampler.adaptive.ledger.updates == 1


def test_which_and_when_answer_across_an_update() -> None:
    """which() gives each step's samples and sources, and when() each sample's steps, before and after an update."""
    sampler = _sampler(ExponentiatedGradient(rate=2.0))
    batches = train(sampler, range(1))
    data = _data()
    assert sampler.adaptive.ledger.updates == 5
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
    assert weights == pytest.approx(sampler.adaptive.ledger.weights[1].tolist(), abs=1e-9)
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
        head_sampler.adaptive.record(loss_of(indices), head_sampler.sources_of(sampler_indices(indices)))
        head.append(indices)
        if head_sampler.adaptive.update_due():
            head_sampler.adaptive.update()
            break  # checkpoint at the update
    tail_sampler = _sampler(policy)
    tail_sampler.load_state_dict(head_sampler.state_dict())
    assert head + train(tail_sampler, range(1)) == rest
    assert (tail_sampler.adaptive.ledger.shares == whole.adaptive.ledger.shares).all()


def test_lag_zero_takes_an_update_at_once_without_workers() -> None:
    """AdaptiveWeights(lag=0): update u is in force from u * interval (a loop without prefetching workers)."""
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=2.0), interval=128, lag=0)
    sampler = MixtureSampler(_data(), adaptive, num_samples=640, block=64, seed=5, num_replicas=1, rank=0)
    assert len(train(sampler, range(1))) == 40 and sampler.adaptive.ledger.updates == 5
    assert sampler.weights_at(0, 127) != sampler.weights_at(0, 128)
    assert sampler.weights_at(0, 128) == pytest.approx(sampler.adaptive.ledger.weights[1].tolist(), abs=1e-9)


def test_a_checkpoint_between_updates_warns_that_it_misses_the_recorded_losses() -> None:
    """pending counts what this rank recorded since the last update; warn_if_pending (the integrations' save hooks)."""
    sampler = _sampler()
    train(sampler, range(1), stop=8)  # an update at 128: nothing pending
    assert sampler.adaptive.pending == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.adaptive.warn_if_pending()
    sampler.adaptive.record([1.0, 2.0], [0, 2])
    assert sampler.adaptive.pending == 2
    with pytest.warns(RuntimeWarning, match=r"misses the 2 losses this rank recorded towards update 2"):
        sampler.adaptive.warn_if_pending()


class Recording:
    """Exp3, keeping what it was called with (the statistics, the state before) and what it returned."""

    def __init__(self, policy: Exp3) -> None:
        self.policy, self.calls = policy, []  # type: ignore[var-annotated]

    def initial_state(self, weights: np.ndarray) -> np.ndarray:
        return self.policy.initial_state(weights)

    def __call__(self, ledger: Any, statistics: Any) -> Any:
        step = self.policy(ledger, statistics)
        self.calls.append((statistics, ledger.state.copy(), ledger.latest.copy(), step.state))
        return step


@pytest.mark.parametrize(("interval", "num_samples", "lag"), [(128, 640, 1), (96, 600, 2)])
def test_exp3_importance_weights_with_the_weights_that_drew_the_interval(interval: int, num_samples: int,
                                                                         lag: int) -> None:  # fmt: skip
    """statistics.drawn are the weights in force over the reported positions (not ledger.latest); Exp3 divides by them.

    (96, 600): intervals and epochs that are not whole blocks of 64, so an interval is drawn with two entries.
    """
    policy = Recording(Exp3(smoothing=0.5, floor=0.05))
    adaptive = AdaptiveWeights(policy, interval=interval, lag=lag)
    sampler = MixtureSampler(_data(), adaptive, num_samples=num_samples, block=64, seed=5, num_replicas=1, rank=0)
    train(sampler, range(2))
    assert len(policy.calls) == sampler.adaptive.ledger.updates >= 8
    differ = 0
    for update, (statistics, before, latest, after) in enumerate(policy.calls, start=1):
        positions = range((update - 1) * interval, update * interval)
        in_force = np.mean([sampler.weights_at(p // num_samples, p % num_samples) for p in positions], axis=0)
        assert statistics.drawn == pytest.approx(in_force, abs=1e-8)
        seen = statistics.counts > 0
        expected = before.copy()
        expected[seen] = 0.5 * before[seen] + 0.5 * statistics.means[seen] / in_force[seen]
        assert after == pytest.approx(expected, rel=1e-7)
        differ += not np.allclose(latest, in_force, atol=1e-4)
    assert differ >= 3  # the last update's weights are not those that drew the interval


def test_a_state_saved_before_the_exp3_fix_loads_and_keeps_its_recorded_weights() -> None:
    """A state of the earlier Exp3 (ledger.latest as importance weights) loads; later updates follow the fixed rule.

    The fingerprint is unchanged (no version bump): recorded entries, and the plan of every position they cover, stay
    as saved; an update after the resume can choose other weights than the earlier version would have.
    """
    saved = {  # _sampler(Exp3()) trained to position 256 (2 updates) by shardwise at fbe51ab, as JSON
        "version": 1, "epoch": 0, "consumed": 256, "seed": 5,
        "fingerprint": {"kind": "MixtureSampler", "sizes": [100, 60, 30],
                        "weights": {"policy": "Exp3", "smoothing": 0.9, "floor": 0.02, "interval": 128, "lag": 1,
                                    "initial": None},
                        "stop": "num_samples", "num_samples": 640, "primary": None, "block": 64, "shuffle": True,
                        "interleave": False, "names": ["easy", "code", "noise"]},
        "mixture": {"position": 256, "consumed": [85, 86, 85], "cycles": [0, 1, 2]},
        "adaptive": {"interval": 128, "updates": 2, "shares": [357913942, 357913941, 357913941] * 3,
                     "state": [0.5303876553918516, 1.1146104600065834, 1.7517055281924425]},
    }  # fmt: skip
    resumed = _sampler(Exp3())
    resumed.load_state_dict(saved)
    assert resumed.adaptive.ledger.shares.tolist() == [[357913942, 357913941, 357913941]] * 3
    train(resumed, range(2))
    whole = _sampler(Exp3())
    train(whole, range(2))
    assert (resumed.adaptive.ledger.shares == whole.adaptive.ledger.shares).all()
    # The same run at fbe51ab, entries 4 and 5: update 5 is the first whose interval was drawn with other weights
    # than the last update's (entry 3, uniform, against entry 4), so the trajectory departs there.
    before = [[347164200, 356378849, 370198775], [334924940, 354226522, 384590362]]
    assert (
        whole.adaptive.ledger.shares[4].tolist() == before[0] and whole.adaptive.ledger.shares[5].tolist() != before[1]
    )


def test_a_policy_weight_below_one_over_block_is_lifted_with_a_warning() -> None:
    """[0.98, 0.0199, 0.0001] at block 24: the ledger and update() give the lifted weights, and the first lift warns."""

    def greedy(ledger: Any, statistics: Any) -> list[float]:
        return [0.98, 0.0199, 0.0001]

    sampler = MixtureSampler(_data(), AdaptiveWeights(greedy, interval=48), num_samples=480, block=24, seed=5,
                             num_replicas=1, rank=0)  # fmt: skip
    sampler.adaptive.record([1.0], [0])
    with pytest.warns(RuntimeWarning, match=r"update 1: .* below 1/24.*source 2: 0\.0001 -> 0\.0417.*block>=10001"):
        weights = sampler.adaptive.update(position=48)
    assert weights == pytest.approx([22 / 24, 1 / 24, 1 / 24], abs=1e-8)
    assert sampler.adaptive.ledger.weights[-1].tolist() == pytest.approx(weights, abs=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once a sampler
        sampler.adaptive.record([1.0], [0])
        sampler.adaptive.update(position=96)


def test_a_policy_with_more_positive_weights_than_a_block_holds_names_the_block() -> None:
    """Three positive weights cannot all be drawn in a block of 2: the error names the block to build with."""
    adaptive = AdaptiveWeights(lambda ledger, statistics: [1.0, 1.0, 1.0], interval=8, initial=[1, 1, 0])
    sampler = MixtureSampler(_data(), adaptive, num_samples=80, seed=5, num_replicas=1, rank=0)
    assert sampler.block == 2
    sampler.adaptive.record([1.0], [0])
    with pytest.raises(ValueError, match=r"3 sources a positive weight at update 1.*block of 2.*block>=3"):
        sampler.adaptive.update(position=8)


@pytest.mark.parametrize(("position", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                                 ("48", TypeError)])  # fmt: skip
def test_update_position_is_checked(position: object, error: type) -> None:
    """update_due(position=...) and update(position=...) take a non-negative integer and name position otherwise."""
    sampler = _sampler()
    with pytest.raises(error, match=rf"position should be .*position={position!r}"):
        sampler.adaptive.update_due(position=position)  # type: ignore[arg-type]
    with pytest.raises(error, match=rf"position should be .*position={position!r}"):
        sampler.adaptive.update(position=position)  # type: ignore[arg-type]
    assert sampler.adaptive.ledger.updates == 0


def test_weights_at_and_when_refuse_positions_the_ledger_does_not_cover() -> None:
    """weights_at and when raise PendingWeightsError past known_until (as which does), and answer once it is reported."""
    fresh = _sampler(ExponentiatedGradient(rate=2.0))
    with pytest.raises(PendingWeightsError, match=r"plan position 500 of epoch 0 .* up to run position 256"):
        fresh.weights_at(0, 500)
    with pytest.raises(PendingWeightsError, match=r"sample 5 trains in epoch 0 .*\[0, 640\).* up to run position 256"):
        shardwise.when(fresh, 5, epochs=0, batch_size=BATCH, world_size=1)
    assert fresh.weights_at(0, 255) == pytest.approx([1 / 3] * 3)
    trained = _sampler(ExponentiatedGradient(rate=2.0))
    batches = train(trained, range(1))
    assert trained.weights_at(0, 500) != pytest.approx([1 / 3] * 3, abs=1e-3)
    found = shardwise.when(trained, 5, epochs=0, batch_size=BATCH, world_size=1)
    assert [t.step for t in found] == [s for s, b in enumerate(batches) for i in sampler_indices(b) if i == 5]
    with pytest.raises(PendingWeightsError, match="epoch 1"):
        shardwise.when(trained, 5, epochs=range(2), batch_size=BATCH, world_size=1)


def test_an_update_adds_no_python_objects() -> None:
    """The ledger, the plan's weight changes and the layout grow as numpy rows: no object an update (was ~420 bytes).

    bench/bench_adaptive.py --memory measures the bytes (BENCHMARKS.md, "Adaptive mixtures").
    """
    import gc

    sampler = MixtureSampler([10**6] * 3, AdaptiveWeights(ExponentiatedGradient(), interval=64), num_samples=10**9,
                             block=64, seed=0, num_replicas=1, rank=0)  # fmt: skip
    next(iter(sampler))  # the epoch's layout is cached: every update grows it
    values, sources = np.ones(3), np.arange(3)
    for update in range(1, 21):
        sampler.adaptive.record(values, sources)
        sampler.adaptive.update(position=update * 64)
    gc.collect()
    before = len(gc.get_objects())
    for update in range(21, 221):
        sampler.adaptive.record(values, sources)
        sampler.adaptive.update(position=update * 64)
    gc.collect()
    assert len(gc.get_objects()) - before < 20


def test_fixed_weights_have_no_adaptive_object_and_no_adaptive_methods() -> None:
    """sampler.adaptive is None for fixed weights and schedules; the sampler has no record/update to refuse."""
    schedule = shardwise.WeightSchedule.by_samples({0: [1, 1, 1], 320: [1, 2, 3]})
    packed = shardwise.PackedMixtureSampler([[30] * 10, [20] * 10], [1, 1], max_len=40, rows_per_batch=1,
                                            num_replicas=1, rank=0)  # fmt: skip
    adaptive = _sampler().adaptive
    assert isinstance(adaptive, AdaptiveMixture) and adaptive.config.interval == 128
    for sampler in (MixtureSampler(_data(), [1, 1, 1], num_samples=64), MixtureSampler(_data(), schedule, num_samples=64),
                    packed):  # fmt: skip
        assert sampler.adaptive is None
        assert sampler.weights_at(0, 0)  # what works for fixed weights stays on the sampler
        for name in ("record", "update", "update_due", "ledger", "pending", "warn_if_pending", "trained_position",
                     "record_tokens", "record_predictions"):  # fmt: skip
            assert not hasattr(sampler, name), name


@pytest.mark.parametrize("how", ["pickle", "copy"])
def test_a_pickled_or_copied_sampler_updates_and_saves_the_same_ledger(how: str) -> None:
    """A copy (pickle, as DataLoader workers and ddp_spawn do, or copy.copy) taken after epoch 0 trains epoch 1 with
    its own adaptive weights: the same batches, the same saved ledger as the uninterrupted run."""
    import copy
    import pickle

    whole = _sampler()
    expected = train(whole, range(2))
    first = _sampler()
    head = train(first, range(1))
    twin = pickle.loads(pickle.dumps(first)) if how == "pickle" else copy.copy(first)
    assert twin.adaptive is not None and twin.adaptive.trained_position() == 640  # bound to the copy
    tail = train(twin, range(1, 2))
    assert head + tail == expected
    assert twin.state_dict()["adaptive"] == whole.state_dict()["adaptive"]
    assert (twin.adaptive.ledger.shares == whole.adaptive.ledger.shares).all()


def test_adaptive_weights_held_across_a_resume_read_the_resumed_plan() -> None:
    """``adaptive = sampler.adaptive`` taken before load_state_dict updates the plan the resume built."""
    whole = _sampler()
    expected = train(whole, range(1))
    first = _sampler()
    head = train(first, range(1), stop=16)  # right after update 2 (position 256)
    resumed = _sampler()
    adaptive = resumed.adaptive
    resumed.load_state_dict(first.state_dict())
    assert adaptive is not None and adaptive.ledger.updates == 2 and adaptive.trained_position() == 256
    tail: list[list[int]] = []
    for batch in DataLoader(_data(), batch_size=BATCH, sampler=resumed):
        indices = batch.tolist()
        adaptive.record(loss_of(indices), resumed.sources_of(sampler_indices(indices)))
        tail.append(indices)
        if adaptive.update_due():
            adaptive.update()
    assert head + tail == expected and (adaptive.ledger.shares == whole.adaptive.ledger.shares).all()


def test_update_warnings_point_at_the_line_that_called_update() -> None:
    """The no-samples and the lift warnings of ``sampler.adaptive.update()`` name the caller's file, not shardwise's."""
    empty = _sampler()
    with pytest.warns(RuntimeWarning, match="no reported samples") as caught:
        empty.adaptive.update(position=128)
    lifted = MixtureSampler(_data(), AdaptiveWeights(lambda ledger, statistics: np.array([0.98, 0.0199, 0.0001]),
                                                     interval=64), num_samples=640, block=24, seed=5)  # fmt: skip
    lifted.adaptive.record([1.0], [0])
    with pytest.warns(RuntimeWarning, match="lifted") as more:
        lifted.adaptive.update(position=64)
    assert {w.filename for w in [*caught, *more]} == {__file__}
