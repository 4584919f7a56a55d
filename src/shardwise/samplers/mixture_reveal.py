"""What a ``MixtureSampler`` with adaptive weights knows of its plan: the positions the ledger reveals.

``MixtureSampler``'s hooks (``_known_positions``, ``_ids_extent``, ``_positions_of_ids``,
``_plan_positions_of``, and the live pass's length after each update) call these functions over
its :class:`~shardwise._core.mixture.MixturePlan`; with fixed weights or a schedule
(``plan.known_until is None``) every position is known and each of them answers as if there were
no ledger. Cost: O(1) each, besides what the plan's own lookups cost (``known_prefix`` O(len);
a sample's positions O(log n) a draw, one draw per cycle of its source).

NOTE [ Skipped ids the plan reveals late ]
With adaptive weights, which plan positions draw a sample id is known only up to
``ledger.known_until``; every update reveals more. ``skip_ids`` removes the positions of its ids
(``samplers.skipping``), so the epoch's compacted size (what is dealt) shrinks as the updates
reveal them: it is a function of the ledger, the same on every rank and after a resume at any
world size, and ``len(sampler)`` is an upper bound until the epoch's weights are all known. The
positions a reveal adds all lie past the known ones, so everything computed before (the units
handed out, ``consumed``, ``which`` of known steps) keeps its meaning. The live pass follows
(:func:`follow_ledger`, at the pass's start and after each update): its length is recomputed,
and until the size is final it neither wraps padding (the padding of a size still shrinking
would read other units) nor, with ``drop_last``, hands out a unit of a global step not wholly
known (that step may turn out to be the partial last one, which is dropped: :func:`known_prefix`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._core.mixture import MixturePlan, PendingWeightsError
from .._core.plan import Even, rank_count
from .._core.provenance import mixture_positions_of
from .passes import LivePass

Uncompacted = Callable[[int, np.ndarray], np.ndarray]
"""The sampler's map from dealt (compacted) positions of an epoch to plan positions (``skip_ids`` removed)."""


def size_pending(plan: MixturePlan, epoch: int, skipping: bool) -> bool:
    """Whether updates can still shrink ``epoch``'s size: it skips ids (``skipping``), its weights not all known."""
    if plan.known_until is None or not skipping:
        return False
    return plan.known_until < plan.epoch_start(epoch) + plan.plan_size(epoch)


def follow_ledger(live: LivePass, size: int, even: Even, pending: bool) -> None:
    """Give the live pass the length ``size`` the ledger now gives its epoch (``pending``: :func:`size_pending`).

    Until the size is final, padding positions stay past the plan (unknown: the pass waits there).
    """
    live.count = rank_count(size, live.start, live.world_size, even)
    live.total = max(size, live.start + live.count * live.world_size) if pending else size


def known_prefix(
    plan: MixturePlan, epoch: int, positions: np.ndarray, uncompacted: Uncompacted, to_step_end: int, pending: bool
) -> np.ndarray:
    """The leading dealt ``positions`` whose weights the ledger holds (``PendingWeightsError`` if not the first).

    ``to_step_end``: how far this rank's unit lies before the last of its global step; with
    ``pending`` (``drop_last`` and a size still shrinking) a unit is known only once its whole step
    is, since that step may turn out to be the partial last one, which is dropped.
    """
    count = len(plan.known_prefix(epoch, uncompacted(epoch, positions)))
    if to_step_end and pending:
        ends = positions[:count] + to_step_end
        count = len(plan.known_prefix(epoch, uncompacted(epoch, ends))) if count else 0
    return positions[:count]


def check_epoch_known(plan: MixturePlan, epoch: int, size: int, index: int) -> None:
    """Raise ``PendingWeightsError`` unless the ledger holds the weights of all ``size`` positions of ``epoch``.

    Where sample ``index`` trains in an epoch depends on every position's weights: provenance answers
    for a whole epoch or not at all.
    """
    if plan.known_until is None:
        return
    start = plan.epoch_start(epoch)
    if start + size > plan.known_until:
        raise PendingWeightsError(
            f"where sample {index} trains in epoch {epoch} depends on the weights of its every plan position "
            f"(run positions [{start}, {start + size})), but the ledger holds them up to run position "
            f"{plan.known_until}: ask once the epoch's updates are reported, or ask which(...) for the steps "
            "the ledger covers"
        )


def ids_extent(plan: MixturePlan, epoch: int) -> tuple[object, int] | None:
    """With adaptive weights: the plan and how far into ``epoch`` its weights are known (``skip_ids``), else None."""
    if plan.known_until is None:
        return None
    return plan, min(max(plan.known_until - plan.epoch_start(epoch), 0), plan.plan_size(epoch))


def positions_of_ids(plan: MixturePlan, seed: int, epoch: int, ids: np.ndarray, total: int) -> np.ndarray:
    """Every known position of ``epoch`` drawing one of ``ids`` (``skip_ids``; ``total``: the ids there are).

    O(log n) a draw, one draw per cycle of its source; positions past the ledger's ``known_until``
    are left out (they are revealed by later updates: NOTE [ Skipped ids the plan reveals late ]).
    """
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= total):
        raise ValueError(f"sample ids should be in [0, {total - 1}], but got ids up to {int(ids.max())}")
    found = [mixture_positions_of(plan, seed, epoch, i) for i in ids.tolist()]
    if plan.known_until is not None:
        end = plan.known_until - plan.epoch_start(epoch)
        found = [positions[positions < end] for positions in found]
    return np.concatenate([np.empty(0, dtype=np.int64), *found])
