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
- :func:`token_offsets`: a token budget ``len(batch) * max(length) <= max_tokens``, optionally
  in multiples of ``batch_size_multiple``; the budget may also vary along the plan.

Ordering: :func:`sort_in_windows` (shuffle, then sort by length within windows of the stream)
and :func:`balanced_batch_order` (batches sorted by cost, then shuffled in groups, so that
neighbouring batches, hence the ranks of one global step, have similar cost).

Everything is numpy over whole arrays: no Python loop per sample. A loop per batch runs only
where a budget varies from batch to batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ._permutation import Permutation, table_permutation
from ._seeds import derive_seed

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


def _check_ascending(lengths: np.ndarray, starts: np.ndarray) -> None:
    falls = np.flatnonzero(lengths[1:] < lengths[:-1]) + 1
    if falls.size and not np.all(np.isin(falls, starts)):
        at = int(falls[~np.isin(falls, starts)][0])
        raise ValueError(
            f"lengths should ascend within each segment, but lengths[{at - 1}]={lengths[at - 1]} > "
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
    oversized_alone: bool = False,
) -> np.ndarray:
    """Boundaries of greedy token-budget batches: ``len(batch) * max(length) <= max_tokens``.

    Each batch takes as many samples as fit; with ``multiple > 1`` its size is rounded down to
    a multiple of ``multiple``, unless fewer than ``multiple`` samples fit, the batch closes its
    segment (the rest of a segment that fits is one batch), or it is a phased first batch (see
    ``phases``). No batch spans two segments.

    Args:
        lengths: ``(n,)`` lengths in stream order, ascending within each segment (the longest
            sample of a batch is then its last: that is what makes this vectorisable).
        max_tokens: the budget; an int is cut fully vectorised, an array or function of the
            batch position ``j`` (a budget schedule) is cut with one table per distinct value.
        multiple: preferred batch-size multiple (e.g. 8 for tensor cores).
        segment_starts: ``(segments,)`` stream positions where a segment (a sort window) starts.
        phases: ``(segments,)`` non-negative ints, e.g. random words: the first batch of segment
            ``w`` holds ``1 + phases[w] % k`` samples, ``k`` being the greedy size (this batch
            need not be a multiple of ``multiple``). Greedy cuts of sorted data repeat from epoch
            to epoch where lengths are sparse; a random first batch shifts every later boundary
            of its segment.
        oversized_alone: give a sample longer than the budget a batch of its own instead of raising.

    Returns:
        ``(num_batches + 1,)`` int64 offsets into the stream.

    Raises:
        ValueError: a sample longer than the budget (without ``oversized_alone``), or lengths
            not ascending within a segment.

    Example:
        >>> token_offsets(np.array([1, 2, 2, 3, 4, 4]), 8).tolist()
        [0, 3, 5, 6]
    """
    lengths = np.asarray(lengths)
    n = lengths.size
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    starts = _segment_starts(n, segment_starts)
    _check_ascending(lengths, starts)
    if phases is not None and np.shape(phases) != starts.shape:
        raise ValueError(f"phases should have one value per segment ({starts.size}), but got shape {np.shape(phases)}")
    spans = np.diff(np.append(starts, n))
    seg_start = np.repeat(starts, spans)
    seg_end = np.repeat(starts + spans, spans)
    cut = _Cut(lengths, multiple, seg_start, seg_end, oversized_alone)
    budgets = max_tokens if isinstance(max_tokens, np.ndarray) or callable(max_tokens) else np.array([max_tokens])
    return cut.chase(budgets, starts, phases)


def _reach(lengths: np.ndarray, budget: int, seg_start: np.ndarray) -> np.ndarray:
    """``(n,)`` for each start ``i`` the end (exclusive) of the largest batch from ``i`` that fits.

    A batch ``[i, e)`` of an ascending segment fits iff ``(e - i) * lengths[e - 1] <= budget``,
    that is iff ``i >= lowest[e]`` with ``lowest[e] = e - budget // lengths[e - 1]`` (clamped to
    the segment start). ``lowest`` never decreases along the stream (lengths ascend within a
    segment, and a later segment starts past every earlier position), so the largest fitting
    end of start ``i`` is the number of ends ``e`` with ``lowest[e] <= i``: a histogram of
    ``lowest`` and its running sum, O(n).
    """
    n = lengths.size
    ends = np.arange(1, n + 1, dtype=np.int64)
    capacity = budget // np.maximum(lengths.astype(np.int64), 1)
    lowest = np.maximum(ends - capacity, seg_start)  # lowest[e - 1] is for end e; in [0, n]
    return np.cumsum(np.bincount(lowest, minlength=n + 1)[:n])


_CACHED_BUDGETS = 4  # distinct budgets a cut precomputes vectorised (n int64 each); more go batch by batch


class _Cut:
    """The greedy chase over one stream: a loop per batch, O(1) work each from a next-start table."""

    def __init__(
        self, lengths: np.ndarray, multiple: int, seg_start: np.ndarray, seg_end: np.ndarray, alone: bool
    ) -> None:
        self.lengths, self.multiple, self.alone = lengths, multiple, alone
        self.seg_start, self.seg_end = seg_start, seg_end
        self.tables: dict[int, np.ndarray] = {}

    def table(self, budget: int) -> np.ndarray | None:
        """``(n,)`` where the next batch starts after one starting at each position, or ``None``."""
        table = self.tables.get(budget)
        if table is None and len(self.tables) < _CACHED_BUDGETS:
            reach = _reach(self.lengths, budget, self.seg_start)
            here = np.arange(reach.size, dtype=np.int64)
            fit = reach - here
            if self.multiple > 1:
                fit = np.where((fit >= self.multiple) & (reach < self.seg_end), fit - fit % self.multiple, fit)
            if self.alone:
                np.maximum(fit, 1, out=fit)
            table = self.tables[budget] = here + fit
        return table

    def chase(self, budgets: SizeSpec, starts: np.ndarray, phases: np.ndarray | None) -> np.ndarray:
        n = self.lengths.size
        boundaries = [0]
        position, j = 0, 0
        values = np.empty(0, dtype=np.int64)
        starts_list = [*starts.tolist(), n]
        if isinstance(budgets, np.ndarray) and budgets.size == 1:
            return self._chase_one_budget(int(budgets[0]), starts_list, phases)
        segment = 0
        while position < n:
            if j >= values.size:
                values = np.concatenate([values, _size_values(budgets, values.size, _SIZE_CHUNK, "max_tokens")])
            budget = int(values[j])
            table = self.table(budget)
            if table is not None:
                following = table.item(position)
            else:
                following = _one_batch(self.lengths, position, budget, self.multiple, int(self.seg_end[position]),
                                       self.alone)  # fmt: skip
            if following == position:
                raise _oversized_error(position, int(self.lengths[position]), budget)
            if position == starts_list[segment]:
                if phases is not None:
                    following = self._phased(position, following, int(phases[segment]))
                segment += 1
            position = following
            boundaries.append(position)
            j += 1
        return np.asarray(boundaries, dtype=np.int64)

    def _chase_one_budget(self, budget: int, starts_list: list[int], phases: np.ndarray | None) -> np.ndarray:
        """:meth:`chase` for one budget: the hot loop, a few Python operations per batch."""
        n = self.lengths.size
        table = self.table(budget)
        if table is None:
            raise RuntimeError("a single budget always has a next-start table")
        step = table.item
        phase_list = phases.tolist() if phases is not None else None
        boundaries = [0]
        append = boundaries.append
        position, segment, next_start = 0, 0, starts_list[0]
        while position < n:
            following = step(position)
            if position == next_start:
                if phase_list is not None and following > position:
                    following = position + 1 + phase_list[segment] % (following - position)
                segment += 1
                next_start = starts_list[segment]
            if following == position:
                raise _oversized_error(position, int(self.lengths[position]), budget)
            append(following)
            position = following
        return np.asarray(boundaries, dtype=np.int64)

    def _phased(self, position: int, following: int, phase: int) -> int:
        # Any size up to what fits, not only multiples: batches after it must not keep one
        # alignment modulo ``multiple`` every epoch, or sparse lengths would cut alike.
        return position + 1 + phase % (following - position)


def _one_batch(lengths: np.ndarray, position: int, budget: int, multiple: int, end: int, alone: bool) -> int:
    """Where the batch that starts at ``position`` ends, for one budget (no table)."""
    first = int(lengths[position])
    span = min(budget // max(first, 1), end - position)  # lengths ascend: no batch is longer
    window = np.maximum(lengths[position : position + span].astype(np.int64), 1)
    fits = np.arange(1, span + 1, dtype=np.int64) * window <= budget
    fit = span if fits.all() else int(np.argmin(fits))
    if fit == 0:
        return position + 1 if alone else position
    if multiple > 1 and fit >= multiple and position + fit < end:
        fit -= fit % multiple
    return position + fit


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


def sort_in_windows(order: np.ndarray, lengths: np.ndarray, window: int) -> np.ndarray:
    """``order`` sorted by length within consecutive windows of ``window`` samples (stable).

    Equal lengths keep their order in ``order``, so a shuffled ``order`` breaks ties at random.
    A window at least as long as the stream sorts it whole.
    """
    n = order.size
    keyed = lengths[order]
    if window < n:
        longest = int(keyed.max()) + 1 if n else 1
        window_of = np.arange(n, dtype=np.int64) // window
        keyed = window_of * longest + keyed.astype(np.int64)
    if keyed.dtype.itemsize > 2 and int(keyed.max(initial=0)) < 2**16:
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
