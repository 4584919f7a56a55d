"""One epoch of a stratum: its items laid out as batches in plan order (:func:`order_stratum`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..offsets import offsets_from_counts
from ..ordering import balanced_batch_order
from ..permutation import inverse_permutation
from ..seeds import derive_seed, derive_words
from .layout import StratumLayout
from .strata import sorted_by


@dataclass(frozen=True, eq=False)
class StratumPlan:
    """One packed stratum: batch ``b`` is rows ``batch_offsets[b]:batch_offsets[b + 1]``, row ``r`` items
    ``items[row_offsets[r]:row_offsets[r + 1]]``.

    Attributes:
        items: ``(k,)`` int64 item ids in plan order (batch by batch, row by row).
        row_offsets: ``(rows + 1,)`` int64 boundaries of rows in ``items``.
        batch_offsets: ``(batches + 1,)`` int64 boundaries of batches in rows.
        lengths: ``(k,)`` int64 length of each item (its class), beside ``items``.
    """

    items: np.ndarray
    row_offsets: np.ndarray
    batch_offsets: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return int(self.batch_offsets.size - 1)


def order_stratum(
    items: np.ndarray, lengths: np.ndarray, layout: StratumLayout, *, group: int, key: int | None
) -> StratumPlan:
    """Lay one epoch's items (one per slot, with their ``lengths``) out as the stratum's batches, in plan order.

    Batches are ordered by :func:`~shardwise._core.ordering.balanced_batch_order` over their
    ``batch_keys``: sorted by cost and shuffled in groups of ``group``, so that the W batches of a
    global step (W dividing ``group``) cost about the same, each group in the keyed tree order
    (plan 3: every aligned power-of-two block a run of cost-neighbours, no group monotone in cost).
    ``key`` also shuffles rows within a batch and items within a row; ``None`` keeps cost order and
    layout order.
    """
    slot_rows, batch_of_row = layout.slot_rows, layout.batch_of_row
    num_rows, num_batches = batch_of_row.size, layout.num_batches
    order = balanced_batch_order(
        layout.batch_keys, group, None if key is None else derive_seed(key, "batches"), within=True
    )
    batch_rank = inverse_permutation(order)
    if key is None:
        row_noise = np.zeros(num_rows, dtype=np.uint64)
        slot_noise = np.zeros(slot_rows.size, dtype=np.uint64)
    else:
        words = derive_words(key, "pack", count=2)
        row_noise = np.random.PCG64(int(words[0])).random_raw(num_rows)
        slot_noise = np.random.PCG64(int(words[1])).random_raw(slot_rows.size)
    # rows sorted by (batch position, noise), slots by (row position, noise); dropped rows last, cut.
    kept = np.flatnonzero(batch_of_row >= 0)
    row_position = np.full(num_rows, -1, dtype=np.int64)
    row_order = kept[sorted_by(batch_rank[batch_of_row[kept]], row_noise[kept])]
    row_position[row_order] = np.arange(row_order.size, dtype=np.int64)
    slot_kept = np.flatnonzero(row_position[slot_rows] >= 0)
    slot_order = slot_kept[sorted_by(row_position[slot_rows[slot_kept]], slot_noise[slot_kept])]
    rows_per = np.bincount(batch_rank[batch_of_row[kept]], minlength=num_batches)
    items_per = np.bincount(row_position[slot_rows[slot_kept]], minlength=row_order.size)
    row_offsets, batch_offsets = offsets_from_counts(items_per), offsets_from_counts(rows_per)
    return StratumPlan(items[slot_order], row_offsets, batch_offsets, lengths[slot_order])
