"""What every sampler answers about its plan without iterating it: provenance, its plan, the skip ledger.

:class:`PlanQueries` is a base of ``PlanSampler`` (``samplers.base``): the hooks behind
``shardwise.which`` / ``shardwise.when`` (which plan positions a rank's step covers, which units sit
at given positions, where a sample is); the skip ledger is its own base, ``SkipQueries``
(``samplers.skipping``). What other modules (``ScheduledBatchSampler``, ``shard()``, the
integrations) need of a sampler's plan is ``sampler.plan`` (``samplers.plan_view``), built from these
hooks, never a reach into its ``_attributes`` (``tests/contract/test_private_access.py`` guards it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.errors import check_int, check_sample_id
from .._core.plan import rank_count, rank_positions
from .._core.provenance import ProvenanceUnsupported, step_units, steps_in_pass, unit_occurrences
from .._core.world import World
from .passes import UnitSource
from .plan_view import PlanView
from .skipping import SkipQueries, ledger_for


class PlanQueries(SkipQueries):
    """Provenance hooks of a ``PlanSampler`` (the skip ledger: its base, ``SkipQueries``); see the module docstring."""

    # -- what other modules read of a sampler: sampler.plan -----------------------------------------
    @property
    def plan(self) -> PlanView:
        """What other modules read of this sampler's plan (``samplers.plan_view``); a query moves no position."""
        return PlanView(
            size=self._plan_size, source=self._open_pass, units=self._plan_units, on_epoch=self._on_epoch,
            fingerprint=self._full_fingerprint, positions_of=self._checked_positions_of,
            positions_of_ids=self._positions_of_ids, trained_positions_of=self._checked_trained_positions_of,
            step_positions=self._step_positions, position_steps=self._position_steps, step_span=self._step_span,
            uncompacted=self._uncompacted, adopt_seed=self._adopt_unless_given, core=self._core_plan,
            id_count=self._id_count, wrap_period=self._wrap_period, explicit_seed=self._seed_arg,
            deals_by_rank=self._num_replicas_arg != 1, even=self._even,
        )  # fmt: skip

    def _core_plan(self) -> object:
        """The sampler's pure plan object where it has one (``sampler.plan.core``); ``None`` by default."""
        return None

    def _sample_id(self, name: str, value: object) -> int:
        """``value`` as a sample id this sampler draws, else a ``ValueError`` naming ``name`` and the range.

        The one rule of ``when``, ``plan.positions_of`` and ``skip_ids`` for every sampler (the
        conformance harness checks it): an id outside ``[0, id_count)`` never answers ``[]`` or
        another sample's steps.
        """
        count = self._id_count()
        if count is None:
            return check_int(name, value, minimum=0)
        return check_sample_id(name, value, count, owner=type(self).__name__)

    def _checked_positions_of(self, epoch: int, index: object) -> np.ndarray:
        return self._plan_positions_of(epoch, self._sample_id("index", index))

    def _checked_trained_positions_of(self, epoch: int, index: object) -> np.ndarray:
        return self._trained_positions_of(epoch, self._sample_id("index", index))

    def _adopt_unless_given(self, seed: int) -> None:
        """A resumed state's seed, unless a seed was given: a sampler batching this plan passes its own on."""
        if self._seed_arg is None:
            self._adopt_seed(seed)

    def _uncompacted(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The plan positions of compacted ``positions`` of ``epoch`` (the skipped positions and ids left in)."""
        ledger = ledger_for(self, epoch) or self._skips
        return ledger.to_plan(epoch, positions, self._raw_plan_size(epoch))

    # -- provenance hooks (see shardwise.samplers.provenance) ----------------------------------------
    def _step_positions(self, epoch: int, start: int, world: World, step: int, per_step: int,
                        drop_last: bool = False) -> np.ndarray:  # fmt: skip
        """Plan positions rank ``world.rank`` trains at its step ``step`` of a pass over ``epoch`` from ``start``."""
        total = self._plan_size(epoch)
        count = rank_count(total, start, world.world_size, self._even)
        first, stop = step_units(step, per_step, count, drop_last=drop_last)
        return rank_positions(start, world.rank, world.world_size, first, stop, total, self._wrap_period())

    def _position_steps(self, epoch: int, start: int, world_size: int, position: int, per_step: int,
                        drop_last: bool = False) -> list[tuple[int, int]]:  # fmt: skip
        """``(rank, step)`` of every time plan ``position`` is trained in a pass over ``epoch`` from ``start``."""
        total = self._plan_size(epoch)
        count = rank_count(total, start, world_size, self._even)
        last = steps_in_pass(count, per_step, drop_last=drop_last)
        occurrences = unit_occurrences(position, start, world_size, count, total, self._wrap_period())
        found = [(rank, unit // per_step) for rank, unit in occurrences]
        return [(rank, step) for rank, step in found if step < last]

    def _plan_units(self, epoch: int, positions: np.ndarray, world_size: int) -> list[Any]:
        """The units at ``positions`` of ``epoch``'s global plan; a query: the position does not move.

        A wrapper forwards the epoch to what it wraps for the query, then restores the upcoming one.
        """
        upcoming = self._progress.upcoming_epoch()
        self._on_epoch(epoch)
        try:
            return self._open_pass(epoch, self.seed, World(0, world_size, "query"), 0)(positions)
        finally:
            self._on_epoch(upcoming)

    def _step_span(self, epoch: int, start: int, world_size: int, step: int, per_step: int,
                   drop_last: bool = False) -> tuple[int, int]:  # fmt: skip
        """The compacted plan positions ``[first, stop)`` that global step ``step`` of a pass from ``start`` covers."""
        total = self._plan_size(epoch)
        count = rank_count(total, start, world_size, self._even)
        first, stop = step_units(step, per_step, count, drop_last=drop_last)
        return start + first * world_size, min(start + stop * world_size, total)

    def _trained_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Compacted plan positions (see ``_core.skips``) of ``epoch`` that train sample ``index``."""
        ledger = ledger_for(self, epoch) or self._skips
        found = [ledger.from_plan(epoch, p) for p in self._plan_positions_of(epoch, index).tolist()]
        return np.asarray([p for p in found if p is not None], dtype=np.int64)

    _SCAN_CHUNK = 1 << 16
    """Plan positions read at a time by :meth:`_scan_positions_of` (O(chunk) memory)."""

    def _scan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every plan position of ``epoch`` whose unit holds ``index``, by reading the whole plan.

        The fallback of samplers without a better inverse: O(n) time per epoch (chunk by chunk,
        O(chunk) memory), measured in BENCHMARKS.md; a query, the position does not move.
        """
        index = check_int("index", index, minimum=0)
        total = self._raw_plan_size(epoch)
        hook = type(self)._open_pass
        raw_open = getattr(hook, "__wrapped__", hook)  # plain plan positions, not compacted by the ledger
        upcoming = self._progress.upcoming_epoch()
        self._on_epoch(epoch)
        try:
            source = raw_open(self, epoch, self.seed, World(0, 1, "query"), 0)
            found = [scan_units(source, first, min(first + self._SCAN_CHUNK, total), index)
                     for first in range(0, total, self._SCAN_CHUNK)]  # fmt: skip
        finally:
            self._on_epoch(upcoming)
        return np.concatenate([np.empty(0, dtype=np.int64), *found])

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Plan positions of ``epoch`` whose unit holds sample ``index`` (O(1) where a sampler inverts its plan)."""
        raise ProvenanceUnsupported(
            f"{type(self).__name__} cannot yet say where a sample is trained (its plan is not inverted); "
            "use shardwise.which(sampler, epoch=..., step=...) for the forward question, which every sampler answers"
        )


def scan_units(source: UnitSource, first: int, stop: int, index: int) -> np.ndarray:
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
