"""The length-bucketing recipe: ``BucketBatchSampler``'s epoch plan as a pure function.

:func:`bucket_plan` chains the steps of one epoch over an already shuffled stream: sort by
length in windows (:func:`~shardwise._core.ordering.sort_in_windows`), cut batches by size or
token budget (:mod:`~shardwise._core.cutting`), and balance them across ranks
(:func:`~shardwise._core.ordering.balanced_batch_order`). The same recipe over a stream sorted
whole, in O(distinct lengths) memory, is :class:`~shardwise._core.sorted_bucketing.SortedBucketPlan`.
"""

from __future__ import annotations

import numpy as np

from .batching import BatchPlan
from .cutting import fixed_offsets, token_offsets
from .ordering import NEIGHBOURS, balanced_batch_order, neighbour_shuffle, sort_in_windows, window_starts
from .seeds import derive_seed

SHORTEN_ONE_IN = 8
"""With a key, about one token batch in this many takes one sample (one multiple) less than fits."""


def bucket_plan(
    order: np.ndarray,
    lengths: np.ndarray,
    *,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    multiple: int = 1,
    window: int | None = None,
    group: int = 64,
    key: int | None = None,
    drop_short: bool = False,
    oversized_alone: bool = False,
    mixed: bool = False,
    longest_first: bool = False,
) -> BatchPlan:
    """Length-bucketed batches of one (already shuffled) stream: sort in windows, cut, balance.

    This is ``BucketBatchSampler``'s plan for one epoch, as a pure function, so that a caller
    can build a plan piece by piece (e.g. one piece per stretch of constant batch size of a
    schedule, joined with :meth:`BatchPlan.concat`): batches never leave their piece, and the
    balancing reorder stays inside it.

    Args:
        order: ``(m,)`` int64 sample indices, shuffled (their order breaks length ties).
        lengths: lengths of every sample, indexed by ``order``'s values.
        batch_size: samples per batch (exactly one of ``batch_size`` and ``max_tokens``).
        max_tokens: padded-token budget per batch.
        multiple: with ``max_tokens``, the preferred batch-size multiple.
        window: samples sorted together (``None``: all); rounded up to a multiple of
            ``batch_size`` so that only the last window has a short batch.
        group: batches shuffled as one unit by :func:`balanced_batch_order`.
        key: a 64-bit key for every random choice here (the short batch's place, each window's
            first-batch phase, the group shuffle); ``None``: none of them (cost order).
        drop_short: leave out the short batch of ``batch_size`` mode.
        oversized_alone: with ``max_tokens``, a sample over budget is a batch of its own.
        mixed: with a key, batches within a balancing group in the keyed tree order, and (fixed
            size, one window) samples shuffled among neighbours before the cut, as
            :class:`~shardwise._core.sorted_bucketing.SortedBucketPlan` does.
        longest_first: with ``mixed`` and a key, the batch holding the longest sample first.

    Returns:
        The plan, batches in balanced order.
    """
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("bucket_plan needs exactly one of batch_size and max_tokens")
    count = order.size
    if count == 0:
        return BatchPlan.empty()
    mixed = mixed and key is not None
    span = count if window is None else max(min(window, count), 1)
    if batch_size is not None:
        span = -(-span // batch_size) * batch_size  # no window ends inside a batch
        order = sort_in_windows(order, lengths, span)
        if mixed and key is not None and span >= count:  # smaller windows already mix batches
            order = order[neighbour_shuffle(np.arange(count, dtype=np.int64), count, NEIGHBOURS * batch_size, key)]
        plan = _fixed_plan(order, batch_size, span, key, drop_short)
    else:
        if max_tokens is None:  # narrowed above; restated for the type checker
            raise ValueError("bucket_plan needs max_tokens")
        order = sort_in_windows(order, lengths, span, descending=True)
        starts = window_starts(count, span)
        phases = shorten = None
        if key is not None:
            # A random first batch per window and a few batches one sample short, so that the
            # longest samples (sorted alike every epoch) are not cut alike every epoch.
            phases = np.random.PCG64(derive_seed(key, "phase")).random_raw(starts.size)
            shorten = np.random.PCG64(derive_seed(key, "shorten")).random_raw(count) % SHORTEN_ONE_IN == 0
        offsets = token_offsets(
            lengths[order],
            max_tokens,
            multiple=multiple,
            segment_starts=starts,
            phases=phases,
            shorten=shorten,
            oversized_alone=oversized_alone,
        )
        plan = BatchPlan(order, offsets)
    groups_key = None if key is None else derive_seed(key, "groups")
    first = None
    if longest_first and mixed:
        longest = int(np.argmax(lengths[plan.order]))  # its place in the stream
        first = int(np.searchsorted(plan.offsets, longest, side="right")) - 1
    in_order = balanced_batch_order(plan.costs(lengths), group, groups_key, within=mixed, first=first)
    return plan.take(in_order)


def short_batch_at(batches: int, key: int | None) -> int:
    """Which of ``batches`` fixed-size batches is the short one: keyed, or the last without a key."""
    return batches - 1 if key is None else derive_seed(key, "short-batch") % batches


def _fixed_plan(order: np.ndarray, size: int, window: int, key: int | None, drop_short: bool) -> BatchPlan:
    """Fixed-size batches; the short one lands at a random batch of the last window (last without a key)."""
    count = order.size
    short = None
    if count % size:
        last_window = (count - 1) // window * window
        in_last = -(-(count - last_window) // size)
        short = last_window // size + short_batch_at(in_last, key)
    plan = BatchPlan(order, fixed_offsets(count, size, partial_at=short))
    if short is not None and drop_short:
        plan = plan.take(np.delete(np.arange(len(plan), dtype=np.int64), short))
    return plan
