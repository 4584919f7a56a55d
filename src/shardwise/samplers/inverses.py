"""Where a sample is trained, for the index-based samplers: the reverse of their plans (``shardwise.when``).

Each function answers a sampler's ``_plan_positions_of(epoch, index)``: the positions of ``epoch``'s
global plan whose unit holds sample ``index``, ascending, one per occurrence.

- ``BucketBatchSampler`` (shared index): O(log n). The sample's rank among the samples of its
  length (a bisection: the index lists each length's samples in increasing order), the epoch's
  keyed tie shuffle undone, its place in the length-sorted stream, then its batch's place in the
  cost order and the group shuffle undone (``SortedBucketPlan.positions_of``). With a
  ``sort_window`` the plan is materialised per epoch (8 bytes a sample) and searched: O(n).
- ``PackedBatchSampler``: no inverse is kept (packs depend on every length and the shuffle): each
  stratum's plan is built as iteration builds it and its items compared with the id, in numpy.
  O(n) per epoch, one stratum in memory.
- ``WeightedSampler``: no inverse exists. Without replacement, a search of the epoch's shared plan;
  with replacement, the epoch's draws recomputed (draws are independent: any position may hold any
  index). O(n) per epoch, chunk by chunk.

The costs at 1e7 samples are in docs/benchmarks/provenance.md ("Provenance, part 2").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._core.batching import BatchPlan
from .._core.errors import check_int
from .._core.groups import group_keys, unpermute_within
from ..index import read_checked

_CHUNK = 1 << 20
"""Positions compared at a time by the O(n) searches (8 MiB of int64)."""


def bucket_positions_of(
    plan: Any, grouped: Any, length_of: Callable[[int], int], index: int, tie_seed: int | None
) -> np.ndarray:
    """``BucketBatchSampler``: see the module docstring.

    ``plan`` is the epoch's plan, ``grouped`` the shared index grouped by length, ``length_of`` a
    sample's length, ``tie_seed`` the seed of the epoch's tie shuffle (``None``: no shuffle).
    """
    index = check_int("index", index, minimum=0, maximum=len(grouped) - 1)
    if isinstance(plan, BatchPlan):  # a sort_window plan, materialised
        at = np.flatnonzero(plan.order == index)
        batches: np.ndarray = np.searchsorted(plan.offsets, at, side="right").astype(np.int64) - 1
        return batches
    length = length_of(index)
    run = np.flatnonzero(plan.run_lengths == length)
    if not run.size:  # a length left out (oversized="skip")
        return np.empty(0, dtype=np.int64)
    first, stop = int(grouped.offsets[length]), int(grouped.offsets[length + 1])
    rank = int(np.searchsorted(grouped.order[first:stop], index))
    if tie_seed is not None:
        keys = group_keys(tie_seed, np.asarray([length]))
        rank = int(unpermute_within(np.asarray([rank]), np.asarray([stop - first]), keys)[0])
    position: np.ndarray = plan.positions_of(np.asarray([int(plan.run_starts[run[0]]) + rank]))
    return position[position >= 0]


def packed_positions_of(
    strata: np.ndarray, starts: np.ndarray, sample: np.ndarray, stratum_plan: Callable[[int, int], Any], index: int
) -> np.ndarray:
    """``PackedBatchSampler``: see the module docstring (a sample split across rows: once a piece).

    ``strata``/``starts`` are the epoch's strata and their first positions, ``sample`` the packed
    index's sample of each piece, ``stratum_plan(slot, stratum)`` a stratum's plan.
    """
    index = check_int("index", index, minimum=0)
    found = [np.empty(0, dtype=np.int64)]
    for slot in range(strata.size):
        plan = stratum_plan(slot, int(strata[slot]))
        hits = np.flatnonzero(np.asarray(read_checked(sample, sample[plan.items])) == index)
        if hits.size:
            rows = np.searchsorted(plan.row_offsets, hits, side="right") - 1
            found.append(int(starts[slot]) + np.searchsorted(plan.batch_offsets, rows, side="right") - 1)
    return np.concatenate(found).astype(np.int64)


def weighted_positions_of(
    table: Any, draw_keys: np.ndarray | None, total: int, distinct: Callable[[], np.ndarray], index: int
) -> np.ndarray:
    """``WeightedSampler``: see the module docstring (0, 1 or, with replacement, several positions).

    ``table`` is the weight table, ``draw_keys`` the epoch's draw keys with replacement (``None``:
    without), ``total`` the draws an epoch, ``distinct()`` the epoch's plan without replacement.
    """
    index = check_int("index", index, minimum=0, maximum=len(table) - 1)
    if draw_keys is not None:
        hits = [first + np.flatnonzero(table.draw(np.arange(first, min(first + _CHUNK, total)), draw_keys) == index)
                for first in range(0, total, _CHUNK)]  # fmt: skip
    else:
        plan = distinct()
        hits = [first + np.flatnonzero(plan[first : first + _CHUNK] == index) for first in range(0, plan.size, _CHUNK)]
    return np.concatenate([np.empty(0, dtype=np.int64), *hits]).astype(np.int64)
