"""The bucketing recipe over a stream sorted by length, batch by batch in O(distinct lengths) memory.

:class:`SortedBucketPlan` answers "which stream span is plan batch ``q``" from arithmetic over the
runs of equal length, never materialising per-sample or per-batch arrays: what lets
``BucketBatchSampler`` hold O(distinct lengths) integers per rank at 1e9 samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bucketing import SHORTEN_ONE_IN, short_batch_at
from .cutting import oversized_error
from .offsets import offsets_from_counts
from .ordering import NEIGHBOURS, GroupShuffle, neighbour_shuffle
from .seeds import derive_seed

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
        mixed: with ``batch_size`` and a key, the batches are cut from the stream with its samples
            shuffled among neighbours (:meth:`members`), so that batches change from epoch to
            epoch even where every length is distinct; and the batches of each balancing group
            come in the keyed tree order of :mod:`~shardwise._core.tree_order`, not ascending.
        longest_first: with ``mixed`` and a key, the batch holding the longest sample is plan
            batch 0 (with ``batch_size`` the neighbour shuffle leaves the longest in place).

    Example:
        >>> plan = SortedBucketPlan(np.array([4, 2, 1]), np.array([2, 3, 1]), max_tokens=8)
        >>> len(plan), plan.spans(np.arange(len(plan)))[1].tolist()
        (2, [2, 4])
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
        mixed: bool = False,
        longest_first: bool = False,
    ) -> None:
        if (batch_size is None) == (max_tokens is None):
            raise ValueError("SortedBucketPlan needs exactly one of batch_size and max_tokens")
        self.run_lengths = np.asarray(run_lengths, dtype=np.int64)
        self.run_counts = np.asarray(run_counts, dtype=np.int64)
        self.run_starts = offsets_from_counts(self.run_counts)
        self.num_samples = int(self.run_starts[-1])
        self.key = key
        self.group = group
        self._fixed = batch_size
        self._mixed = mixed and key is not None
        self._longest_first = longest_first and self._mixed
        # neighbour shuffle (batch_size, mixed): windows of NEIGHBOURS batches, at a keyed offset
        self._window = NEIGHBOURS * batch_size if (self._mixed and batch_size is not None) else 0
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
            raise oversized_error(int(starts[run]), int(lengths[run]), budget)
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
        self._class_first = offsets_from_counts(count[order])
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
            self._short = short_batch_at(batches, self.key)
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
        groups_key = None if self.key is None else derive_seed(self.key, "groups")
        first = None
        if self._longest_first and self._num_batches:
            # the longest sample: the sorted stream's last position (batch_size) or its first (max_tokens)
            if self._fixed is not None:
                ranked, kept = self._fixed_ranks(np.asarray([self.num_samples - 1], dtype=np.int64))
                first = int(ranked[0]) if kept[0] else self._num_batches - 1  # dropped: the costliest kept
            else:
                first = int(self._token_ranks(np.zeros(1, dtype=np.int64))[0])
        self._groups = GroupShuffle(self._num_batches, self.group, groups_key, within=self._mixed, first=first)

    # -- what the sampler reads ---------------------------------------------------------------
    def __len__(self) -> int:
        return self._num_batches

    def spans(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, sizes)``: the stream span of the plan batches at ``positions`` (int64 arrays)."""
        ranked = self._groups.cost_rank(np.asarray(positions, dtype=np.int64))
        if self._fixed is not None:
            return self._fixed_spans(ranked)
        return self._token_spans(ranked)

    def positions_of(self, stream: np.ndarray) -> np.ndarray:
        """The plan position of the batch holding each stream position (-1: a dropped short batch).

        The inverse of :meth:`spans`, O(log runs) each: the batch of the stream position within
        its segment (or fixed-size cut), its place in the cost order, then the group shuffle undone.
        """
        stream = self._cut_positions(np.asarray(stream, dtype=np.int64))
        if self._fixed is not None:
            ranked, kept = self._fixed_ranks(stream)
        else:
            ranked, kept = self._token_ranks(stream), np.ones(stream.shape, dtype=bool)
        found: np.ndarray = np.where(kept, self._groups.plan_position(np.where(kept, ranked, 0)), -1)
        return found

    def _fixed_ranks(self, stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        size, short, short_size = self._fixed or 1, self._short, self._short_size
        past = stream >= short * size + short_size
        j = np.where(stream < short * size, stream // size, short)
        j = np.where(past, (stream + size - short_size) // size, j)
        if self._drop:
            return j - (j > short), j != short
        regular = j - (j > short)
        ranked = np.where(j == short, self._short_rank, regular + (regular >= self._short_rank))
        return ranked, np.ones(stream.shape, dtype=bool)

    def _token_ranks(self, stream: np.ndarray) -> np.ndarray:
        seg = np.searchsorted(self._seg_start, stream, side="right") - 1
        distance = stream - self._seg_start[seg]
        fit, unit, phase = self._seg_fit[seg], self._seg_unit[seg], self._seg_phase[seg]
        k = np.asarray(
            [_advance(d + 1, f, u, h) - 1 for d, f, u, h in zip(distance.tolist(), fit.tolist(), unit.tolist(),
                                                                phase.tolist(), strict=True)],
            dtype=np.int64,
        ).reshape(stream.shape)  # fmt: skip
        short = (unit > 0) & (k >= phase) & ((k - phase) % SHORTEN_CYCLE == 0)
        j = np.where(short, (k - phase) // SHORTEN_CYCLE, k - np.where(unit > 0, _reach_count(k, phase), 0))
        # the class of (segment, short): classes are sorted by cost, so look the pair up in a sorted table
        pairs = self._class_segment * 2 + self._class_short
        table = np.argsort(pairs, kind="stable")
        cls = table[np.searchsorted(pairs[table], seg * 2 + short)]
        ranked: np.ndarray = self._class_first[cls] + j
        return ranked

    # -- neighbour shuffle: which sorted position each cut position reads --------------------
    def members(self, cut: np.ndarray) -> np.ndarray:
        """The stream (sorted) position read at each position of the cut stream that :meth:`spans` covers.

        With ``mixed`` fixed-size batches, the sorted stream is cut into windows of
        ``NEIGHBOURS * batch_size`` positions (the first starting at a keyed offset) and each
        window's samples are shuffled by a keyed permutation: a batch takes neighbours in length,
        never the same ones two epochs in a row, whatever the lengths. The identity otherwise.
        """
        return self._neighbours(np.asarray(cut, dtype=np.int64), inverse=False)

    def _cut_positions(self, stream: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`members`."""
        return self._neighbours(stream, inverse=True)

    def _neighbours(self, positions: np.ndarray, *, inverse: bool) -> np.ndarray:
        n = self.num_samples - (1 if self._longest_first else 0)  # longest_first: the longest stays last
        if not self._window or self.key is None or n <= 0:
            return positions
        moved = neighbour_shuffle(np.minimum(positions, n - 1), n, self._window, self.key, inverse=inverse)
        found: np.ndarray = np.where(positions < n, moved, positions)
        return found

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
