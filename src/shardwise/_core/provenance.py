"""Provenance arithmetic: which plan positions a (rank, step) trains, and the reverse, in O(1).

A pass over an epoch starts at plan position ``start`` (0, or the ``consumed`` of the state the run
resumed from) with ``W`` ranks. Two ways of cutting steps exist (see ``_core.plan`` and
``_core.schedule``):

- **unit dealing** (every sampler but ``ScheduledBatchSampler``): rank ``r`` takes the units at
  ``start + r, start + r + W, ...``; a step is ``per_step`` consecutive units of one rank (the
  DataLoader's ``batch_size`` over an index sampler, 1 for a batch sampler, whose unit is a batch);
- **step dealing** (``ScheduledBatchSampler``): global step ``s`` covers ``W * b_s`` consecutive
  positions, rank ``r`` the ``r``-th slice of ``b_s``; runs of equal-size steps describe the pass.

Padding (``Even.PAD``) wraps the last at most ``W - 1`` positions back into the plan
(``_core.plan.wrap``, NOTE [ Padding wrap ]: to its start, or to the last positions of a
``LocalitySampler``'s plan), so a position may be trained twice in a pass: the reverse lookups return every occurrence,
found by the same wrap (``_core.plan.padded_positions``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import check_int
from .mixture import MixturePlan
from .mixture_blocks import element_keys, floor_share, golden_step
from .permutation import GOLDEN, feistel_unpermute, mix64
from .plan import Even, padded_positions, rank_count, rank_positions, wrap
from .public import public
from .schedule import Run


class ProvenanceUnsupported(NotImplementedError):
    """A sampler whose plan cannot (yet) be inverted in O(1): which position holds a given sample."""


def steps_in_pass(count: int, per_step: int, *, drop_last: bool = False) -> int:
    """Steps of each rank when it takes ``count`` units, ``per_step`` a step (a DataLoader's rule)."""
    return count // per_step if drop_last else -(-count // per_step)


def step_units(step: object, per_step: int, count: int, *, drop_last: bool = False) -> tuple[int, int]:
    """The local units ``[first, stop)`` of one rank's step ``step``, when the rank takes ``count`` units.

    Raises:
        ValueError: ``step`` is negative or past the pass's last step (the message gives the range).
    """
    steps = steps_in_pass(count, per_step, drop_last=drop_last)
    step = check_int("step", step, minimum=0)
    if step >= steps:
        raise ValueError(
            f"step should be in [0, {steps - 1}] (this pass has {steps} steps per rank), but got step={step}"
            if steps
            else f"this pass has no steps (0 units per rank), but got step={step}"
        )
    first = step * per_step
    return first, min(first + per_step, count)


def unit_occurrences(position: int, start: int, world_size: int, count: int, total: int,
                     period: int | None = None) -> list[tuple[int, int]]:  # fmt: skip
    """``(rank, local unit)`` of every time plan ``position`` is dealt in a pass of ``count`` units a rank.

    A position before ``start`` was trained before the pass, except where padding wraps to it.
    ``period``: the plan's wrap period (``_core.plan.wrap``). O(W / period + W / total).
    """
    dealt = padded_positions(position, total, period, start, start + count * world_size).tolist()
    return [((d - start) % world_size, (d - start) // world_size) for d in dealt]


def dealt_step_positions(total: int, start: int, world_size: int, rank: int, step: int, per_step: int, even: Even,
                         period: int | None, *, drop_last: bool = False) -> np.ndarray:  # fmt: skip
    """Plan positions rank ``rank`` trains at its step ``step`` of a unit-dealt pass from ``start``."""
    count = rank_count(total, start, world_size, even)
    first, stop = step_units(step, per_step, count, drop_last=drop_last)
    return rank_positions(start, rank, world_size, first, stop, total, period)


def dealt_position_steps(total: int, start: int, world_size: int, position: int, per_step: int, even: Even,
                         period: int | None, *, drop_last: bool = False) -> list[tuple[int, int]]:  # fmt: skip
    """``(rank, step)`` of every time plan ``position`` is trained in a unit-dealt pass from ``start``."""
    count = rank_count(total, start, world_size, even)
    last = steps_in_pass(count, per_step, drop_last=drop_last)
    occurrences = unit_occurrences(position, start, world_size, count, total, period)
    found = [(rank, unit // per_step) for rank, unit in occurrences]
    return [(rank, step) for rank, step in found if step < last]


def dealt_step_span(total: int, start: int, world_size: int, step: int, per_step: int, even: Even, *,
                    drop_last: bool = False) -> tuple[int, int]:  # fmt: skip
    """The plan positions ``[first, stop)`` that global step ``step`` of a unit-dealt pass from ``start`` covers."""
    count = rank_count(total, start, world_size, even)
    first, stop = step_units(step, per_step, count, drop_last=drop_last)
    return start + first * world_size, min(start + stop * world_size, total)


def run_of_step(runs: Sequence[Run], step: int) -> tuple[Run, int]:
    """The run holding global step ``step`` of a pass, and the step's number within the run."""
    step = check_int("step", step, minimum=0)
    for run in runs:
        if step < run.steps:
            return run, step
        step -= run.steps
    steps = sum(run.steps for run in runs)
    raise ValueError(f"step should be in [0, {steps - 1}] (this pass has {steps} steps), but got step={step + steps}")


def run_step_positions(runs: Sequence[Run], world_size: int, total: int, step: int, rank: int,
                       period: int | None = None) -> np.ndarray:  # fmt: skip
    """Plan positions of rank ``rank``'s batch at global step ``step`` (step dealing), wrapped into the plan.

    Returns:
        positions: ``(batch_size,)`` int64.
    """
    run, within = run_of_step(runs, step)
    first = run.first + within * world_size * run.batch_size + rank * run.batch_size
    return wrap(first + np.arange(run.batch_size, dtype=np.int64), total, period)


def run_occurrences(runs: Sequence[Run], world_size: int, total: int, position: int,
                    period: int | None = None) -> list[tuple[int, int]]:  # fmt: skip
    """``(rank, step)`` of every time plan ``position`` is trained in a pass of ``runs`` (step dealing)."""
    found = []
    high = max((run.end(world_size) for run in runs), default=0)
    for dealt in padded_positions(position, total, period, 0, high).tolist():
        before = 0
        for run in runs:
            span = world_size * run.batch_size
            if run.first <= dealt < run.end(world_size):
                offset = dealt - run.first
                found.append(((offset % span) // run.batch_size, before + offset // span))
                break
            before += run.steps
    return found


# -- mixtures: where draw d of source i lands ---------------------------------------------------------
def _offset_of_slot(plan: MixturePlan, slot_keys: np.ndarray | None, block: int, slot: int) -> int:
    """The offset within block number ``block`` whose slot is ``slot`` (inverse of ``_core.mixture_blocks.slots``)."""
    size = plan.block
    if size == 1:
        return 0
    if slot_keys is None or plan.interleave:
        rotation = 0
        if slot_keys is not None:
            mixed = mix64(np.asarray([block], dtype=np.uint64) * GOLDEN ^ slot_keys[0])
            rotation = int(mixed[0] % np.uint64(size))
        return (slot - rotation) * pow(golden_step(size), -1, size) % size
    keys = element_keys(slot_keys, np.asarray([block], dtype=np.int64))
    return int(feistel_unpermute(np.asarray([slot], dtype=np.int64), size, keys)[0])


def mixture_positions_of(plan: MixturePlan, seed: int, epoch: int, index: int) -> np.ndarray:
    """Every plan position of ``epoch`` that draws global index ``index``, ascending.

    Sample ``k`` of source ``i`` is drawn once per cycle of that source: draw ``c * n_i + j`` with
    ``j`` its place in cycle ``c``'s permutation. Each draw's block comes from the exact counts by
    bisection (``Layout.blocks_to_reach``), its slot from the counts at the block's start, and its
    offset by inverting the block's shuffle: O(log n) a draw, O(cycles of the source in the epoch).
    """
    offsets = plan.offsets
    source = int(np.searchsorted(offsets, index, side="right")) - 1
    size = int(plan.sizes[source])
    within = index - int(offsets[source])
    layout = plan.layout(epoch)
    total = plan.plan_size(epoch)
    slot_keys, keys = plan.epoch_keys(seed, epoch)
    found: list[int] = []
    cycle = 0
    while True:
        j = within
        if keys is not None and size > 1:
            rounds = element_keys(keys[source], np.asarray([cycle], dtype=np.int64))
            j = int(feistel_unpermute(np.asarray([within], dtype=np.int64), size, rounds)[0])
        draw = cycle * size + j
        reached = layout.blocks_to_reach(source, draw + 1)
        if reached is None or (reached - 1) * plan.block >= total:
            break
        block = reached - 1
        before = layout.counts_at_block(block)[source]
        s = int(layout.stretch_of(np.asarray([block]))[0])
        start = (block - int(layout.first[s])) * plan.block
        phase, denominator = int(layout.phase[s]), int(layout.denominator[s])
        low = int(layout.prefix[s, source])
        # The source's slots in this block start where the shares of the sources before it end.
        first_slot = floor_share(low, start + plan.block, phase, denominator)
        first_slot -= floor_share(low, start, phase, denominator)
        position = block * plan.block + _offset_of_slot(plan, slot_keys, block, first_slot + draw - before)
        if position < total:
            found.append(position)
        cycle += 1
    return np.asarray(sorted(found), dtype=np.int64)


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(ProvenanceUnsupported)


def scan_units(source: Callable[[np.ndarray], list[Any]], first: int, stop: int, index: int) -> np.ndarray:
    """The plan positions in ``[first, stop)`` whose unit (a sample id, or a batch of them) holds ``index``."""
    positions = np.arange(first, stop, dtype=np.int64)
    units = source(positions)
    if units and isinstance(units[0], (list, tuple)):
        sizes = np.fromiter((len(u) for u in units), dtype=np.int64, count=len(units))
        flat = np.fromiter((i for u in units for i in u), dtype=np.int64, count=int(sizes.sum()))
        hits: np.ndarray = np.repeat(positions, sizes)[flat == index]
        return hits  # a sample twice in one batch (a small class drawn with replacement) is two occurrences
    found: np.ndarray = positions[np.asarray(units, dtype=np.int64) == index]
    return found
