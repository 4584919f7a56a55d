"""The skip ledger of every sampler: plan positions and sample ids never trained, honoured around the plan hooks.

:class:`SkipQueries` is a base of ``PlanQueries`` (``samplers.queries``), so of every
``PlanSampler``: ``skip_positions`` / ``skip_ids`` (and their many-rows forms) record ranges in the
ledger (``_core.skips``, carried in ``state_dict``), and the ledger is honoured around the two plan
hooks ``_plan_size`` / ``_open_pass`` of every subclass, once, here (:func:`ledger_for` is the
ledger of an epoch, skipped ids translated to positions): a subclass's own hooks see plain plan
positions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .._core.errors import check_int, check_ranges
from .._core.provenance import ProvenanceUnsupported
from .._core.skips import IdSkips, SkipLedger
from .._core.world import World
from .callers import warn_outside
from .passes import UnitSource
from .shell import Shell


def _compacted_size(raw: Callable[[Any, int], int]) -> Callable[[Any, int], int]:
    """A ``_plan_size`` hook honouring the skip ledger: the plan's size without its skipped positions."""

    @functools.wraps(raw)
    def size(self: Any, epoch: int) -> int:
        total = raw(self, epoch)
        skips = ledger_for(self, epoch)
        # Only the most derived class's hook applies the ledger: a subclass calling super() gets the raw size.
        return skips.size(epoch, total) if skips and type(self)._plan_size is size else total

    return size


def _compacted_source(raw: Callable[..., UnitSource]) -> Callable[..., UnitSource]:
    """An ``_open_pass`` hook honouring the skip ledger: compacted positions are mapped to plan positions."""

    @functools.wraps(raw)
    def open_pass(self: Any, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        source = raw(self, epoch, seed, world, start)
        if type(self)._open_pass is not open_pass:  # as in _compacted_size: once, outermost
            return source
        total = self._raw_plan_size(epoch)
        if self.__dict__.get("_skip_ids"):
            # NOTE [ Skipped ids the plan reveals late ]: the ledger is read when a chunk is computed, not
            # when the pass opens; the positions it adds lie past those computed before, which keep their units.
            return lambda positions: source(ledger_for(self, epoch).to_plan(epoch, positions, total))  # type: ignore[union-attr]
        skips = self._skips
        if not skips:
            return source
        return lambda positions: source(skips.to_plan(epoch, positions, total))

    return open_pass


def ledger_for(self: Any, epoch: int) -> SkipLedger | None:
    """The skip ledger of ``epoch``: its skipped positions and, translated, the positions of skipped ids.

    The translation (``_positions_of_ids``, O(log n) an id) is cached for the last epoch asked:
    O(k log k) once per epoch for ``k`` skipped ids, then a tuple comparison per call. A plan that
    is written at run time (``_ids_extent``: an adaptive mixture) reveals more of the epoch at each
    update: only the positions it revealed are read then, forward (``_ids_between``, O(revealed)),
    and added (NOTE [ Skipped ids the plan reveals late ] in ``samplers.mixture``).
    """
    skips = self.__dict__.get("_skips")
    ids = self.__dict__.get("_skip_ids")
    if not ids or self.__dict__.get("_resolving_ids"):
        return skips  # type: ignore[no-any-return]
    seed = self.seed
    extent = self._ids_extent(epoch)
    cached = self.__dict__.get("_ids_cache")
    same = cached is not None and cached[0] == epoch and cached[1] == seed and cached[2] is skips and cached[3] is ids
    if same and cached[5] == extent:
        return cached[4]  # type: ignore[no-any-return]
    grown = same and extent is not None and cached[5] is not None and cached[5][0] is extent[0]
    self.__dict__["_resolving_ids"] = True  # the translation reads the raw plan, never this ledger
    try:
        rows = ids.applying(epoch)
        if grown and cached[5][1] <= extent[1]:
            base, positions = cached[4], _revealed(self, epoch, rows, cached[5][1], extent[1])
        else:
            base, positions = skips, _translated(self, epoch, rows)
    finally:
        self.__dict__["_resolving_ids"] = False
    ledger = base.add_many(epoch, np.stack([positions, positions + 1], axis=1)) if positions.size else base
    self.__dict__["_ids_cache"] = (epoch, seed, skips, ids, ledger, extent)
    return ledger  # type: ignore[no-any-return]


def _translated(self: Any, epoch: int, rows: np.ndarray) -> np.ndarray:
    """The positions of ``epoch`` holding the ids of ``rows`` (``IdSkips.applying``), by the plan's inverse."""
    found = [np.empty(0, dtype=np.int64)]
    for floor in np.unique(rows[:, 0]).tolist():  # one vectorised call per distinct floor (usually one)
        starts, stops = rows[rows[:, 0] == floor, 1], rows[rows[:, 0] == floor, 2]
        lengths = stops - starts
        every = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        positions = self._positions_of_ids(epoch, every)
        found.append(positions[positions >= floor])
    return np.unique(np.concatenate(found))


def _warn_revealed_late(kind: str) -> None:
    """Warn, at the caller's line, that an epoch skipping ids shrinks as the plan is written (see ``_ids_extent``)."""
    warn_outside(
        f"{kind} with adaptive weights: the plan positions that draw the skipped ids are known only as far as the "
        "weight ledger (ledger.known_until); each update removes those it reveals, so an epoch that skips ids "
        "ends earlier than len(sampler) said at its start (equally on every rank; len is exact once the epoch's "
        "weights are all known). The skipped ids never train. Count steps by epochs, not len(loader) x epochs "
        "(max_steps, an LR schedule's length), or build the mixture without the ids (docs/mixture.md)",
    )


_REVEAL_CHUNK = 1 << 16
"""Plan positions read at a time by :func:`_revealed` (O(chunk) memory)."""


def _revealed(self: Any, epoch: int, rows: np.ndarray, first: int, stop: int) -> np.ndarray:
    """The positions in ``[first, stop)`` of ``epoch`` holding the ids of ``rows``, by reading the plan forward."""
    found = [np.empty(0, dtype=np.int64)]
    for low in range(first, stop, _REVEAL_CHUNK):
        positions = np.arange(low, min(low + _REVEAL_CHUNK, stop), dtype=np.int64)
        held = np.asarray(self._ids_between(epoch, positions), dtype=np.int64)
        found.append(positions[IdSkips.holding(rows, positions, held)])
    return np.concatenate(found)


class SkipQueries(Shell):
    """The skip ledger of a ``PlanSampler``; see the module docstring."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The skip ledger (NOTE in shardwise._core.skips) is honoured around the two plan hooks, once
        # for every sampler: a subclass's own hooks see plain plan positions.
        super().__init_subclass__(**kwargs)
        if "_plan_size" in cls.__dict__:
            cls._plan_size = _compacted_size(cls.__dict__["_plan_size"])  # type: ignore[method-assign,assignment]
        if "_open_pass" in cls.__dict__:
            cls._open_pass = _compacted_source(cls.__dict__["_open_pass"])  # type: ignore[method-assign]

    # -- the skip ledger (see shardwise._core.skips) ----------------------------------------------
    @property
    def skip_ledger(self) -> list[list[int]]:
        """The skip ledger: ``[[epoch, first, stop], ...]`` ranges of plan positions never trained."""
        return self._skips.to_state()

    def skip_positions(self, epoch: int, first: int, stop: int) -> None:
        """Never train positions ``[first, stop)`` of ``epoch``'s global plan, at any world size, across restarts.

        The positions are absolute in the epoch's plan (the plan every rank shares). They are removed
        from the plan before it is dealt, so every rank still gets the same number of units and
        everything else trains exactly once; the ledger goes into ``state_dict()`` (O(ranges)).
        :func:`shardwise.skip_steps` turns steps (as :func:`shardwise.which` numbers them) into positions.

        Raises:
            RuntimeError: a pass is being iterated (add skips before iterating, e.g. after ``load_state_dict``).
            ValueError: the range starts before what this sampler has already trained.
        """
        first = check_int("first", first, minimum=0)
        stop = check_int("stop", stop, minimum=first)
        epoch = check_int("epoch", epoch, minimum=0)
        total = self._raw_plan_size(epoch)
        if stop > total:
            raise ValueError(
                f"stop should be at most {total}, the size of epoch {epoch}'s plan (positions [0, {total})), but got "
                f"stop={stop}; a range past the plan would skip nothing (shardwise.skip_steps turns steps into "
                "positions)"
            )
        self.skip_ranges(epoch, [[first, stop]])

    def skip_ranges(self, epoch: int, ranges: Any) -> None:
        """:meth:`skip_positions` for many ``[first, stop)`` rows at once, in O(k log k) (``(k, 2)`` ints)."""
        self._sync()
        if self._pass is not None:
            raise RuntimeError(
                f"{type(self).__name__}.skip_positions() was called while a pass is being iterated; add skips "
                "before iterating (right after load_state_dict)"
            )
        epoch = check_int("epoch", epoch, minimum=0)
        rows = check_ranges("ranges", ranges)
        total = self._raw_plan_size(epoch)
        if rows.size and int(rows[:, 1].max()) > total:
            raise ValueError(
                f"ranges should lie in epoch {epoch}'s plan (positions [0, {total})), but got a row "
                f"{rows[int(rows[:, 1].argmax())].tolist()}; a range past the plan would skip nothing"
            )
        progress = self._progress
        trained = self._plan_done(progress.epoch)
        first = int(rows[:, 0].min()) if rows.size else trained
        if epoch < progress.epoch or (epoch == progress.epoch and first < trained):
            raise ValueError(
                f"first should be at or after what was already trained (plan position {trained} of epoch "
                f"{progress.epoch}), but got epoch={epoch}, first={first}; a skip cannot undo training"
            )
        self._skips = self._skips.add_many(epoch, rows)

    # -- skipped sample ids (see IdSkips) -------------------------------------------------------
    @property
    def skipped_ids(self) -> list[list[int]]:
        """Skipped sample ids: ``[[epoch, position, first, stop], ...]``, ids ``[first, stop)`` from plan
        ``position`` of ``epoch`` and in every later epoch."""
        return self._skip_ids.to_state()

    def skip_ids(self, first: int, stop: int, *, epoch: int | None = None) -> None:
        """Never train sample ids ``[first, stop)`` again: from now on, at any world size, across restarts.

        The range goes into ``state_dict()`` (``state["skip_ids"]``, four ints). In every epoch from
        ``epoch`` (default: the epoch this sampler trains next) the plan positions that hold those ids
        are found (``when``'s inverse, O(log n) an id; O(k log k) per epoch for ``k`` ids, cached) and
        removed before dealing, like :meth:`skip_positions`: everything else trains as often as
        before and every rank keeps the same number of steps. In an epoch under way, what was
        already trained stays trained. Supported where the plan inverts cheaply and a unit is one
        sample: ``ShardedSampler``, ``MixtureSampler`` (ids in the concatenated space),
        ``LocalitySampler`` and ``ScheduledBatchSampler`` over them or over a dataset length.

        .. warning::
            With adaptive weights (``MixtureSampler(weights=AdaptiveWeights(...))``) the positions of
            an id are known only as far as the weight ledger: each update removes those it reveals,
            so an epoch that skips ids ends earlier than ``len(sampler)`` said at its start (the same
            on every rank and after any resume; warned here). NOTE [ Skipped ids the plan reveals
            late ] in ``samplers.mixture``.

        Raises:
            ProvenanceUnsupported: this sampler cannot skip ids (named, with what to use instead).
            RuntimeError: a pass is being iterated (add skips before iterating, e.g. after ``load_state_dict``).
            ValueError: an id out of range, an empty range, or an epoch already trained.
        """
        first = check_int("first", first, minimum=0)
        stop = check_int("stop", stop, minimum=first + 1)
        count = self._id_count()
        if count is not None and stop > count:
            raise ValueError(
                f"stop should be at most {count}: ids [first, stop) are sample ids in [0, {count - 1}] "
                f"({type(self).__name__} draws from {count} sample ids), but got stop={stop}"
            )
        self.skip_id_ranges([[first, stop]], epoch=epoch)

    def skip_id_ranges(self, ranges: Any, *, epoch: int | None = None) -> None:
        """:meth:`skip_ids` for many ``[first, stop)`` rows at once (``(k, 2)`` ints): one translation, O(k)."""
        self._sync()
        if self._pass is not None:
            raise RuntimeError(
                f"{type(self).__name__}.skip_ids() was called while a pass is being iterated; add skips "
                "before iterating (right after load_state_dict)"
            )
        rows = check_ranges("ranges", ranges)
        if not rows.size or (rows[:, 1] <= rows[:, 0]).any():
            raise ValueError(
                f"ranges should be non-empty [first, stop) rows with 0 <= first < stop, but got {rows.tolist()[:3]}"
            )
        progress = self._progress
        upcoming = progress.upcoming_epoch()
        epoch = upcoming if epoch is None else check_int("epoch", epoch, minimum=upcoming)
        count = self._id_count()
        if count is not None and int(rows[:, 1].max()) > count:
            raise ValueError(
                f"ranges should hold sample ids in [0, {count - 1}] ({type(self).__name__} draws from {count} sample "
                f"ids), but got a row {rows[int(rows[:, 1].argmax())].tolist()} (ids up to {int(rows[:, 1].max()) - 1})"
            )
        bounds = np.asarray([rows[:, 0].min(), rows[:, 1].max() - 1], dtype=np.int64)
        self._positions_of_ids(epoch, bounds)  # supported here, and the ids in range
        position = self._plan_done(epoch) if epoch == progress.epoch else 0
        self._skip_ids = self._skip_ids.add_many(epoch, position, rows)
        if self._ids_extent(epoch) is not None:
            _warn_revealed_late(type(self).__name__)

    def _ids_extent(self, epoch: int) -> tuple[object, int] | None:
        """How much of ``epoch``'s plan :meth:`_positions_of_ids` sees: ``None``, all of it at any time.

        A plan written at run time (an adaptive mixture) answers ``(plan, stop)``: its positions below
        ``stop`` are final and the others unseen. When ``stop`` grows for the same ``plan``, the positions
        revealed are read forward with :meth:`_ids_between` (NOTE [ Skipped ids the plan reveals late ]
        in ``samplers.mixture``).
        """
        return None

    def _ids_between(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The sample id at each plan position (not compacted) of ``epoch``, where ``_ids_extent`` is given."""
        raise NotImplementedError(f"{type(self).__name__} gives an _ids_extent, so it reads its ids forward")

    def _positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """Every plan position of ``epoch`` holding one of ``ids`` (flat int64), for :meth:`skip_ids`."""
        raise ProvenanceUnsupported(
            f"{type(self).__name__} cannot skip sample ids: skip_ids needs a plan whose unit is one sample and "
            "that inverts in O(log n) (ShardedSampler, MixtureSampler, LocalitySampler, ScheduledBatchSampler "
            "over them or a length); skip plan positions instead (shardwise.skip_steps, sampler.skip_positions)"
        )

    def _raw_plan_size(self, epoch: int) -> int:
        """``epoch``'s plan size with its skipped positions: what builds the plan (``_plan_size`` is what is dealt)."""
        size: int = type(self)._plan_size.__wrapped__(self, epoch)  # type: ignore[attr-defined]
        return size

    def _plan_done(self, epoch: int) -> int:
        """The plan position (not compacted) up to which ``epoch`` has been trained."""
        progress = self._progress
        total = self._raw_plan_size(epoch)
        if progress.completed or progress.consumed >= self._plan_size(epoch):
            return int(total)
        ledger = ledger_for(self, epoch) or self._skips
        return int(ledger.to_plan(epoch, np.asarray([progress.consumed]), total)[0])
