"""The skip ledger of every sampler, as functions: plan positions and sample ids never trained.

``PlanSampler`` (``samplers.base``) holds the ledgers (``_core.skips``, carried in ``state_dict``)
and its ``skip_positions`` / ``skip_ids`` (and their many-rows forms) check their arguments with
the functions here. The ledger is honoured around the two plan hooks ``_plan_size`` /
``_open_pass`` of every subclass, once (:func:`compacted_size`, :func:`compacted_source`, applied
by ``PlanSampler.__init_subclass__``; :func:`ledger_for` is the ledger of an epoch, skipped ids
translated to positions): a subclass's own hooks see plain plan positions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .._core.errors import check_ranges
from .._core.skips import IdSkips, SkipLedger
from .._core.world import World
from .callers import warn_outside
from .passes import LivePass, UnitSource


def compacted_size(raw: Callable[[Any, int], int]) -> Callable[[Any, int], int]:
    """A ``_plan_size`` hook honouring the skip ledger: the plan's size without its skipped positions."""

    @functools.wraps(raw)
    def size(self: Any, epoch: int) -> int:
        total = raw(self, epoch)
        skips = ledger_for(self, epoch)
        # Only the most derived class's hook applies the ledger: a subclass calling super() gets the raw size.
        return skips.size(epoch, total) if skips and type(self)._plan_size is size else total

    return size


def compacted_source(raw: Callable[..., UnitSource]) -> Callable[..., UnitSource]:
    """An ``_open_pass`` hook honouring the skip ledger: compacted positions are mapped to plan positions."""

    @functools.wraps(raw)
    def open_pass(self: Any, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        source = raw(self, epoch, seed, world, start)
        if type(self)._open_pass is not open_pass:  # as in compacted_size: once, outermost
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
    and added (NOTE [ Skipped ids the plan reveals late ] in ``samplers.mixture_reveal``).
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


def warn_revealed_late(kind: str) -> None:
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


def refuse_during_pass(owner: str, method: str, live: LivePass | None) -> None:
    """Raise if a pass is being iterated: skips are added before iterating (right after ``load_state_dict``)."""
    if live is not None:
        raise RuntimeError(
            f"{owner}.{method}() was called while a pass is being iterated; add skips before iterating (right after "
            "load_state_dict)"
        )


def check_stop(epoch: int, stop: int, total: int) -> None:
    """Raise if ``stop`` lies past ``epoch``'s plan of ``total`` positions (``skip_positions``)."""
    if stop > total:
        raise ValueError(
            f"stop should be at most {total}, the size of epoch {epoch}'s plan (positions [0, {total})), but got "
            f"stop={stop}; a range past the plan would skip nothing (shardwise.skip_steps turns steps into "
            "positions)"
        )


def checked_rows(epoch: int, ranges: Any, total: int) -> np.ndarray:
    """``ranges`` as ``(k, 2)`` rows of plan positions of ``epoch``, every row inside its plan of ``total``."""
    rows: np.ndarray = check_ranges("ranges", ranges)
    if rows.size and int(rows[:, 1].max()) > total:
        raise ValueError(
            f"ranges should lie in epoch {epoch}'s plan (positions [0, {total})), but got a row "
            f"{rows[int(rows[:, 1].argmax())].tolist()}; a range past the plan would skip nothing"
        )
    return rows


def refuse_trained(epoch: int, rows: np.ndarray, trained_epoch: int, trained: int) -> None:
    """Raise if ``rows`` of ``epoch`` start before plan position ``trained`` of ``trained_epoch``, already trained."""
    first = int(rows[:, 0].min()) if rows.size else trained
    if epoch < trained_epoch or (epoch == trained_epoch and first < trained):
        raise ValueError(
            f"first should be at or after what was already trained (plan position {trained} of epoch "
            f"{trained_epoch}), but got epoch={epoch}, first={first}; a skip cannot undo training"
        )


def check_id_stop(owner: str, stop: int, count: int | None) -> None:
    """Raise if ids ``[first, stop)`` reach past the ``count`` sample ids ``owner`` draws from (``skip_ids``)."""
    if count is not None and stop > count:
        raise ValueError(
            f"stop should be at most {count}: ids [first, stop) are sample ids in [0, {count - 1}] "
            f"({owner} draws from {count} sample ids), but got stop={stop}"
        )


def checked_id_rows(ranges: Any) -> np.ndarray:
    """``ranges`` as non-empty ``[first, stop)`` rows of sample ids (``(k, 2)`` ints)."""
    rows: np.ndarray = check_ranges("ranges", ranges)
    if not rows.size or (rows[:, 1] <= rows[:, 0]).any():
        raise ValueError(
            f"ranges should be non-empty [first, stop) rows with 0 <= first < stop, but got {rows.tolist()[:3]}"
        )
    return rows


def check_ids_drawn(owner: str, rows: np.ndarray, count: int | None) -> None:
    """Raise if ``rows`` hold ids past the ``count`` sample ids ``owner`` draws from."""
    if count is not None and int(rows[:, 1].max()) > count:
        raise ValueError(
            f"ranges should hold sample ids in [0, {count - 1}] ({owner} draws from {count} sample "
            f"ids), but got a row {rows[int(rows[:, 1].argmax())].tolist()} (ids up to {int(rows[:, 1].max()) - 1})"
        )
