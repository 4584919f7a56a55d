"""LocalitySampler over a prefetching source: when the source hears where the reading is, and that hearing costs
nothing in the ids, their order or the sampler's state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardwise import LocalitySampler
from shardwise._core.plan import wrap

SIZES = np.asarray([300, 0, 1200, 40, 900, 1500, 400, 1100, 800, 600, 700, 250])


class Listening:
    """A sharded dataset that records, at each call, how many ids had been pulled and the positions it was told of."""

    shard_sizes = SIZES

    def __init__(self) -> None:
        self.pulled = 0
        self.calls: list[tuple[int, list[int]]] = []

    def __len__(self) -> int:
        return int(SIZES.sum())

    def follow_plan(self, permutation: Any, positions: np.ndarray) -> None:
        self.calls.append((self.pulled, positions.tolist()))


def _pull(sampler: LocalitySampler, source: Listening, count: int | None = None) -> list[int]:
    ids = []
    for i in sampler:
        ids.append(i)
        source.pulled = len(ids)
        if count is not None and len(ids) == count:
            break
    return ids


def _steps(count: int, step: int) -> list[tuple[int, int]]:
    """``(first id, end of its chunk)`` of each step: every ``step`` ids within each chunk the shell computes."""
    starts, first, size = [], 0, min(LocalitySampler._FIRST_CHUNK or LocalitySampler._CHUNK, LocalitySampler._CHUNK)
    while first < count:
        stop = min(first + size, count)
        starts += [(at, stop) for at in range(first, stop, step)]
        first, size = stop, min(2 * size, LocalitySampler._CHUNK)
    return starts


@pytest.mark.parametrize("mixing", ["streams", "windows"])
def test_the_source_hears_every_step_as_its_first_id_is_pulled(mixing: str) -> None:
    """Told at ids 0, step, 2 step... of each chunk, as they are pulled (not when computed: a chunk is computed
    ahead), of the next 8 steps' positions (within the chunk) each time; the ids are the plan's, as a sampler over the counts alone hands them out."""
    source = Listening()
    sampler = LocalitySampler(source, window=2, mixing=mixing, num_replicas=3, rank=1, seed=4)
    ids = _pull(sampler, source)
    assert ids == list(LocalitySampler(SIZES, window=2, mixing=mixing, num_replicas=3, rank=1, seed=4))
    step = source.calls[1][0]
    steps = _steps(len(ids), step)
    assert step >= 32 and [at for at, _ in source.calls] == [at for at, _ in steps]
    positions = np.arange(len(ids)) * 3 + 1  # rank 1 of 3, from position 0 (the last may wrap: padding)
    total = int(SIZES.sum())
    for (at, told), (_, end) in zip(source.calls, steps, strict=True):
        expected = positions[at : min(at + 8 * step, end)]
        assert told == wrap(expected, total, 1).tolist()  # padding reads the plan's last position


def test_a_state_taken_mid_step_resumes_exactly() -> None:
    """A state taken inside a step and one at a step's edge: a new sampler continues with the very next id."""
    source = Listening()
    everything = _pull(LocalitySampler(source, window=3, num_replicas=2, rank=0, seed=1), source)
    step = source.calls[1][0]
    for count in (step + 5, 2 * step):
        source = Listening()
        sampler = LocalitySampler(source, window=3, num_replicas=2, rank=0, seed=1)
        head = _pull(sampler, source, count)
        state = sampler.state_dict()
        again = Listening()
        resumed = LocalitySampler(again, window=3, num_replicas=2, rank=0, seed=1)
        resumed.load_state_dict(state)
        assert head + _pull(resumed, again) == everything
        assert again.calls[0][0] == 0  # the resumed pass tells its source where it starts
