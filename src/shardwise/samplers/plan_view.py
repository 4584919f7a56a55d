"""``sampler.plan``: what other modules read of a sampler's plan, in one object.

``shardwise.which`` / ``when`` / ``skip_steps``, ``ScheduledBatchSampler`` (which cuts another
sampler's plan into steps of its own), ``shard()`` and the integrations read a sampler through this
object: the plan's size in an epoch, the units at given positions, its fingerprint, where a sample
is, which positions a rank's step covers. None of it moves the sampler's position. The sampler's
own surface stays what a training loop uses (torch's names, the state, the skips, ``describe``).

A :class:`PlanView` is built on each ``sampler.plan`` access from the sampler's hooks, bound to that
sampler (a ``copy.copy`` or an unpickled sampler answers for itself); it holds no state of its own.
It checks what a caller passes (a sample id against the ids the sampler draws from, with the
sampler's name) before the hooks see it: the one rule of ``when``, ``plan.positions_of`` and
``skip_ids`` for every sampler (the conformance harness checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._core.errors import check_int, check_sample_id
from .._core.plan import Even
from .._core.state import Fingerprint
from .._core.world import World
from .passes import UnitSource


class PlanView:
    """A sampler's plan as other modules read it: ``sampler.plan``; see the module docstring.

    Attributes:
        explicit_seed: the seed given (at construction, or set since); ``None`` when resolved at first use.
        deals_by_rank: whether the sampler deals its plan to ranks itself (not pinned to ``num_replicas=1``).
        even: how ranks are given equal lengths (``Even.PAD`` or ``Even.DROP``).
    """

    __slots__ = ("_adopt", "_after", "_core", "_count", "_fingerprint", "_id_count", "_ids", "_on_epoch", "_open",
                 "_owner", "_positions_of", "_size", "_span", "_steps", "_trained", "_uncompacted", "_units", "_where",
                 "_wrap", "deals_by_rank", "even", "explicit_seed")  # fmt: skip

    def __init__(
        self,
        *,
        owner: str,
        size: Callable[[int], int],
        source: Callable[[int, int, World, int], UnitSource],
        units: Callable[[int, np.ndarray, int], list[Any]],
        on_epoch: Callable[[int], None],
        fingerprint: Callable[[], Fingerprint],
        positions_of: Callable[[int, int], np.ndarray],
        positions_of_ids: Callable[[int, np.ndarray], np.ndarray],
        trained_positions_of: Callable[[int, int], np.ndarray],
        step_positions: Callable[..., np.ndarray],
        position_steps: Callable[..., list[tuple[int, int]]],
        step_span: Callable[..., tuple[int, int]],
        pass_units: Callable[[int, int, int], int],
        consumed_after: Callable[[int, int, int, int], int],
        uncompacted: Callable[[int, np.ndarray], np.ndarray],
        adopt_seed: Callable[[int], None],
        core: Callable[[], Any],
        id_count: Callable[[], int | None],
        wrap_period: Callable[[], int | None],
        explicit_seed: int | None,
        deals_by_rank: bool,
        even: Even,
    ) -> None:
        self._owner, self._size, self._open, self._units, self._on_epoch = owner, size, source, units, on_epoch
        self._fingerprint, self._positions_of, self._ids = fingerprint, positions_of, positions_of_ids
        self._trained, self._uncompacted, self._adopt = trained_positions_of, uncompacted, adopt_seed
        self._steps, self._where, self._span = step_positions, position_steps, step_span
        self._count, self._after = pass_units, consumed_after
        self._core, self._id_count, self._wrap = core, id_count, wrap_period
        self.explicit_seed, self.deals_by_rank, self.even = explicit_seed, deals_by_rank, even

    @property
    def core(self) -> Any:
        """The sampler's pure plan object where it has one (``MixturePlan``, ``TokenMixturePlan``), else ``None``."""
        return self._core()

    @property
    def id_count(self) -> int | None:
        """How many sample ids the sampler draws from; ``None`` where unknown (ids are then not range-checked)."""
        return self._id_count()

    @property
    def wrap_period(self) -> int | None:
        """The period padded positions wrap within (``None``: the plan's start; see ``_core.plan.wrap``)."""
        return self._wrap()

    # -- the plan ---------------------------------------------------------------------------------
    def size(self, epoch: int) -> int:
        """Units in ``epoch``'s global plan, all ranks together (skipped positions left out)."""
        return self._size(check_int("epoch", epoch, minimum=0))

    def source(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        """The function from plan positions of ``epoch`` (a pass from ``start``) to the units there."""
        return self._open(epoch, seed, world, start)

    def units(self, epoch: int, positions: np.ndarray, world_size: int) -> list[Any]:
        """The units at ``positions`` of ``epoch``'s global plan."""
        return self._units(epoch, positions, world_size)

    def fingerprint(self) -> Fingerprint:
        """Plain values identifying the plan: ``state_dict()["fingerprint"]``."""
        return self._fingerprint()

    def notify_epoch(self, epoch: int) -> None:
        """Tell the sampler (and what it wraps) that ``epoch`` is in use, without moving its position."""
        self._on_epoch(epoch)

    def adopt_seed(self, seed: int) -> None:
        """Take the seed of a validated resume state, unless a seed was given (:attr:`explicit_seed`)."""
        if self.explicit_seed is None:
            self._adopt(seed)

    # -- a pass: what each rank gets, where the plan is after it ------------------------------------
    def pass_units(self, epoch: int, start: int, world_size: int) -> int:
        """Units each rank yields in a pass over ``epoch`` from plan position ``start`` (equal on every rank):
        a batch sampler's batches, an index sampler's indices (``len(sampler)`` at ``start=0``)."""
        return self._count(check_int("epoch", epoch, minimum=0), start, world_size)

    def consumed_after(self, epoch: int, start: int, world_size: int, units: int) -> int:
        """The global position once every rank has gone ``units`` into a pass over ``epoch`` from ``start``
        (``state_dict()["consumed"]`` there): the pass's end (padding included) once ``units`` reaches
        :meth:`pass_units`."""
        return self._after(check_int("epoch", epoch, minimum=0), start, world_size, units)

    # -- where samples are (the inverse) ----------------------------------------------------------
    def positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Plan positions of ``epoch`` whose unit holds sample ``index`` (raises ``ProvenanceUnsupported``
        where the plan is not inverted, ``ValueError`` for an id outside ``[0, id_count)``)."""
        return self._positions_of(epoch, self._sample_id("index", index))

    def positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """Every plan position of ``epoch`` holding one of ``ids`` (flat int64); raises where unsupported."""
        return self._ids(epoch, ids)

    def trained_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Compacted plan positions (see ``_core.skips``) of ``epoch`` that train sample ``index``."""
        return self._trained(epoch, self._sample_id("index", index))

    def _sample_id(self, name: str, value: object) -> int:
        """``value`` as a sample id the sampler draws, else a ``ValueError`` naming ``name`` and the range.

        An id outside ``[0, id_count)`` never answers ``[]`` or another sample's steps.
        """
        count = self._id_count()
        if count is None:
            return check_int(name, value, minimum=0)
        return check_sample_id(name, value, count, owner=self._owner)

    def uncompacted(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The plan positions of compacted ``positions`` of ``epoch`` (the skipped positions and ids left in)."""
        return self._uncompacted(epoch, positions)

    # -- steps (shardwise.which, when, skip_steps) --------------------------------------------------
    def step_positions(self, epoch: int, start: int, world: World, step: int, per_step: int,
                       drop_last: bool = False) -> np.ndarray:  # fmt: skip
        """Plan positions rank ``world.rank`` trains at its step ``step`` of a pass over ``epoch`` from ``start``."""
        return self._steps(epoch, start, world, step, per_step, drop_last)

    def position_steps(self, epoch: int, start: int, world_size: int, position: int, per_step: int,
                       drop_last: bool = False) -> list[tuple[int, int]]:  # fmt: skip
        """``(rank, step)`` of every time plan ``position`` is trained in a pass over ``epoch`` from ``start``."""
        return self._where(epoch, start, world_size, position, per_step, drop_last)

    def step_span(self, epoch: int, start: int, world_size: int, step: int, per_step: int,
                  drop_last: bool = False) -> tuple[int, int]:  # fmt: skip
        """The compacted plan positions ``[first, stop)`` that global step ``step`` of a pass from ``start`` covers."""
        return self._span(epoch, start, world_size, step, per_step, drop_last)

    def __repr__(self) -> str:
        return f"PlanView(id_count={self.id_count}, wrap_period={self.wrap_period}, core={type(self.core).__name__})"
