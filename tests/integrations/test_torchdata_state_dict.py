"""torchdata's own ``StatefulDataLoader`` state-dict checks, with shardwise samplers in place of torch's.

Adapted from pytorch/data ``test/stateful_dataloader/test_state_dict.py`` (the map-style cases: resume
after every step, ``snapshot_every_n_steps``, persistent workers, the initial and end-of-epoch states,
loading into a loader that had started, JSON round trips, a state asked for right after a resume,
another worker count). torchdata's samplers give the same order every epoch, so its tests compare a
resumed loader with the uninterrupted one; shardwise samplers advance the epoch by themselves, so
here the loader after the resume must also give the uninterrupted run's next epoch.
Loaders of 4 steps (rank 1 of 2, batch 2); the file runs in about 15 s.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import shardwise

pytestmark = [
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
    pytest.mark.timeout(120),
]

N = 16
STEPS = 4  # a rank's steps in an epoch
KINDS = ["index", "bucket"]
LOADERS = {  # (num_workers, persistent_workers, snapshot_every_n_steps): torchdata's test_no_mp, mp_x, mp_pw, every_n
    "no_workers": (0, False, 1),
    "workers": (2, False, 1),
    "persistent": (2, True, 1),
    "every_3_steps": (2, True, 3),
}


def _loader(kind: str, setting: str, **changes: Any) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    workers, persistent, every = LOADERS[setting]
    options: dict[str, Any] = {"num_workers": workers, "persistent_workers": persistent,
                               "snapshot_every_n_steps": every, **changes}  # fmt: skip
    world = {"num_replicas": 2, "rank": 1, "seed": 2}
    if kind == "index":
        return StatefulDataLoader(list(range(N)), sampler=shardwise.ShardedSampler(N, **world), batch_size=2, **options)
    sampler = shardwise.BucketBatchSampler(np.arange(N) % 5 + 1, batch_size=2, **world)
    return StatefulDataLoader(list(range(N)), batch_sampler=sampler, **options)


def _epoch(loader: Any) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _json(state: dict[str, Any]) -> dict[str, Any]:
    """The state as a JSON file would give it back (torchdata's TestJsonSerDe): shardwise's part is plain ints."""
    loaded: dict[str, Any] = json.loads(json.dumps(state))
    return loaded


@pytest.mark.parametrize("setting", list(LOADERS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_state_after_every_step_resumes_the_rest_of_the_epoch_and_then_the_next(kind: str, setting: str) -> None:
    """After k = 0..4 steps (4: inside the loop, after the last batch), a new loader gives the rest, then epoch 1."""
    whole = _loader(kind, setting)
    epoch0, epoch1 = _epoch(whole), _epoch(whole)
    assert len(epoch0) == STEPS and epoch0 != epoch1
    first = _loader(kind, setting)
    iterator, states = iter(first), []
    states.append(first.state_dict())
    for _ in range(STEPS):
        next(iterator)
        states.append(first.state_dict())
    for steps, state in enumerate(states):
        resumed = _loader(kind, setting)
        resumed.load_state_dict(_json(state))
        assert epoch0[:steps] + _epoch(resumed) == epoch0, f"after {steps} steps"
        if steps in (0, 2, STEPS):  # the next epoch too (it costs a second worker start without persistent workers)
            assert _epoch(resumed) == epoch1, f"the epoch after a resume at step {steps}"


@pytest.mark.parametrize("setting", ["persistent", "every_3_steps"])
@pytest.mark.parametrize("kind", KINDS)
def test_end_and_initial_states_load_into_a_loader_that_had_started(kind: str, setting: str) -> None:
    """torchdata's TestSnapshotEnd / TestInitialState / TestMultiEpochState: the state before the first batch and
    the one after the loop, loaded into a loader two steps into its epoch, give epoch 0, and epochs 1 then 2."""
    first = _loader(kind, setting)
    initial = first.state_dict()
    epochs = [_epoch(first)]
    end = first.state_dict()
    epochs += [_epoch(first), _epoch(first)]
    for state, expected in ((initial, epochs[:2]), (end, epochs[1:])):
        started = _loader(kind, setting)
        iterator = iter(started)
        next(iterator), next(iterator)
        started.load_state_dict(state)
        assert [_epoch(started), _epoch(started)] == expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_asked_for_two_steps_after_a_resume_resumes_exactly(kind: str) -> None:
    """torchdata's TestFastStateDictRequest: load, two steps, state_dict() (before every worker sent a state):
    a new loader from that state gives the rest, with snapshots every 3 steps and persistent workers."""
    epoch0 = _epoch(_loader(kind, "every_3_steps"))
    first = _loader(kind, "every_3_steps")
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    first.load_state_dict(state)
    iterator = iter(first)
    next(iterator), next(iterator)
    again = _loader(kind, "every_3_steps")
    again.load_state_dict(first.state_dict())
    assert epoch0[:3] + _epoch(again) == epoch0


@pytest.mark.parametrize("workers", [(0, 2), (2, 0)], ids=["0->2", "2->0"])
def test_another_worker_count_is_refused_by_torchdata(workers: tuple[int, int]) -> None:
    """torchdata's TestNumWorkersMismatch: its state needs the same num_workers (its rule), with shardwise samplers
    too; docs/torchdata.md says so."""
    saved, loading = workers
    first = _loader("index", "no_workers", num_workers=saved)
    next(iter(first))
    state = first.state_dict()
    other = _loader("index", "no_workers", num_workers=loading)
    other.load_state_dict(state)
    with pytest.raises((AssertionError, KeyError)):
        iter(other)
