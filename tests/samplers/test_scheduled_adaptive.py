"""ScheduledBatchSampler over a MixtureSampler with adaptive weights: progressive batch sizes, batch by batch.

The mixture's plan is written at run time (each update reveals more of it); the batch sampler cuts
each chunk at the last whole step it knows and reads on after the loop's update (NOTE [ Steps over
a plan written at run time ] in ``samplers.scheduled``). The loop reports on the batch sampler's
``adaptive``, whose clock is the steps it handed out. Checked here: the batches equal the same plan
read after all updates, a resume mid-epoch (and in the next epoch) continues the identical batches
and ledger, DataLoader workers prefetching ahead change nothing, and what cannot work is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from shardwise import (
    AdaptiveWeights,
    BatchSizeSchedule,
    ExponentiatedGradient,
    MixtureSampler,
    PendingWeightsError,
    ScheduledBatchSampler,
)
from shardwise._core.errors import MalformedStateError
from shardwise._core.provenance import ProvenanceUnsupported

NUM_SAMPLES, INTERVAL = 64, 8
SCHEDULE = BatchSizeSchedule.by_samples({0: 2, 16: 4, 40: 6, 100: 3})
"""Sizes change at samples 16 and 40 (epoch 0) and 100 (epoch 1: run positions 64..127)."""


def _sampler(lag: int = 1) -> ScheduledBatchSampler:
    weights = AdaptiveWeights(ExponentiatedGradient(rate=1.0), interval=INTERVAL, lag=lag)
    mixture = MixtureSampler([100, 50], weights, num_samples=NUM_SAMPLES, block=40, num_replicas=1, rank=0, seed=1)
    return ScheduledBatchSampler(mixture, batch_size=SCHEDULE)


def _loss(indices: list[int]) -> np.ndarray:
    """A per-sample loss, a function of the sample alone: source 1 (ids 100..149) the harder."""
    array = np.asarray(indices)
    return (array % 7) / 3.0 + 2.0 * (array >= 100)


def train(sampler: ScheduledBatchSampler, epochs: range, *, stop: int | None = None,
          workers: int | None = None) -> list[list[int]]:  # fmt: skip
    """The recipe's loop on the batch sampler: record each batch, update when due; stop after ``stop`` batches."""
    batches: list[list[int]] = []
    adaptive = sampler.adaptive
    assert adaptive is not None
    for epoch in epochs:
        sampler.set_epoch(epoch)
        loader: Any = sampler
        if workers is not None:
            prefetch = 2 if workers else None
            loader = DataLoader(range(150), batch_sampler=sampler, num_workers=workers, prefetch_factor=prefetch)
        for batch in loader:
            indices = [int(i) for i in batch]
            adaptive.record(_loss(indices), sampler.data.sources_of(indices))
            batches.append(indices)
            if adaptive.update_due():
                adaptive.update()
            if stop is not None and len(batches) == stop:
                return batches
    return batches


def read_after_updates(state: dict[str, Any], epochs: range, lag: int = 1) -> list[list[int]]:
    """The plan of ``state``'s ledger (and skips), read epoch by epoch with no update in between."""
    reader = _sampler(lag)
    reader.load_state_dict(state)
    batches: list[list[int]] = []
    for epoch in epochs:
        reader.set_epoch(epoch)
        batches += list(reader)
    return batches


def test_progressive_batches_over_adaptive_weights_equal_the_plan_read_after_all_updates() -> None:
    """Two epochs, 16 updates between batches: the batches are the final plan's, the sizes the schedule's."""
    sampler = _sampler()
    batches = train(sampler, range(2))
    adaptive = sampler.adaptive
    assert adaptive is not None and adaptive.ledger.updates == 2 * NUM_SAMPLES // INTERVAL
    assert [len(b) for b in batches] == [2] * 8 + [4] * 6 + [6] * 4 + [6] * 6 + [3] * 9 + [1]
    assert batches == read_after_updates(sampler.state_dict(), range(2))
    weights = adaptive.ledger.weights
    assert weights[0][1] == 0.5 and weights[-1][1] > 0.9  # the weights moved to the harder source
    late = [i for b in batches[-10:] for i in b]
    assert sum(i >= 100 for i in late) > 0.8 * len(late)  # and the draws followed


def test_a_loop_that_does_not_report_stops_at_the_ledgers_reach_naming_the_batch_samplers_adaptive() -> None:
    """Without updates the 9th batch (positions 16..19) is unknown; the mixture's own clock never moves."""
    sampler = _sampler()
    batches = iter(sampler)
    assert [len(next(batches)) for _ in range(8)] == [2] * 8
    adaptive = sampler.adaptive
    assert adaptive is not None and adaptive.update_due() and adaptive.trained_position() == 16
    assert not sampler.data.adaptive.update_due()  # the mixture's position does not move under the batch sampler
    with pytest.raises(PendingWeightsError, match=r"ledger holds them up to run position 16.*batch sampler's own "):
        next(batches)


@pytest.mark.parametrize("stop", [10, 28])
def test_a_resume_at_an_update_continues_the_identical_batches_and_ledger(stop: int) -> None:
    """Checkpoint right after an update, mid-epoch 0 (10 batches) or mid-epoch 1 (28), resume in a new sampler."""
    whole = _sampler()
    expected = train(whole, range(2))
    first = _sampler()
    head = train(first, range(2), stop=stop)
    adaptive = first.adaptive
    assert adaptive is not None and adaptive.pending == 0  # an update boundary: nothing recorded is lost
    state = first.state_dict()
    assert 0 < state["consumed"] < NUM_SAMPLES and state["adaptive"]["updates"] == adaptive.ledger.updates
    resumed = _sampler()
    resumed.load_state_dict(state)
    tail = train(resumed, range(state["epoch"], 2))
    assert head + tail == expected
    ledger, whole_ledger = resumed.data.adaptive.ledger, whole.data.adaptive.ledger
    assert (ledger.shares == whole_ledger.shares).all() and ledger.updates == whole_ledger.updates


def test_skipped_positions_and_a_loader_with_workers_change_nothing_but_what_they_skip() -> None:
    """skip_positions on the batch sampler, a DataLoader with 2 workers prefetching 4 batches (lag covers them)."""
    plain = _sampler(lag=4)
    expected = train(plain, range(2), workers=0)
    sampler = _sampler(lag=4)
    sampler.skip_positions(0, 20, 26)
    batches = train(sampler, range(2), workers=2)
    assert sum(len(b) for b in batches) == 2 * NUM_SAMPLES - 6
    assert batches == read_after_updates(sampler.state_dict(), range(2), lag=4)
    assert batches[:8] == expected[:8]  # the plan before the skip (and the weights there) is the same


def test_what_cannot_work_over_adaptive_weights_is_refused_naming_the_fix() -> None:
    """Skipping ids (they are revealed late), a state without the ledger; samplers without adaptive weights."""
    sampler = _sampler()
    with pytest.raises(ProvenanceUnsupported, match=r"cannot skip sample ids.*skip_positions"):
        sampler.skip_ids(0, 3)
    state = sampler.state_dict()
    del state["adaptive"]
    with pytest.raises(MalformedStateError, match=r"should hold 'adaptive'"):
        _sampler().load_state_dict(state)
    skipping = _sampler()
    with pytest.warns(UserWarning, match=r"skipped ids"):
        skipping.data.skip_ids(0, 3)
    with pytest.raises(ValueError, match=r"skips sample ids.*skip_positions"):
        iter(skipping)
    fixed = MixtureSampler([100, 50], [0.5, 0.5], num_samples=NUM_SAMPLES, num_replicas=1, rank=0, seed=1)
    assert ScheduledBatchSampler(fixed, batch_size=SCHEDULE).adaptive is None
    assert ScheduledBatchSampler(100, batch_size=4, num_replicas=1, rank=0).adaptive is None


def _lifting(scheduled: bool) -> Any:
    """The adaptive object a loop reports to; from update 2 its policy gives 0.01, below 1/block = 1/40 (lifted)."""
    weights = AdaptiveWeights(lambda ledger, statistics: np.array([0.5, 0.5] if ledger.updates < 1 else [0.99, 0.01]),
                              interval=INTERVAL)  # fmt: skip
    mixture = MixtureSampler([100, 50], weights, num_samples=NUM_SAMPLES, block=40, num_replicas=1, rank=0, seed=1)
    return ScheduledBatchSampler(mixture, batch_size=SCHEDULE).adaptive if scheduled else mixture.adaptive


@pytest.mark.parametrize("scheduled", [False, True], ids=["mixture", "batch_sampler"])
def test_the_warnings_of_update_and_warn_if_pending_point_at_the_callers_line(scheduled: bool) -> None:
    """No samples, a lifted weight, a checkpoint between updates: the warning names this file, on either path."""
    adaptive = _lifting(scheduled)
    with pytest.warns(RuntimeWarning, match="no reported samples") as empty:
        adaptive.update(position=INTERVAL)
    adaptive.record([1.0, 2.0], [0, 1])
    with pytest.warns(RuntimeWarning, match="misses the 2 losses") as pending:
        adaptive.warn_if_pending()
    with pytest.warns(RuntimeWarning, match=r"below 1/40.*lifted") as lifted:
        adaptive.update(position=2 * INTERVAL)
    assert adaptive.ledger.updates == 2 and adaptive.pending == 0
    assert [w.filename for w in [*empty, *pending, *lifted]] == [__file__] * 3
