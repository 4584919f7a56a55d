"""The batch-plan layer: one epoch's batches as two compact arrays, and the ways to cut them.

A :class:`BatchPlan` is ``order`` (int64 sample indices in plan order) and ``offsets`` (int64
batch boundaries): batch ``j`` is ``order[offsets[j]:offsets[j + 1]]``, so any batch is found
by its position in O(1), and a plan of ten million samples costs two arrays, not ten million
Python lists. Batch samplers build a plan per epoch from pure functions here and deal it out
by position (DESIGN.md section 1).

Cutting an ordered stream of samples into batches:

- :func:`fixed_offsets`: one batch size, with the short batch (if any) at a chosen position;
- :func:`sized_offsets`: a batch size that varies along the plan (an array, or a function of the
  batch position ``j``), the hook for batch-size schedules;
- :func:`token_offsets`: a token budget ``len(batch) * max(length) <= max_tokens``, cut
  longest first, optionally in multiples of ``batch_size_multiple``; the budget may also vary
  along the plan.

Ordering: :func:`sort_in_windows` (shuffle, then sort by length within windows of the stream)
and :func:`balanced_batch_order` (batches sorted by cost, then shuffled in groups, so that
neighbouring batches, hence the ranks of one global step, have similar cost).
:func:`bucket_plan` chains them: ``BucketBatchSampler``'s epoch plan, as a pure function.

Everything is numpy over whole arrays: no Python loop per sample. The token cut follows its
batches one by one (a few Python operations per batch, from a vectorised next-start table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .permutation import Permutation, table_permutation
from .seeds import derive_seed

SizeSpec = int | np.ndarray | Callable[[np.ndarray], np.ndarray]
"""A batch size (or token budget) along the plan: one int for every batch, an array whose
entry ``j`` is batch ``j``'s (the last entry holds for every later batch), or a function that
takes an int64 array of batch positions ``j`` and returns their values (same shape, integers)."""

_SIZE_CHUNK = 4096  # batch positions a size function is asked about at a time


# -- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class BatchPlan:
    """One epoch's batches: batch ``j`` is ``order[offsets[j]:offsets[j + 1]]``.

    Attributes:
        order: ``(num_samples,)`` int64 sample indices in plan order.
        offsets: ``(len(plan) + 1,)`` int64, ``offsets[0] == 0``, strictly increasing,
            ``offsets[-1] == len(order)`` (no batch is empty).

    Example:
        >>> plan = BatchPlan(np.arange(5, dtype=np.int64), np.array([0, 2, 5], dtype=np.int64))
        >>> len(plan), plan.batches(np.array([1, 0]))
        (2, [[2, 3, 4], [0, 1]])
    """

    order: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        order, offsets = self.order, self.offsets
        if order.dtype != np.int64 or order.ndim != 1:
            raise ValueError(f"order should be a 1-D int64 array, but got dtype {order.dtype}, shape {order.shape}")
        if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.size == 0:
            raise ValueError(f"offsets should be a non-empty 1-D int64 array, but got shape {offsets.shape}")
        if offsets[0] != 0 or offsets[-1] != order.size:
            raise ValueError(
                f"offsets should run from 0 to len(order)={order.size}, but got {offsets[0]}..{offsets[-1]}"
            )
        if offsets.size > 1 and np.any(offsets[1:] <= offsets[:-1]):
            raise ValueError("offsets should be strictly increasing: a batch plan holds no empty batch")

    @classmethod
    def empty(cls) -> BatchPlan:
        """A plan with no batches."""
        return cls(np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64))

    @classmethod
    def concat(cls, plans: Sequence[BatchPlan]) -> BatchPlan:
        """The batches of ``plans`` one after another (e.g. pieces of constant batch size)."""
        if not plans:
            return cls.empty()
        order = np.concatenate([plan.order for plan in plans])
        shifts = np.cumsum([0] + [plan.num_samples for plan in plans[:-1]])
        offsets = np.concatenate(
            [np.zeros(1, dtype=np.int64)] + [p.offsets[1:] + s for p, s in zip(plans, shifts, strict=True)]
        )
        return cls(order, offsets.astype(np.int64))

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def num_samples(self) -> int:
        """Samples in the plan (each batch's samples counted once)."""
        return int(self.order.size)

    def sizes(self) -> np.ndarray:
        """``(len(plan),)`` int64 batch sizes."""
        return np.diff(self.offsets)

    def batch(self, j: int) -> np.ndarray:
        """Batch ``j``'s sample indices (a view)."""
        return self.order[self.offsets[j] : self.offsets[j + 1]]

    def flat_positions(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions in ``order`` of the batches at ``positions``, concatenated, and their sizes."""
        positions = np.asarray(positions, dtype=np.int64)
        starts = self.offsets[positions]
        sizes = self.offsets[positions + 1] - starts
        # flat: (sizes.sum(),) -- start of each batch repeated, plus the rank within the batch.
        firsts = np.cumsum(sizes) - sizes
        flat = np.repeat(starts - firsts, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
        return flat, sizes

    def batches(self, positions: np.ndarray) -> list[list[int]]:
        """The batches at plan ``positions`` as lists of ints (what a batch sampler yields)."""
        flat, sizes = self.flat_positions(positions)
        values = self.order[flat].tolist()
        out = []
        first = 0
        for size in sizes.tolist():
            out.append(values[first : first + size])
            first += size
        return out

    def take(self, batch_indices: np.ndarray) -> BatchPlan:
        """A plan of the batches ``batch_indices`` (a reordering, or a subset), in that order."""
        flat, sizes = self.flat_positions(batch_indices)
        offsets = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return BatchPlan(self.order[flat], offsets)

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """``(len(plan),)`` int64 padded cost of each batch: ``len(batch) * max(length in batch)``."""
        if len(self) == 0:
            return np.empty(0, dtype=np.int64)
        longest = np.maximum.reduceat(lengths[self.order].astype(np.int64), self.offsets[:-1])
        costs: np.ndarray = longest * self.sizes()
        return costs


# -- cutting a stream into batches ----------------------------------------------------------------
def _offsets_from_sizes(sizes: np.ndarray) -> np.ndarray:
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def fixed_offsets(n: int, batch_size: int, *, partial_at: int | None = None) -> np.ndarray:
    """Boundaries of batches of ``batch_size`` over a stream of ``n`` samples.

    Args:
        n: samples in the stream.
        batch_size: samples per batch.
        partial_at: the batch position of the short batch when ``batch_size`` does not divide
            ``n`` (``None``: the last batch). Batches before it start at multiples of
            ``batch_size``; batches after it are shifted by the short batch's size.

    Returns:
        ``(num_batches + 1,)`` int64 offsets. To leave the short batch out, build the plan and
        :meth:`BatchPlan.take` every other batch.
    """
    full, rest = divmod(n, batch_size)
    sizes = np.full(full, batch_size, dtype=np.int64)
    if rest:
        at = full if partial_at is None else min(max(partial_at, 0), full)
        sizes = np.insert(sizes, at, rest)
    return _offsets_from_sizes(sizes)


def _size_values(spec: SizeSpec, first: int, count: int, name: str) -> np.ndarray:
    """Values of ``spec`` at batch positions ``first .. first + count - 1`` as positive int64."""
    if isinstance(spec, np.ndarray):
        positions = np.minimum(np.arange(first, first + count), spec.size - 1)
        values = spec[positions]
    elif callable(spec):
        positions = np.arange(first, first + count, dtype=np.int64)
        values = np.asarray(spec(positions))
        if values.shape != positions.shape:
            raise ValueError(f"{name} function returned shape {values.shape} for {count} batch positions")
    else:
        values = np.full(count, int(spec), dtype=np.int64)
    if values.dtype == np.bool_ or not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"{name} should give integers, but gave dtype {values.dtype}")
    bad = np.flatnonzero(values < 1)
    if bad.size:
        at = int(bad[0])
        raise ValueError(f"{name} should be positive, but got {values[at]} at batch position {first + at}")
    return values.astype(np.int64, copy=False)


def sized_offsets(n: int, sizes: SizeSpec, *, drop_partial: bool = False, name: str = "batch_size") -> np.ndarray:
    """Boundaries of batches whose size varies along the plan: batch ``j`` has ``sizes``'s value at ``j``.

    The last batch is cut short at ``n``, or left out with ``drop_partial`` (the offsets then end
    before ``n``: build the plan over ``order[:offsets[-1]]``). This is the hook for batch-size
    schedules: pass a function of the batch position.

    Example:
        >>> sized_offsets(10, lambda j: 2 + j).tolist()
        [0, 2, 5, 9, 10]
    """
    pieces = []
    covered, first, chunk = 0, 0, 64
    while covered < n:
        values = _size_values(sizes, first, chunk, name)
        ends = covered + np.cumsum(values)
        pieces.append(values)
        covered, first, chunk = int(ends[-1]), first + chunk, min(chunk * 4, _SIZE_CHUNK * 16)
    all_sizes = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    offsets = _offsets_from_sizes(all_sizes)
    count = int(np.searchsorted(offsets, n, side="left"))  # first boundary at or past n
    offsets = offsets[: count + 1]
    if offsets[-1] > n:
        if drop_partial:
            offsets = offsets[:-1]
        else:
            offsets[-1] = n
    return offsets


def _check_descending(lengths: np.ndarray, starts: np.ndarray) -> None:
    rises = np.flatnonzero(lengths[1:] > lengths[:-1]) + 1
    inside = rises[~np.isin(rises, starts)]
    if inside.size:
        at = int(inside[0])
        raise ValueError(
            f"lengths should descend within each segment, but lengths[{at - 1}]={lengths[at - 1]} < "
            f"lengths[{at}]={lengths[at]}; sort each segment first (see sort_in_windows)"
        )


def _segment_starts(n: int, segment_starts: np.ndarray | None) -> np.ndarray:
    if segment_starts is None:
        return np.zeros(1 if n else 0, dtype=np.int64)
    starts = np.asarray(segment_starts, dtype=np.int64)
    if starts.size and (starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= n):
        raise ValueError("segment_starts should rise strictly from 0 and stay below the stream length")
    return starts


def _oversized_error(at: int, length: int, budget: int) -> ValueError:
    return ValueError(
        f"a sample is longer than the token budget: length {length} at stream position {at}, but max_tokens={budget}"
    )


def token_offsets(
    lengths: np.ndarray,
    max_tokens: SizeSpec,
    *,
    multiple: int = 1,
    segment_starts: np.ndarray | None = None,
    phases: np.ndarray | None = None,
    shorten: np.ndarray | None = None,
    oversized_alone: bool = False,
) -> np.ndarray:
    """Boundaries of token-budget batches cut longest first: ``len(batch) * max(length) <= max_tokens``.

    Within a segment lengths descend, so a batch's first sample is its longest and the batch
    takes ``max_tokens // first_length`` samples (or the rest of the segment); with
    ``multiple > 1`` that count is rounded down to a multiple of ``multiple`` unless fewer fit,
    the batch closes its segment, or it is a phased batch (below). No batch spans two segments.

    Cutting longest first (rather than filling each batch greedily from the shortest) keeps two
    cuts of a segment that are at different positions from meeting again (a later start always
    reaches further), so a random start moves every later boundary: batches of sparse lengths
    (the longest samples, whose sorted order is the same every epoch) then differ between epochs.

    Args:
        lengths: ``(n,)`` lengths in stream order, descending within each segment; a length of 0
            counts as 1.
        max_tokens: the budget: an int, or an array or function of the batch position ``j``
            (a budget schedule). Either way the loop is per batch, O(1) each.
        multiple: preferred batch-size multiple (e.g. 8 for tensor cores).
        segment_starts: ``(segments,)`` stream positions where a segment (a sort window) starts.
        phases: ``(segments,)`` non-negative ints, e.g. random words: the first batch of segment
            ``w`` holds ``1 + phases[w] % k`` samples, ``k`` being what fits (this batch need not
            be a multiple of ``multiple``).
        shorten: ``(n,)`` bool, e.g. random with a small probability: a batch that starts at a
            marked position takes one sample (``multiple`` samples) fewer than fit, when at
            least two (two multiples) fit and it does not close its segment. Two cuts that hold
            the same boundaries (the same phase) part at the first marked batch.
        oversized_alone: give a sample longer than the budget a batch of its own instead of raising.

    Returns:
        ``(num_batches + 1,)`` int64 offsets into the stream.

    Raises:
        ValueError: a sample longer than the budget (without ``oversized_alone``), or lengths
            not descending within a segment.

    Example:
        >>> token_offsets(np.array([4, 4, 3, 2, 2, 1]), 8).tolist()
        [0, 2, 4, 6]
    """
    lengths = np.asarray(lengths)
    n = lengths.size
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    starts = _segment_starts(n, segment_starts)
    _check_descending(lengths, starts)
    if phases is not None and np.shape(phases) != starts.shape:
        raise ValueError(f"phases should have one value per segment ({starts.size}), but got shape {np.shape(phases)}")
    if shorten is not None and np.shape(shorten) != (n,):
        raise ValueError(f"shorten should have one flag per stream position ({n}), but got shape {np.shape(shorten)}")
    ends = np.append(starts[1:], n)
    if isinstance(max_tokens, np.ndarray) or callable(max_tokens):
        return _cut_varying(lengths, max_tokens, multiple, starts, ends, phases, shorten, oversized_alone)
    budget = int(max_tokens)
    seg_end = np.repeat(ends, ends - starts)  # (n,) end of each position's segment
    here = np.arange(n, dtype=np.int64)
    room = budget // np.maximum(lengths.astype(np.int64), 1)  # what fits behind each position
    fit = np.minimum(np.maximum(room, 1) if oversized_alone else room, seg_end - here)
    inner = here + fit < seg_end  # the batch does not close its segment
    if multiple > 1:
        fit = np.where((fit >= multiple) & inner, fit - fit % multiple, fit)
    if shorten is not None:
        unit = multiple if multiple > 1 else 1
        fit = np.where(shorten & inner & (fit >= 2 * unit), fit - unit, fit)
    return _chase(here + fit, room, lengths, budget, starts.tolist(), ends.tolist(), phases)


def _chase(
    nxt: np.ndarray,
    room: np.ndarray,
    lengths: np.ndarray,
    budget: int,
    starts: list[int],
    ends: list[int],
    phases: np.ndarray | None,
) -> np.ndarray:
    """Follow ``nxt`` through each segment (a loop per batch, a few Python operations each)."""
    boundaries = [0]
    append = boundaries.append
    step, fits = nxt.item, room.item
    for segment, (first, end) in enumerate(zip(starts, ends, strict=True)):
        position = first
        if phases is not None and position < end:
            allowed = min(fits(position), end - position)
            if allowed > 1:
                position += 1 + int(phases[segment]) % allowed
                append(position)
        while position < end:
            following = step(position)
            if following == position:
                raise _oversized_error(position, int(lengths[position]), budget)
            append(following)
            position = following
    return np.asarray(boundaries, dtype=np.int64)


def _cut_varying(
    lengths: np.ndarray,
    max_tokens: np.ndarray | Callable[[np.ndarray], np.ndarray],
    multiple: int,
    starts: np.ndarray,
    ends: np.ndarray,
    phases: np.ndarray | None,
    shorten: np.ndarray | None,
    alone: bool,
) -> np.ndarray:
    """:func:`token_offsets` with a budget per batch position ``j``."""
    boundaries = [0]
    length_at = lengths.item
    marked = None if shorten is None else shorten.item
    unit = multiple if multiple > 1 else 1
    budgets = np.empty(0, dtype=np.int64)
    j = 0
    for segment, (first, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        position = first
        while position < end:
            if j >= budgets.size:
                budgets = np.concatenate([budgets, _size_values(max_tokens, budgets.size, _SIZE_CHUNK, "max_tokens")])
            budget = int(budgets[j])
            longest = max(int(length_at(position)), 1)
            fit = min(budget // longest, end - position)
            if fit == 0:
                if not alone:
                    raise _oversized_error(position, longest, budget)
                fit = 1
            inner = position + fit < end
            if phases is not None and position == first and fit > 1:
                fit = 1 + int(phases[segment]) % fit
            else:
                if multiple > 1 and fit >= multiple and inner:
                    fit -= fit % multiple
                if marked is not None and inner and fit >= 2 * unit and marked(position):
                    fit -= unit
            position += fit
            boundaries.append(position)
            j += 1
    return np.asarray(boundaries, dtype=np.int64)


# -- ordering -------------------------------------------------------------------------------------
def shuffled(n: int, key: int | None) -> np.ndarray:
    """``(n,)`` int64: ``[0, n)`` in the keyed random order of ``key`` (``None``: identity).

    Materialised (a plan holds every index anyway): the stable argsort of ``n`` raw PCG64 words
    (``table_permutation``), the same on every platform, and much faster than evaluating a
    Feistel network at every position. Distinct words have one sorted order whatever the sort
    algorithm, so the fast unstable sort is used unless two words collide.
    """
    if key is None:
        return np.arange(n, dtype=np.int64)
    words = np.random.PCG64(key).random_raw(n)
    order = np.argsort(words)
    ranked = words[order]
    if n > 1 and np.any(ranked[1:] == ranked[:-1]):
        return table_permutation(n, key)
    return order.astype(np.int64, copy=False)


def sort_in_windows(order: np.ndarray, lengths: np.ndarray, window: int, *, descending: bool = False) -> np.ndarray:
    """``order`` sorted by length within consecutive windows of ``window`` samples (stable).

    Equal lengths keep their order in ``order``, so a shuffled ``order`` breaks ties at random.
    A window at least as long as the stream sorts it whole. ``descending`` puts the longest
    first in each window (what :func:`token_offsets` cuts).
    """
    n = order.size
    if n == 0:
        return order
    keyed = lengths[order].astype(np.int64)
    longest = int(keyed.max()) + 1
    if descending:
        keyed = longest - 1 - keyed
    if window < n:
        windows = (n - 1) // window + 1
        if windows * longest < 2**62:
            keyed += (np.arange(n, dtype=np.int64) // window) * longest
        else:  # keys would overflow int64: sort by (window, length) pairs instead
            return order[np.lexsort((keyed, np.arange(n, dtype=np.int64) // window))]
    if int(keyed.max()) < 2**16:
        keyed = keyed.astype(np.uint16)  # numpy's stable sort of 16-bit keys is a radix sort
    return order[np.argsort(keyed, kind="stable")]


def window_starts(n: int, window: int) -> np.ndarray:
    """``(ceil(n / window),)`` int64 stream positions where each window starts."""
    return np.arange(0, n, max(window, 1), dtype=np.int64)


def balanced_batch_order(costs: np.ndarray, group: int, key: int | None) -> np.ndarray:
    """A batch order in which neighbours have similar cost, yet which changes with ``key``.

    Batches are sorted by cost (stable: equal costs keep their incoming order), cut into groups
    of ``group`` consecutive batches, and the groups are shuffled as units. The W batches of
    one global step then come from one group whenever ``W`` divides ``group``, whatever the
    world size the plan is dealt to. When ``group`` does not divide the number of batches, one
    group is short: which one is drawn from ``key``, and it goes last, so that every full group
    starts at a multiple of ``group``.

    Args:
        costs: ``(num_batches,)`` cost of each batch (e.g. :meth:`BatchPlan.costs`).
        group: batches per shuffled group.
        key: a 64-bit key; ``None`` keeps the cost order (no shuffle).

    Returns:
        ``(num_batches,)`` int64 batch indices in plan order.
    """
    by_cost = np.argsort(costs, kind="stable").astype(np.int64)
    count = by_cost.size
    if key is None or count == 0:
        return by_cost
    full, rest = divmod(count, group)
    short = derive_seed(key, "short-group") % (full + 1) if rest else full
    # Full group g starts at g * group, or, past the short group, rest later.
    group_starts = np.arange(full, dtype=np.int64) * group
    group_starts[short:] += rest
    shuffled_starts = group_starts[Permutation(full, derive_seed(key, "groups"))(np.arange(full))]
    # picks: (full * group,) -- each group's start repeated, plus the rank within the group.
    picks = (shuffled_starts[:, None] + np.arange(group, dtype=np.int64)[None, :]).ravel()
    tail = np.arange(short * group, short * group + rest, dtype=np.int64)
    result: np.ndarray = by_cost[np.concatenate([picks, tail])]
    return result


# -- the bucketing recipe --------------------------------------------------------------------------
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

    Returns:
        The plan, batches in balanced order.
    """
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("bucket_plan needs exactly one of batch_size and max_tokens")
    count = order.size
    if count == 0:
        return BatchPlan.empty()
    span = count if window is None else max(min(window, count), 1)
    if batch_size is not None:
        span = -(-span // batch_size) * batch_size  # no window ends inside a batch
        order = sort_in_windows(order, lengths, span)
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
    return plan.take(balanced_batch_order(plan.costs(lengths), group, groups_key))


def _fixed_plan(order: np.ndarray, size: int, window: int, key: int | None, drop_short: bool) -> BatchPlan:
    """Fixed-size batches; the short one lands at a random batch of the last window (last without a key)."""
    count = order.size
    short = None
    if count % size:
        last_window = (count - 1) // window * window
        in_last = -(-(count - last_window) // size)
        draw = in_last - 1 if key is None else derive_seed(key, "short-batch") % in_last
        short = last_window // size + draw
    plan = BatchPlan(order, fixed_offsets(count, size, partial_at=short))
    if short is not None and drop_short:
        plan = plan.take(np.delete(np.arange(len(plan), dtype=np.int64), short))
    return plan


# -- the bucketing recipe over a sorted stream, in O(distinct lengths) memory --------------------
SHORTEN_CYCLE = SHORTEN_ONE_IN
"""In a run of equal length, one batch in this many (at a keyed phase per run) is shortened."""


def _advance(distance: int, fit: int, unit: int, phase: int) -> int:
    """The fewest batches of a run whose starts reach ``distance`` past the run's first start.

    Batch ``k`` of the run starts at ``g(k) = k * fit - unit * S(k)``, ``S(k)`` counting the
    shortened batches before ``k`` (those with ``k % 8 == phase``; none when ``unit == 0``).
    Returns the smallest ``k`` with ``g(k) >= distance`` (0 when ``distance <= 0``).
    """
    if distance <= 0:
        return 0
    if unit == 0:
        return -(-distance // fit)
    block = SHORTEN_CYCLE * fit - unit  # eight consecutive batches, one of them shortened
    blocks, rest = divmod(distance, block)
    if rest == 0:
        return blocks * SHORTEN_CYCLE
    within = -(-rest // fit)
    if within > phase and within * fit - unit < rest:
        within += 1
    return blocks * SHORTEN_CYCLE + within


def _reach_at(k: int, fit: int, unit: int, phase: int) -> int:
    """:func:`_reach` for one batch, in plain ints (the per-run loop)."""
    if unit == 0 or k <= phase:
        return k * fit
    return k * fit - unit * ((k - phase + SHORTEN_CYCLE - 1) // SHORTEN_CYCLE)


def _reach(k: int | np.ndarray, fit: int | np.ndarray, unit: int | np.ndarray, phase: int | np.ndarray) -> Any:
    """``g(k)``: where batch ``k`` of a run starts, relative to the run's first batch (vectorised)."""
    shortened = np.maximum(0, (np.asarray(k) - phase + SHORTEN_CYCLE - 1) // SHORTEN_CYCLE)
    return k * fit - unit * np.where(np.asarray(unit) > 0, shortened, 0)


class SortedBucketPlan:
    """``bucket_plan`` over a stream sorted by length (no ``sort_window``), batch by batch in O(1).

    The stream is every sample sorted by length (longest first under ``max_tokens``, shortest
    first with ``batch_size``), equal lengths forming *runs*; which sample of a run sits where
    is the caller's (a keyed permutation within the run, see ``shardwise.index.GroupedIndex``).
    Because a batch's size and cost depend only on the lengths along the stream, the whole plan
    (cut, cost order, group shuffle) is arithmetic over the runs: this object holds O(runs)
    integers and answers "which stream span is plan batch ``q``" in O(log runs) per batch, never
    materialising per-sample or per-batch arrays. The recipe is :func:`bucket_plan`'s, with one
    change that keeps it arithmetic: a shortened batch (under ``max_tokens``, with a key) is one
    in ``SHORTEN_CYCLE`` of each run, at a keyed phase per run, instead of one drawn per position.

    Args:
        run_lengths: ``(R,)`` the length of each run, in stream order (descending under
            ``max_tokens``, ascending with ``batch_size``); no run is empty.
        run_counts: ``(R,)`` samples in each run.
        batch_size: samples per batch (exactly one of ``batch_size`` and ``max_tokens``).
        max_tokens: padded-token budget per batch.
        multiple: with ``max_tokens``, the preferred batch-size multiple.
        group: batches shuffled as one unit by the balancing reorder.
        key: a 64-bit key for every random choice (``None``: none, cost order).
        drop_short: leave out the short batch of ``batch_size`` mode.
        oversized_alone: a run longer than the budget gets one batch per sample.

    Example:
        >>> plan = SortedBucketPlan(np.array([4, 2, 1]), np.array([2, 3, 1]), max_tokens=8)
        >>> len(plan), plan.spans(np.arange(len(plan)))[1].tolist()
        (3, [2, 3, 1])
    """

    def __init__(
        self,
        run_lengths: np.ndarray,
        run_counts: np.ndarray,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        multiple: int = 1,
        group: int = 64,
        key: int | None = None,
        drop_short: bool = False,
        oversized_alone: bool = False,
    ) -> None:
        if (batch_size is None) == (max_tokens is None):
            raise ValueError("SortedBucketPlan needs exactly one of batch_size and max_tokens")
        self.run_lengths = np.asarray(run_lengths, dtype=np.int64)
        self.run_counts = np.asarray(run_counts, dtype=np.int64)
        self.run_starts = np.zeros(self.run_lengths.size + 1, dtype=np.int64)
        np.cumsum(self.run_counts, out=self.run_starts[1:])
        self.num_samples = int(self.run_starts[-1])
        self.key = key
        self.group = group
        self._fixed = batch_size
        if batch_size is not None:
            self._init_fixed(batch_size, drop_short)
        else:
            if max_tokens is None:  # narrowed above; restated for the type checker
                raise ValueError("SortedBucketPlan needs max_tokens")
            self._init_tokens(max_tokens, multiple, oversized_alone)
        self._init_groups()

    # -- token budget: segments of regular batches -------------------------------------------
    def _init_tokens(self, budget: int, multiple: int, alone: bool) -> None:
        lengths, starts = self.run_lengths, self.run_starts
        n = self.num_samples
        rooms = budget // np.maximum(lengths, 1)
        if alone:
            rooms = np.maximum(rooms, 1)
        elif lengths.size and int(rooms.min()) == 0:
            run = int(np.argmin(rooms))
            raise _oversized_error(int(starts[run]), int(lengths[run]), budget)
        unit = multiple if multiple > 1 else 1
        fits = np.where((rooms >= multiple) & (multiple > 1), rooms - rooms % multiple, rooms)
        key = self.key
        phases = np.zeros(lengths.size, dtype=np.int64)
        shortens = np.zeros(lengths.size, dtype=bool)
        if key is not None:
            words = np.random.PCG64(derive_seed(key, "shorten-phase")).random_raw(lengths.size)
            phases = (words % np.uint64(SHORTEN_CYCLE)).astype(np.int64)
            shortens = (fits >= 2 * unit) & (lengths > 0)
        # segments: (start, batches, fit, unit, phase, length), at most one per run + 2; six flat lists
        # of ints, not a list of tuples: thousands of new tuples would trigger a full garbage
        # collection, which after `import torch` costs a quarter of a second
        seg = _Segments()
        position = 0
        if key is not None and n:
            allowed = min(int(rooms[0]), n)
            if allowed > 1:
                word = int(np.random.PCG64(derive_seed(key, "phase")).random_raw())
                first = 1 + word % allowed
                seg.append((0, 1, first, 0, 0, int(lengths[0])))
                position = first
        run = 0
        room_of, fit_of, start_of, length_of = rooms.tolist(), fits.tolist(), starts.tolist(), lengths.tolist()
        phase_of, shorten_of = phases.tolist(), shortens.tolist()
        while position < n:
            while start_of[run + 1] <= position:
                run += 1
            fit, room, end, length = fit_of[run], room_of[run], start_of[run + 1], length_of[run]
            cut_unit = unit if shorten_of[run] else 0
            phase = phase_of[run]
            if n - room < end:  # the batch that closes the stream may start in this run
                closing = _advance(n - room - position, fit, cut_unit, phase)
                close_at = position + _reach_at(closing, fit, cut_unit, phase)
            else:
                closing, close_at = 0, end
            if close_at < end:  # the rest of the stream fits in the batch that starts at close_at
                if closing:
                    seg.append((position, closing, fit, cut_unit, phase, length))
                seg.append((close_at, 1, n - close_at, 0, 0, length))
                break
            batches = _advance(end - position, fit, cut_unit, phase)
            seg.append((position, batches, fit, cut_unit, phase, length))
            position += _reach_at(batches, fit, cut_unit, phase)
        self._init_classes(seg.table())

    def _init_classes(self, table: np.ndarray) -> None:
        """Group the segments' batches into classes of one cost, sorted as a stable sort by cost would."""
        self._seg_start, self._seg_count, self._seg_fit, self._seg_unit, self._seg_phase, self._seg_length = table.T
        shortened = np.where(self._seg_unit > 0, _reach_count(self._seg_count, self._seg_phase), 0)
        # classes: the full batches, then the shortened ones, of every segment; sorted by (cost, segment)
        count = np.concatenate([self._seg_count - shortened, shortened])
        cost = np.concatenate([self._seg_fit, self._seg_fit - self._seg_unit]) * np.tile(self._seg_length, 2)
        segment = np.tile(np.arange(self._seg_start.size, dtype=np.int64), 2)
        kept = np.flatnonzero(count > 0)
        order = kept[np.lexsort((segment[kept], cost[kept]))]
        self._class_segment = segment[order]
        self._class_short = order >= self._seg_start.size
        self._class_first = np.zeros(order.size + 1, dtype=np.int64)
        np.cumsum(count[order], out=self._class_first[1:])
        self._num_batches = int(self._class_first[-1])

    def _token_spans(self, ranked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stream start and size of the batches at cost-order positions ``ranked``."""
        cls = np.searchsorted(self._class_first, ranked, side="right") - 1
        j = ranked - self._class_first[cls]
        seg = self._class_segment[cls]
        unit, phase, fit = self._seg_unit[seg], self._seg_phase[seg], self._seg_fit[seg]
        short = self._class_short[cls]
        # the j-th shortened batch is k = phase + 8j; the j-th full one skips the shortened
        # index of each block of eight (none when the run is not shortened)
        blocks, within = np.divmod(j, SHORTEN_CYCLE - 1)
        full_k = np.where(unit > 0, blocks * SHORTEN_CYCLE + within + (within >= phase), j)
        k = np.where(short, phase + SHORTEN_CYCLE * j, full_k)
        starts = self._seg_start[seg] + _reach(k, fit, unit, phase)
        sizes = np.where(short, fit - unit, fit)
        return starts.astype(np.int64), sizes.astype(np.int64)

    # -- fixed batch size ---------------------------------------------------------------------
    def _init_fixed(self, size: int, drop_short: bool) -> None:
        n = self.num_samples
        batches, rest = -(-n // size), n % size
        self._short = batches  # no short batch: past the end
        self._short_size = size
        self._short_rank = batches
        self._drop = False
        if rest:
            key = self.key
            self._short = batches - 1 if key is None else derive_seed(key, "short-batch") % batches
            self._short_size = rest
            if drop_short:
                self._drop = True
            else:
                end = self._short * size + rest  # stream end of the short batch
                cost = rest * self._length_at(end - 1)
                below, upto = self._regular_at_most(cost - 1), self._regular_at_most(cost)
                self._short_rank = below + max(0, min(upto, self._short) - below)
        self._num_batches = batches - (1 if self._drop else 0)

    def _length_at(self, position: int) -> int:
        run = int(np.searchsorted(self.run_starts, position, side="right")) - 1
        return int(self.run_lengths[run])

    def _regular_at_most(self, cost: int) -> int:
        """Full-size batches whose cost ``size * (longest)`` is at most ``cost``."""
        if cost < 0 or self._fixed is None:
            return 0
        size, short = self._fixed, self._short
        threshold = cost // size
        runs = int(np.searchsorted(self.run_lengths, threshold, side="right"))
        within = int(self.run_starts[runs])  # samples of length <= threshold: a stream prefix
        regular = -(-self.num_samples // size) - (1 if short < -(-self.num_samples // size) else 0)
        before = min(short, within // size)
        if before < short:
            return before
        after = (within + size - self._short_size) // size - 1 - short
        return before + min(max(after, 0), regular - short)

    def _fixed_spans(self, ranked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        size, short = self._fixed or 1, self._short
        if self._drop:
            regular = ranked
            is_short = np.zeros(ranked.shape, dtype=bool)
        else:
            is_short = ranked == self._short_rank
            regular = np.where(ranked > self._short_rank, ranked - 1, ranked)
        j = np.where(is_short, short, regular + (regular >= short))
        starts = j * size - np.where(j > short, size - self._short_size, 0)
        sizes = np.where(j == short, self._short_size, size)
        return starts.astype(np.int64), sizes.astype(np.int64)

    # -- balancing: cost order shuffled in groups ---------------------------------------------
    def _init_groups(self) -> None:
        count, group = self._num_batches, self.group
        self._groups: Permutation | None = None
        if self.key is None or count == 0:
            return
        groups_key = derive_seed(self.key, "groups")
        full, rest = divmod(count, group)
        self._short_group = derive_seed(groups_key, "short-group") % (full + 1) if rest else full
        self._rest = rest
        self._full_groups = full
        self._groups = Permutation(full, derive_seed(groups_key, "groups"))

    def _cost_rank(self, positions: np.ndarray) -> np.ndarray:
        """Cost-order position of each plan position (the inverse of nothing: a direct map)."""
        if self._groups is None:
            return positions
        group = self.group
        if self._full_groups == 0:
            return positions
        full = self._full_groups * group
        in_full = positions < full
        shuffled = self._groups(np.where(in_full, positions // group, 0))
        starts = shuffled * group + np.where(shuffled >= self._short_group, self._rest, 0)
        tail = self._short_group * group + (positions - full)
        return np.where(in_full, starts + positions % group, tail)

    # -- what the sampler reads ---------------------------------------------------------------
    def __len__(self) -> int:
        return self._num_batches

    def spans(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, sizes)``: the stream span of the plan batches at ``positions`` (int64 arrays)."""
        ranked = self._cost_rank(np.asarray(positions, dtype=np.int64))
        if self._fixed is not None:
            return self._fixed_spans(ranked)
        return self._token_spans(ranked)

    def locate(self, stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(runs, ranks)``: the run of each stream position and the position's rank within it."""
        runs = np.searchsorted(self.run_starts, stream, side="right") - 1
        return runs, stream - self.run_starts[runs]


class _Segments:
    """Rows of ints appended column by column (no tuple per row)."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: tuple[list[int], ...] = ([], [], [], [], [], [])

    def append(self, row: tuple[int, int, int, int, int, int]) -> None:
        for column, value in zip(self.columns, row, strict=True):
            column.append(value)

    def table(self) -> np.ndarray:
        """``(rows, 6)`` int64."""
        table: np.ndarray = np.array(self.columns, dtype=np.int64).reshape(6, -1).T
        return table


def _reach_count(batches: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Shortened batches among the first ``batches`` of a run with this ``phase``."""
    counts: np.ndarray = np.maximum(0, (batches - phase + SHORTEN_CYCLE - 1) // SHORTEN_CYCLE)
    return counts


def span_positions(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``(sizes.sum(),)`` int64: the stream positions of every span, concatenated."""
    firsts = np.cumsum(sizes) - sizes
    return np.repeat(starts - firsts, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
