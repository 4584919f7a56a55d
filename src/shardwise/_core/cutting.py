"""Cutting an ordered stream of samples into batches: the boundaries (``offsets``) of a batch plan.

- :func:`fixed_offsets`: one batch size, with the short batch (if any) at a chosen position;
- :func:`sized_offsets`: a batch size that varies along the plan (an array, or a function of the
  batch position ``j``), the hook for batch-size schedules;
- :func:`token_offsets`: a token budget ``len(batch) * max(length) <= max_tokens``, cut
  longest first, optionally in multiples of ``batch_size_multiple``; the budget may also vary
  along the plan.

Everything is numpy over whole arrays: no Python loop per sample. The token cut follows its
batches one by one (a few Python operations per batch, from a vectorised next-start table).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .offsets import offsets_from_counts

SizeSpec = int | np.ndarray | Callable[[np.ndarray], np.ndarray]
"""A batch size (or token budget) along the plan: one int for every batch, an array whose
entry ``j`` is batch ``j``'s (the last entry holds for every later batch), or a function that
takes an int64 array of batch positions ``j`` and returns their values (same shape, integers)."""

_SIZE_CHUNK = 4096  # batch positions a size function is asked about at a time


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
    return offsets_from_counts(sizes)


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
    offsets = offsets_from_counts(all_sizes)
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


def oversized_error(at: int, length: int, budget: int) -> ValueError:
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
                raise oversized_error(position, int(lengths[position]), budget)
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
                    raise oversized_error(position, longest, budget)
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
