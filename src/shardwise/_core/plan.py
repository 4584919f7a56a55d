"""Plan arithmetic: how a global plan of units is dealt out to ranks by position.

Rank ``r`` of ``W`` takes the units at plan positions ``start + r, start + r + W, ...`` where
``start`` is how many units the job has already handed out this epoch (0 at an epoch's start,
anything after a resume). Every rank takes the same number of units:

- ``Even.PAD`` completes the last step with positions past the plan wrapped back into it (:func:`wrap`),
  repeating at most ``W - 1`` units, as ``DistributedSampler`` does;
- ``Even.DROP`` cuts the last partial step, leaving out at most ``W - 1`` units.

NOTE [ Padding wrap ]
A padded position ``p = total + d`` reads a position of its slot of the plan's wrap period ``B``
(congruent to ``p`` modulo ``B``), the latest first: the first ``B`` padded positions read the
plan's last ``B`` positions in turn, each further ``B`` the period before (``q = L - B * ((d // B)
% c)``, ``L = total - B + d % B`` the slot's latest position below ``total``, ``c`` the slot's
positions below ``total``, cycled once used up), so padded positions read distinct units where
the plan holds enough of their slot. When the slot has no position below ``total`` (``L < 0``, a
plan shorter than one period) it reads ``p % total``. With ``B = total`` this is exactly
``p % total``, torch's wrap to the plan's start: the period of every plan whose positions have no
period (``period=None``). ``LocalitySampler``'s plan has period ``P * G``
(1 without partitions: the padding reads the plan's last ``W - 1`` positions at most, backwards):
its padding reads the plan's last positions, whose shards a node holds as the epoch ends (the
first ones may be evicted by then, and a whole shard fetched again for one padded sample), and
with partitions (NOTE [ Shard partitions ]) a rank's own partition. Everything that deals, or
inverts the dealing of, padded positions goes through :func:`wrap` (:func:`padded_positions`
filters by it).
"""

from __future__ import annotations

import enum

import numpy as np

from .public import public


class Even(str, enum.Enum):
    """How every rank is given the same number of units when the plan does not divide evenly."""

    PAD = "pad"
    DROP = "drop"


def rank_count(total: int, start: int, world_size: int, even: Even) -> int:
    """Units each rank yields from plan position ``start`` to the end of a plan of ``total`` units."""
    remaining = max(total - start, 0)
    if even is Even.PAD:
        return -(-remaining // world_size)
    return remaining // world_size


def pass_end(total: int, start: int, world_size: int, even: Even) -> int:
    """The ``consumed`` value once a pass from ``start`` completes: ``total`` or past it (padding)."""
    return max(start + rank_count(total, start, world_size, even) * world_size, total)


def consumed_after(total: int, start: int, world_size: int, even: Even, done: int) -> int:
    """The ``consumed`` value once every rank has gone ``done`` units into a pass from ``start``: the pass's
    end (:func:`pass_end`) once ``done`` reaches what each rank takes, else ``start + done * world_size``."""
    if done >= rank_count(total, start, world_size, even):
        return pass_end(total, start, world_size, even)
    return start + done * world_size


def wrap(positions: np.ndarray, total: int, period: int | None = None) -> np.ndarray:
    """``positions`` with those at or past ``total`` wrapped into ``[0, total)`` (NOTE [ Padding wrap ]).

    ``period=None`` (or ``total``) is ``p % total``. O(len(positions)); the input is not modified.

    Returns:
        positions: int64, the same shape.
    """
    positions = np.asarray(positions, dtype=np.int64)
    if not total or not positions.size or int(positions.max()) < total:
        return positions
    period = total if period is None else period
    padded = positions >= total
    past = positions[padded]
    beyond = past - total
    latest = total - period + beyond % period  # the latest position below total congruent to p mod B
    slot = np.where(latest >= 0, latest // period + 1, 1)  # positions of p's slot below total
    back = latest - period * ((beyond // period) % slot)  # one period further back for each B padded before
    out: np.ndarray = positions.copy()
    out[padded] = np.where(latest >= 0, back, past % total)
    return out


def padded_positions(position: int, total: int, period: int | None, low: int, high: int) -> np.ndarray:
    """Dealt positions in ``[low, high)`` that read plan ``position`` (itself, and padding wrapped to it).

    The inverse of :func:`wrap`: the candidates congruent to ``position`` modulo the period or modulo
    ``total`` (a padded tail is shorter than ``W``: O(W / period + W / total)), kept where
    :func:`wrap` sends them to ``position``.

    Returns:
        dealt: ascending int64.
    """
    first, stop = max(low, total), high
    found = [np.asarray([position], dtype=np.int64)] if low <= position < min(high, total) else []
    for step in {total if period is None else period, total}:
        if step > 0 and first < stop:
            k = np.arange(-(-(first - position) // step), -(-(stop - position) // step), dtype=np.int64)
            found.append(position + step * k[k > 0])
    dealt = np.unique(np.concatenate([np.empty(0, dtype=np.int64), *found]))
    keep = (dealt < total) | (wrap(dealt, total, period) == position)
    result: np.ndarray = dealt[keep]
    return result


def rank_positions(start: int, rank: int, world_size: int, first: int, stop: int, total: int,
                   period: int | None = None) -> np.ndarray:  # fmt: skip
    """Plan positions of this rank's local steps ``first..stop-1``, wrapped into ``[0, total)`` (:func:`wrap`).

    Returns:
        positions: ``(stop - first,)`` int64.
    """
    positions = start + rank + world_size * np.arange(first, stop, dtype=np.int64)
    return wrap(positions, total, period)


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(Even)
