"""Which samples trained at step s, and when a sample trains: O(1) answers, no per-sample file.

Every shardwise plan is a function of ``(seed, epoch, position)`` and dealt out by position (see
``shardwise._core.provenance``), so the batch of rank ``r`` at step ``s`` is computed from the plan
positions it covers, and a sample's steps from the positions that hold it (the keyed permutation
of ``ShardedSampler`` and the exact counts of ``MixtureSampler`` invert in O(1) and O(log n)).

The sampler is only queried: its position, epoch and seed stay as they are (a wrapper made by
``shard()`` re-reads the wrapped sampler's epoch to answer, so query it between epochs, not while a
loop iterates it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from torch.utils.data.distributed import DistributedSampler

from .._core.errors import check_int, check_sample_id
from .._core.provenance import ProvenanceUnsupported
from .._core.world import World
from .base import PlanSampler

__all__ = ["ProvenanceUnsupported", "Trained", "TrainedBatch", "resolve", "skip_steps", "when", "which"]


@dataclass(frozen=True)
class TrainedBatch:
    """What one rank trained at one step: sample ids, and for a mixture each one's source.

    ``sources[k]`` names the source of ``indices[k]`` and ``source_indices[k]`` is its index within
    that source (``None`` for a sampler that is not a mixture). For packed batches ``pieces[k]`` is
    ``(row, start, stop)``: the row of the batch and the token range of ``indices[k]`` it trained
    (``None`` for batches that are not packed).
    """

    epoch: int
    step: int
    rank: int
    indices: list[int]
    sources: list[str] | None = None
    source_indices: list[int] | None = None
    pieces: list[tuple[int, int, int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Trained:
    """One time a sample is trained: ``(epoch, step, rank)`` and the plan position that holds it."""

    epoch: int
    step: int
    rank: int
    position: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _yields_batches(sampler: PlanSampler[Any]) -> bool:
    """A batch sampler's unit is a whole step's batch; an index sampler's unit is one sample."""
    return not isinstance(sampler, DistributedSampler)


def resolve(
    obj: object, batch_size: int | None = None, drop_last: bool | None = None
) -> tuple[PlanSampler[Any], int, bool]:
    """``(sampler, units per step, drop_last)`` of a shardwise sampler, batch sampler or DataLoader.

    A DataLoader gives its ``batch_size`` and ``drop_last``; a torch ``BatchSampler`` over a shardwise
    sampler gives its own. An index sampler alone needs ``batch_size`` (the DataLoader's).

    Raises:
        TypeError: ``obj`` holds no shardwise sampler.
        ValueError: ``batch_size`` missing for an index sampler, or given for a batch sampler.
    """
    sampler: object = obj
    if hasattr(obj, "batch_sampler") and hasattr(obj, "dataset"):  # a DataLoader
        inner = obj.batch_sampler
        if isinstance(inner, PlanSampler):
            sampler = inner
        else:
            sampler = getattr(obj, "sampler", None)
            batch_size = getattr(obj, "batch_size", None) if batch_size is None else batch_size
            drop_last = bool(getattr(obj, "drop_last", False)) if drop_last is None else drop_last
    elif not isinstance(obj, PlanSampler) and isinstance(getattr(obj, "sampler", None), PlanSampler):
        sampler = obj.sampler  # type: ignore[attr-defined]  # a torch BatchSampler over a shardwise sampler
        batch_size = getattr(obj, "batch_size", None) if batch_size is None else batch_size
        drop_last = bool(getattr(obj, "drop_last", False)) if drop_last is None else drop_last
    if not isinstance(sampler, PlanSampler):
        raise TypeError(
            f"sampler should be a shardwise sampler, batch sampler, or a DataLoader over one, but got "
            f"{type(obj).__name__}; provenance follows a shardwise plan (wrap a torch sampler with shardwise.shard)"
        )
    if _yields_batches(sampler):
        if batch_size is not None and isinstance(obj, PlanSampler):
            raise ValueError(
                f"batch_size has no effect for {type(sampler).__name__}, a batch sampler whose every unit is one "
                f"step's batch, but got batch_size={batch_size!r}; leave it out"
            )
        return sampler, 1, bool(drop_last)
    if batch_size is None:
        raise ValueError(
            f"batch_size should be the DataLoader's batch_size (samples per rank per step) for "
            f"{type(sampler).__name__}, an index sampler, but got batch_size=None; pass batch_size=..."
        )
    return sampler, check_int("batch_size", batch_size, minimum=1), bool(drop_last)


def _world_size(sampler: PlanSampler[Any], world_size: int | None) -> int:
    if world_size is None:
        return sampler.num_replicas
    return check_int("world_size", world_size, minimum=1)


def _mixture_of(sampler: object) -> Any:
    """The mixture whose sources name the indices: the sampler itself or the index sampler it batches."""
    for candidate in (sampler, getattr(sampler, "data", None)):
        if hasattr(candidate, "source_names") and hasattr(candidate, "offsets"):
            return candidate
    return None


def _flatten(units: list[Any]) -> list[Any]:
    if units and isinstance(units[0], (list, tuple)):
        return [i for unit in units for i in unit]
    return list(units)


def _pieces(items: list[Any]) -> list[tuple[int, int, int]] | None:
    """``(row, start, stop)`` of every item of packed batches (``PackedIndex``), else ``None``."""
    if not items or not all(hasattr(i, "row") and hasattr(i, "stop") for i in items):
        return None
    return [(int(i.row), int(i.start), int(i.stop)) for i in items]


def which(
    sampler: Any,
    *,
    epoch: int,
    step: int,
    rank: int | None = None,
    batch_size: int | None = None,
    world_size: int | None = None,
    start: int = 0,
    drop_last: bool | None = None,
) -> list[TrainedBatch]:
    """The samples trained at ``step`` of ``epoch``: by ``rank``, or by every rank (``rank=None``).

    Steps count from the start of the pass: position ``start`` of the epoch's plan, 0 for a pass
    from the epoch's start, or the ``consumed`` of the state a run resumed from (its step 0 is the
    first step after the restart, at that run's world size).

    Cost: O(batch) per rank and no table, at any n (1e9 included) for ``ShardedSampler`` and
    ``MixtureSampler``; the index-based samplers read their shared index (memory-mapped) as they
    do when iterating. ``shard()`` re-runs the wrapped sampler up to the step (O(position)).

    Args:
        sampler: a shardwise sampler or batch sampler, a torch ``BatchSampler`` over one, or a
            ``DataLoader`` over either (its ``batch_size`` and ``drop_last`` are used).
        epoch: the epoch.
        step: the step of each rank within the pass, from 0.
        rank: one rank, or ``None`` for every rank at that global step.
        batch_size: samples per rank per step, for an index sampler used without its DataLoader.
        world_size: ranks of the run (default: the sampler's resolved world size).
        start: the plan position the pass began at (a resumed run: its state's ``consumed``).
        drop_last: the DataLoader dropped its last short batch (default: the loader's, else ``False``).

    Returns:
        One :class:`TrainedBatch` per rank asked, in rank order.

    Example:
        >>> from shardwise import ShardedSampler, which
        >>> sampler = ShardedSampler(10, num_replicas=2, rank=0, shuffle=False)
        >>> [b.indices for b in which(sampler, epoch=0, step=1, batch_size=2)]
        [[4, 6], [5, 7]]
    """
    sampler, per_step, drop_last = resolve(sampler, batch_size, drop_last)
    epoch = check_int("epoch", epoch, minimum=0)
    size = _world_size(sampler, world_size)
    start = check_int("start", start, minimum=0)
    ranks = range(size) if rank is None else [check_int("rank", rank, minimum=0, maximum=size - 1)]
    mixture = _mixture_of(sampler)
    # Every rank's positions in one ascending call: one pass over the plan for all ranks (a shard()
    # wrapper reads its sampler forward), and a single round of numpy calls instead of one per rank.
    plan = sampler.plan
    per_rank = [plan.step_positions(epoch, start, World(r, size, "query"), step, per_step, drop_last) for r in ranks]
    together = np.concatenate(per_rank)
    order = np.argsort(together, kind="stable")
    units: list[Any] = [None] * together.size
    for slot, unit in zip(order.tolist(), plan.units(epoch, together[order], size), strict=True):
        units[slot] = unit
    bounds = np.cumsum([0, *(len(p) for p in per_rank)]).tolist()
    found = []
    for n, r in enumerate(ranks):
        items = _flatten(units[bounds[n] : bounds[n + 1]])
        indices, pieces = [int(i) for i in items], _pieces(items)
        if mixture is None:
            found.append(TrainedBatch(epoch, int(step), r, indices, pieces=pieces))
            continue
        offsets = np.asarray(mixture.offsets, dtype=np.int64)
        where = np.searchsorted(offsets, np.asarray(indices, dtype=np.int64), side="right") - 1
        names = [mixture.source_names[i] for i in where.tolist()]
        within = (np.asarray(indices, dtype=np.int64) - offsets[where]).tolist()
        found.append(TrainedBatch(epoch, int(step), r, indices, names, within, pieces))
    return found


def _epochs(epochs: object) -> list[int]:
    values: list[object] = list(epochs) if isinstance(epochs, Iterable) and not isinstance(epochs, str) else [epochs]
    return [check_int("epochs", e, minimum=0) for e in values]


def when(
    sampler: Any,
    index: int,
    *,
    epochs: int | Iterable[int],
    batch_size: int | None = None,
    world_size: int | None = None,
    start: int = 0,
    drop_last: bool | None = None,
) -> list[Trained]:
    """Every ``(epoch, step, rank)`` at which sample ``index`` is trained, over ``epochs``.

    Cost per epoch: ``ShardedSampler`` O(1) (the keyed permutation inverted); ``MixtureSampler``
    (``index`` in the concatenated index space) O(log n) per draw, one draw per cycle of its source;
    ``ScheduledBatchSampler`` as the sampler or length under it; ``BucketBatchSampler`` O(log n)
    on its shared index (a ``sort_window`` plan is searched: O(n)); ``LocalitySampler`` O(log S).
    ``PackedBatchSampler``, ``ClassBalancedBatchSampler``, ``TwoStreamBatchSampler`` and
    ``WeightedSampler`` have no cheaper inverse and read the epoch's plan: O(n) per epoch (at 1e7,
    measured in BENCHMARKS.md). ``shard()`` wrappers raise :class:`ProvenanceUnsupported`
    (``which`` answers the forward question for them).

    Args:
        sampler: as for :func:`which`.
        index: the sample id (a ``DataLoader`` index).
        epochs: one epoch or several (a ``range``).
        batch_size, world_size, drop_last: as for :func:`which`.
        start: the plan position the pass over the first of ``epochs`` began at (later epochs start at 0).

    Returns:
        The occurrences, by epoch then step; padding (``Even.PAD``) may train a sample twice.

    Raises:
        ValueError: ``index`` is not a sample id of the sampler (``[0, sampler.plan.id_count)``), for every sampler.
        ProvenanceUnsupported: a ``shard()`` wrapper.

    Example:
        >>> from shardwise import ShardedSampler, when
        >>> sampler = ShardedSampler(10, num_replicas=2, rank=0, shuffle=False)
        >>> [(t.step, t.rank) for t in when(sampler, 7, epochs=0, batch_size=2)]
        [(1, 1)]
    """
    sampler, per_step, drop_last = resolve(sampler, batch_size, drop_last)
    size = _world_size(sampler, world_size)
    start = check_int("start", start, minimum=0)
    plan = sampler.plan
    count = plan.id_count
    index = check_int("index", index, minimum=0) if count is None else (
        check_sample_id("index", index, count, owner=type(sampler).__name__))  # fmt: skip
    found = []
    for n, epoch in enumerate(_epochs(epochs)):
        first = start if n == 0 else 0
        for position in plan.trained_positions_of(epoch, index).tolist():
            for rank, step in plan.position_steps(epoch, first, size, position, per_step, drop_last):
                found.append(Trained(epoch, step, rank, position))
    return sorted(found, key=lambda t: (t.epoch, t.step, t.rank))


def skip_steps(
    sampler: Any,
    *,
    epoch: int,
    steps: range,
    batch_size: int | None = None,
    world_size: int | None = None,
    start: int = 0,
    drop_last: bool | None = None,
) -> tuple[int, int]:
    """Never train the samples of global ``steps`` of ``epoch`` (as numbered by :func:`which`), at any world size.

    The steps are turned into the plan positions they cover, absolute in the epoch's plan, and put in
    the sampler's skip ledger (``sampler.skip_positions``), which ``state_dict()`` carries: a run
    resumed from that state, at any world size and after any number of restarts, never trains them,
    trains everything else exactly once, and every rank keeps the same number of steps.

    Typical use, after a loss spike: load the checkpoint's state into the sampler, skip the bad
    steps counted from it (``start=state["consumed"]``), save ``sampler.state_dict()`` back.

    Returns:
        The ``[first, stop)`` plan positions added to the ledger.

    Raises:
        ValueError: empty or out-of-range steps, or steps before what the sampler already trained.
    """
    sampler, per_step, drop_last = resolve(sampler, batch_size, drop_last)
    if not isinstance(steps, range) or steps.step != 1 or len(steps) == 0:
        raise ValueError(f"steps should be a non-empty range of consecutive steps, but got steps={steps!r}")
    epoch = check_int("epoch", epoch, minimum=0)
    size = _world_size(sampler, world_size)
    start = check_int("start", start, minimum=0)
    plan = sampler.plan
    first, _ = plan.step_span(epoch, start, size, steps.start, per_step, drop_last)
    _, stop = plan.step_span(epoch, start, size, steps.stop - 1, per_step, drop_last)
    plan_first, plan_last = (int(p) for p in plan.uncompacted(epoch, np.asarray([first, stop - 1])))
    plan_stop = plan_last + 1
    sampler.skip_positions(epoch, plan_first, plan_stop)
    return plan_first, plan_stop
