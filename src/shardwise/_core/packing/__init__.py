"""Sequence-packing arithmetic: pieces grouped by length, stratified windows, best-fit rows, balanced batches.

The plan of one epoch (``PackedBatchSampler``'s), in the terms used here:

- an **item** is what a row holds: a whole sample, or (``too_long="split"``) one piece of a
  sample longer than ``max_len`` (piece ``k`` holds its tokens ``[k * max_len, (k + 1) * max_len)``,
  the last piece the rest). :func:`piece_index` groups the items by length once (a counting sort,
  the O(n) work; it does not depend on the epoch);
- the items are dealt into ``S`` **strata** of about ``window`` items each: stratum ``s`` takes a
  fixed share of every length class (:func:`stratum_histogram`, a function of the class sizes
  alone), so every stratum has about the same length distribution as the whole data set. *Which*
  items of a class a stratum takes changes every epoch (a keyed permutation per class,
  ``shardwise.index.permute_within``, O(1) memory), and so does the order in which strata are visited
  (:mod:`.strata`);
- each stratum is packed on its own: best-fit decreasing into rows of ``max_len`` tokens,
  computed on the length histogram (:func:`pack_histogram`: a few numpy operations per length
  class, not per item), then the rows are dealt into batches so that every batch of the stratum
  costs about the same, in tokens or in attention cost (the sum of squared lengths)
  (:func:`deal_rows`; the chain of strata in :mod:`.layout`, the rows in :mod:`.rows`);

Because a stratum's histogram, hence its rows' *length pattern* and its number of batches, is a
function of the class sizes only, the number of batches of every epoch is known before the first
batch (:func:`stratum_batch_counts`, computed once), the same on every rank and in every epoch;
a position of the plan maps to (stratum slot, batch within the stratum) in O(S), and only one
stratum (O(window) memory) is ever materialised at a time (:mod:`.order` lays one out for an
epoch). :class:`PackedIndex` (:mod:`.packed_index`) is what the sampler yields.

The package re-exports every name its modules define for ``PackedBatchSampler``.
"""

from __future__ import annotations

from .layout import CARRIED, PLAN_VERSION, Balance, StratumLayout, carried_slots, layout_stratum, stratum_layouts
from .order import StratumPlan, order_stratum
from .packed_index import PackedIndex
from .pieces import PieceIndex, TooLong, fill_pieces, group_by_key, long_samples, piece_counts, piece_index
from .rows import deal_rows, pack_histogram, row_loads
from .strata import (
    class_phases,
    class_shuffle_key,
    shuffle_within_classes,
    sorted_by,
    strata_starts,
    stratum_bounds,
    stratum_histogram,
    stratum_order_key,
    stratum_slots,
)

__all__ = [
    "CARRIED",
    "PLAN_VERSION",
    "Balance",
    "PackedIndex",
    "PieceIndex",
    "StratumLayout",
    "StratumPlan",
    "TooLong",
    "carried_slots",
    "class_phases",
    "class_shuffle_key",
    "deal_rows",
    "fill_pieces",
    "group_by_key",
    "layout_stratum",
    "long_samples",
    "order_stratum",
    "pack_histogram",
    "piece_counts",
    "piece_index",
    "row_loads",
    "shuffle_within_classes",
    "sorted_by",
    "strata_starts",
    "stratum_bounds",
    "stratum_histogram",
    "stratum_layouts",
    "stratum_order_key",
    "stratum_slots",
]
