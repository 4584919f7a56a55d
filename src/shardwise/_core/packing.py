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
  ``shardwise.index.permute_within``, O(1) memory), and so does the order in which strata are visited;
- each stratum is packed on its own: best-fit decreasing into rows of ``max_len`` tokens,
  computed on the length histogram (:func:`pack_histogram`: a few numpy operations per length
  class, not per item), then the rows are dealt into batches so that every batch of the stratum
  costs about the same, in tokens or in attention cost (the sum of squared lengths)
  (:func:`deal_rows`).

Because a stratum's histogram, hence its rows' *length pattern* and its number of batches, is a
function of the class sizes only, the number of batches of every epoch is known before the first
batch (:func:`stratum_batch_counts`, computed once), the same on every rank and in every epoch;
a position of the plan maps to (stratum slot, batch within the stratum) in O(S), and only one
stratum (O(window) memory) is ever materialised at a time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .errors import check_int
from .ordering import balanced_batch_order
from .permutation import mix64
from .rowpack import deal_rows, pack_histogram, row_loads
from .seeds import derive_seed, derive_words


class TooLong(str, enum.Enum):
    """What ``PackedBatchSampler`` does with a sample longer than ``max_len``."""

    SPLIT = "split"
    """Cut it into pieces of ``max_len`` tokens (the last piece holds the rest); each piece is packed alone."""
    SKIP = "skip"
    """Leave it out of every epoch; its index is in ``sampler.skipped``."""
    ERROR = "error"
    """Refuse at construction, naming the first such sample."""


class Balance(str, enum.Enum):
    """What ``PackedBatchSampler`` makes equal across the batches of a step."""

    TOKENS = "tokens"
    """Real tokens per batch (the cost of linear layers, and of attention when documents are short)."""
    ATTENTION = "attention"
    """The sum of squared document lengths per batch (the cost of per-document attention)."""


class PackedIndex(int):
    """A sample index that also says where its tokens go: ``row`` of the batch, tokens ``[start, stop)``.

    It *is* the sample index (an ``int``), so any dataset indexes with it as usual; a
    :class:`~shardwise.PackedDataset` reads ``row``, ``start`` and ``stop`` to hand
    :func:`~shardwise.pack_collate` the piece and its row. Picklable (DataLoader workers).
    """

    row: int
    start: int
    stop: int

    def __new__(cls, index: int, row: int = 0, start: int = 0, stop: int = -1) -> PackedIndex:
        index = check_int("index", index, minimum=0)
        row = check_int("row", row, minimum=0)
        start = check_int("start", start, minimum=0)
        stop = check_int("stop", stop, minimum=-1)
        self = super().__new__(cls, index)
        self.row, self.start, self.stop = row, start, stop
        return self

    @classmethod
    def trusted(cls, index: int, row: int, start: int, stop: int) -> PackedIndex:
        """Build from values the plan made (non-negative Python ints): no checks, ~4x faster per item."""
        self = int.__new__(cls, index)
        self.row, self.start, self.stop = row, start, stop
        return self

    def __getnewargs__(self) -> tuple[int, int, int, int]:  # type: ignore[override]
        return int(self), self.row, self.start, self.stop

    def __repr__(self) -> str:
        return f"PackedIndex({int(self)}, row={self.row}, start={self.start}, stop={self.stop})"


# -- the item index ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PieceIndex:
    """Every item (a sample, or a piece of one) grouped by length: class ``l`` is ``offsets[l]:offsets[l + 1]``.

    Attributes:
        sample: ``(m,)`` int64 sample index of each item, grouped by item length (ascending).
        start: ``(m,)`` int64 first token of each item in its sample (0 unless split), or
            ``None`` when no sample is split.
        offsets: ``(max_len + 2,)`` int64 class boundaries.
        skipped: int64 indices of samples left out (``too_long="skip"``).
    """

    sample: np.ndarray
    start: np.ndarray | None
    offsets: np.ndarray
    skipped: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """``(max_len + 1,)`` int64: items of each length."""
        return np.diff(self.offsets)

    @property
    def num_items(self) -> int:
        return int(self.offsets[-1])

    @property
    def max_len(self) -> int:
        return int(self.offsets.size - 2)


def group_by_key(keys: np.ndarray, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``keys`` grouped by key (stable) and the group offsets: a counting sort.

    Returns:
        ``order`` ``(keys.size,)`` int64 and ``offsets`` ``(num_keys + 1,)`` int64, group ``k``
        being ``order[offsets[k]:offsets[k + 1]]``. (The switch point to the shared node index.)
    """
    counts = np.bincount(keys, minlength=num_keys)
    offsets = np.zeros(num_keys + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    small = keys.astype(np.uint16) if num_keys <= 2**16 else keys
    order = np.argsort(small, kind="stable").astype(np.int64)  # a radix sort for 16-bit keys
    return order, offsets


def long_samples(lengths: np.ndarray, max_len: int, too_long: TooLong) -> np.ndarray:
    """Indices of samples longer than ``max_len``, or raise as ``too_long`` asks.

    Raises:
        ValueError: ``too_long="error"`` and a sample is longer than ``max_len``, or
            ``too_long="skip"`` and every sample is.
    """
    long = np.flatnonzero(lengths > max_len)
    if long.size and too_long is TooLong.ERROR:
        first = int(long[0])
        raise ValueError(
            f"lengths[{first}]={int(lengths[first])} is longer than max_len={max_len} ({long.size} "
            f"sample{'s are' if long.size > 1 else ' is'}); pass too_long='split' to cut such samples into "
            "pieces of max_len, too_long='skip' to leave them out, or a larger max_len"
        )
    if too_long is TooLong.SKIP and long.size == lengths.size:
        raise ValueError(f"every sample is longer than max_len={max_len}, so too_long='skip' would leave nothing")
    return long


def piece_index(lengths: np.ndarray, max_len: int, too_long: TooLong) -> PieceIndex:
    """Group every item by length (see the module docstring); lengths over ``max_len`` per ``too_long``.

    Raises:
        ValueError: ``too_long="error"`` and a sample is longer than ``max_len``, or nothing is left.
    """
    lengths = np.asarray(lengths)
    long = long_samples(lengths, max_len, too_long)
    skipped = np.empty(0, dtype=np.int64)
    if not long.size:
        order, offsets = group_by_key(lengths.astype(np.int64, copy=False), max_len + 1)
        return PieceIndex(order, None, offsets, skipped)
    if too_long is TooLong.SKIP:
        keep = np.flatnonzero(lengths <= max_len)
        order, offsets = group_by_key(lengths[keep].astype(np.int64), max_len + 1)
        return PieceIndex(keep[order], None, offsets, long.astype(np.int64))
    # split: every long sample becomes its full pieces plus (if any) the rest.
    long_lengths = lengths[long].astype(np.int64)
    pieces: np.ndarray = -(-long_lengths // max_len)  # (k,) pieces per long sample
    owner = np.repeat(long, pieces)
    firsts = np.cumsum(pieces) - pieces
    piece = np.arange(int(pieces.sum()), dtype=np.int64) - np.repeat(firsts, pieces)
    starts = piece * max_len
    piece_len = np.minimum(np.repeat(long_lengths, pieces) - starts, max_len)
    short = np.flatnonzero(lengths <= max_len)
    sample = np.concatenate([short.astype(np.int64), owner])
    start = np.concatenate([np.zeros(short.size, dtype=np.int64), starts])
    keys = np.concatenate([lengths[short].astype(np.int64), piece_len])
    order, offsets = group_by_key(keys, max_len + 1)
    return PieceIndex(sample[order], start[order], offsets, skipped)


# -- strata ---------------------------------------------------------------------------------------
def class_phases(num_classes: int) -> np.ndarray:
    """``(num_classes,)`` fixed phases, so that classes of one or two items spread over the strata."""
    return mix64(np.arange(1, num_classes + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))


def stratum_bounds(counts: np.ndarray, num_strata: int, stratum: int, phases: np.ndarray) -> np.ndarray:
    """``(2, classes)`` int64: the class positions ``[lo, hi)`` that ``stratum`` takes from each class.

    Position boundaries are ``floor((count * s + phase) / S)``: every stratum takes ``floor`` or
    ``ceil`` of ``count / S`` items of each class, and over all strata each item exactly once.
    """
    counts = counts.astype(np.int64)
    phase = (phases % np.uint64(num_strata)).astype(np.int64)
    if num_strata == 1:
        return np.stack([np.zeros_like(counts), counts])
    # (count * s + phase) fits int64 for count < 2**62 / S; use Python ints where it would not.
    bounds = np.empty((2, counts.size), dtype=np.int64)
    for row, s in enumerate((stratum, stratum + 1)):
        if int(counts.max(initial=0)) * (s + 1) < 2**62:
            bounds[row] = (counts * s + phase) // num_strata - phase // num_strata
        else:  # pragma: no cover - beyond 2**62 / S items of one length
            bounds[row] = [(int(c) * s + int(p)) // num_strata for c, p in zip(counts, phase, strict=True)]
    return bounds


def stratum_histogram(counts: np.ndarray, num_strata: int, stratum: int, phases: np.ndarray) -> np.ndarray:
    """``(classes,)`` int64 items of each length in ``stratum`` (see :func:`stratum_bounds`)."""
    lo, hi = stratum_bounds(counts, num_strata, stratum, phases)
    histogram: np.ndarray = hi - lo
    return histogram


def stratum_slots(
    counts: np.ndarray, num_strata: int, stratum: int, phases: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The class and class-local position of every item slot of ``stratum``, by class ascending.

    Returns:
        ``classes`` and ``ranks``, ``(k,)`` int64 each: slot ``i`` is position ``ranks[i]`` of
        length class ``classes[i]`` (before the epoch's permutation within the class; a caller
        maps it through its keyed per-class permutation to an item). Slots are listed in the
        order :func:`pack_histogram` assigns rows to.
    """
    lo, hi = stratum_bounds(counts, num_strata, stratum, phases)
    taken = hi - lo
    classes = np.flatnonzero(taken)
    per = taken[classes]
    firsts = np.cumsum(per) - per
    # ranks: (k,) class-local positions lo..hi-1 of every class, class by class.
    ranks = np.repeat(lo[classes] - firsts, per) + np.arange(int(per.sum()), dtype=np.int64)
    return np.repeat(classes, per).astype(np.int64), ranks


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


def _sorted_by(major: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Positions sorted by ``(major, noise)`` (non-negative ints, uint64 words): one stable sort of packed keys.

    ``major`` takes the high bits it needs, ``noise`` the rest of a 64-bit key (ties of the
    truncated noise keep position order: still one order on every platform).
    """
    if major.size == 0:
        return np.empty(0, dtype=np.int64)
    bits = max(int(major.max()).bit_length(), 1)
    keys = (major.astype(np.uint64) << np.uint64(64 - bits)) | (noise >> np.uint64(bits))
    order: np.ndarray = np.argsort(keys, kind="stable").astype(np.int64)
    return order


def _offsets(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


CARRIED = -2
"""``batch_of_row`` of a row handed on to the next stratum (``-1``: a row left out by ``drop_short``)."""

PLAN_VERSION = 2
"""The version of the packing plan (1: every stratum rounded its rows up to whole batches alone;
2: a stratum hands its emptiest rows beyond a multiple of ``rows_per_batch`` on to the next).
States and cached layouts of another version are refused."""


@dataclass(frozen=True, eq=False)
class StratumLayout:
    """The epoch-independent shape of one stratum: which slot goes to which row, which row to which batch.

    Rows ``0 .. own - 1`` are the stratum's own (its slots' rows); the last ``carried`` rows are
    the rows the previous stratum (by index) handed on, already packed there
    (:func:`carried_slots` finds their slots).

    Attributes:
        slot_rows: ``(k,)`` int64 row of each item slot (slots by class ascending, as
            :func:`stratum_slots` lists them).
        batch_of_row: ``(rows,)`` int64 batch of each row (-1: left out by ``drop_short``;
            :data:`CARRIED`: handed on to the next stratum).
        batch_keys: ``(batches,)`` int64 the order of the batches by cost: batches short of a full
            batch by the most half rows first (so that the few light batches of a stratum make
            whole steps together instead of each slowing a step of full ones down), then by
            balance cost (tokens, or squared lengths) ascending.
        carried: rows at the end of ``batch_of_row`` that came from the previous stratum.
    """

    slot_rows: np.ndarray
    batch_of_row: np.ndarray
    batch_keys: np.ndarray
    carried: int = 0

    @property
    def num_batches(self) -> int:
        return int(self.batch_keys.size)

    @property
    def own_rows(self) -> int:
        return int(self.batch_of_row.size - self.carried)


def layout_stratum(
    histogram: np.ndarray,
    max_len: int,
    *,
    rows_per_batch: int | None,
    tokens_per_batch: int | None,
    balance: Balance,
    drop_short: bool = False,
    carry_in: tuple[np.ndarray, np.ndarray] | None = None,
    hand_on: bool = False,
) -> tuple[StratumLayout, tuple[np.ndarray, np.ndarray]]:
    """Pack a stratum's histogram into rows (:func:`pack_histogram`), deal them and ``carry_in``'s into batches.

    With ``rows_per_batch`` and ``hand_on``, the stratum's emptiest own rows beyond a multiple of
    ``rows_per_batch`` (counting the rows carried in) are not dealt but handed on (marked
    :data:`CARRIED`): then every batch of the stratum is full, and only the last stratum of the
    chain rounds up (or, with ``drop_short``, drops). Rows are never repacked, so the rows
    handed on are packed exactly as here. (A stratum with fewer own rows than it should hand
    on hands on all of them and deals the rest as usual.)

    Args:
        carry_in: ``(tokens, squares)`` per row handed on by the previous stratum.
        hand_on: this stratum may hand rows on (every stratum but the last).

    Returns:
        The layout and ``(tokens, squares)`` of the rows handed on.
    """
    slot_rows, num_rows = pack_histogram(histogram, max_len)
    slot_lengths = np.repeat(np.arange(histogram.size, dtype=np.int64), histogram)
    own_tokens, own_squares = row_loads(slot_rows, slot_lengths, num_rows)
    in_tokens, in_squares = carry_in if carry_in is not None else (np.empty(0, np.int64),) * 2
    tokens = np.concatenate([own_tokens, in_tokens])
    squares = np.concatenate([own_squares, in_squares])
    costs = squares if balance is Balance.ATTENTION else tokens
    handed = np.empty(0, dtype=np.int64)
    if hand_on and rows_per_batch is not None:
        extra = min(tokens.size % rows_per_batch, num_rows)
        handed = np.sort(np.argsort(own_tokens, kind="stable")[:extra])
    dealt = np.setdiff1d(np.arange(tokens.size, dtype=np.int64), handed)
    batch_of_row = np.full(tokens.size, CARRIED, dtype=np.int64)
    batch_of_row[dealt], num_batches = deal_rows(
        tokens[dealt], costs[dealt], rows_per_batch=rows_per_batch, tokens_per_batch=tokens_per_batch,
        drop_short=drop_short,
    )  # fmt: skip
    kept = batch_of_row >= 0
    batch_costs = np.bincount(batch_of_row[kept], weights=costs[kept], minlength=num_batches)
    batch_tokens = np.bincount(batch_of_row[kept], weights=tokens[kept], minlength=num_batches).astype(np.int64)
    capacity = rows_per_batch * max_len if rows_per_batch is not None else int(tokens_per_batch or 0)
    short = (capacity - batch_tokens) // max(1, max_len // 2)  # half rows short of a full batch
    batch_keys = np.empty(num_batches, dtype=np.int64)
    batch_keys[np.lexsort((np.rint(batch_costs), -short))] = np.arange(num_batches, dtype=np.int64)
    layout = StratumLayout(slot_rows, batch_of_row, batch_keys, int(in_tokens.size))
    return layout, (own_tokens[handed], own_squares[handed])


def carried_slots(
    previous: StratumLayout, classes: np.ndarray, ranks: np.ndarray, own_rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The slots of the rows ``previous`` handed on, as rows of the next stratum (after its ``own_rows``).

    Args:
        previous: the previous stratum's layout; ``classes``, ``ranks``: its slots
            (:func:`stratum_slots`).
        own_rows: the next stratum's own rows (its carried rows are numbered from there, in
            the order of their row in ``previous``).

    Returns:
        ``classes``, ``ranks`` and ``rows`` ``(j,)`` int64 of the handed-on slots.
    """
    handed = previous.batch_of_row[: previous.own_rows] == CARRIED
    renumber = np.cumsum(handed) - 1 + own_rows
    picked = np.flatnonzero(handed[previous.slot_rows])
    return classes[picked], ranks[picked], renumber[previous.slot_rows[picked]].astype(np.int64)


def order_stratum(
    items: np.ndarray, lengths: np.ndarray, layout: StratumLayout, *, group: int, key: int | None
) -> StratumPlan:
    """Lay one epoch's items (one per slot, with their ``lengths``) out as the stratum's batches, in plan order.

    Batches are ordered by :func:`~shardwise._core.ordering.balanced_batch_order` over their
    ``batch_keys``: sorted by cost and shuffled in groups of ``group``, so that the W batches of a
    global step (W dividing ``group``) cost about the same. ``key`` also shuffles rows within a
    batch and items within a row; ``None`` keeps cost order and layout order.
    """
    slot_rows, batch_of_row = layout.slot_rows, layout.batch_of_row
    num_rows, num_batches = batch_of_row.size, layout.num_batches
    order = balanced_batch_order(layout.batch_keys, group, None if key is None else derive_seed(key, "batches"))
    batch_rank = np.empty(num_batches, dtype=np.int64)
    batch_rank[order] = np.arange(num_batches, dtype=np.int64)
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
    row_order = kept[_sorted_by(batch_rank[batch_of_row[kept]], row_noise[kept])]
    row_position[row_order] = np.arange(row_order.size, dtype=np.int64)
    slot_kept = np.flatnonzero(row_position[slot_rows] >= 0)
    slot_order = slot_kept[_sorted_by(row_position[slot_rows[slot_kept]], slot_noise[slot_kept])]
    rows_per = np.bincount(batch_rank[batch_of_row[kept]], minlength=num_batches)
    items_per = np.bincount(row_position[slot_rows[slot_kept]], minlength=row_order.size)
    return StratumPlan(items[slot_order], _offsets(items_per), _offsets(rows_per), lengths[slot_order])


def stratum_layouts(
    counts: np.ndarray,
    num_strata: int,
    max_len: int,
    *,
    rows_per_batch: int | None,
    tokens_per_batch: int | None,
    balance: Balance,
    drop_short: bool = False,
) -> Iterator[StratumLayout]:
    """Every stratum's layout, stratum by stratum (each stratum's batch count is fixed: the same every epoch).

    A chain: stratum ``s`` deals the rows stratum ``s - 1`` handed on with its own and hands its
    emptiest own rows beyond a multiple of ``rows_per_batch`` on to ``s + 1``
    (:func:`layout_stratum`), so the plan has ``ceil(rows / rows_per_batch)`` batches in all, not
    one partial batch per stratum. A generator: one stratum in memory at a time.
    """
    phases = class_phases(counts.size)
    carry: tuple[np.ndarray, np.ndarray] | None = None
    for stratum in range(num_strata):
        last = stratum == num_strata - 1
        layout, carry = layout_stratum(
            stratum_histogram(counts, num_strata, stratum, phases), max_len, rows_per_batch=rows_per_batch,
            tokens_per_batch=tokens_per_batch, balance=balance, drop_short=drop_short, carry_in=carry,
            hand_on=not last,
        )  # fmt: skip
        yield layout


def shuffle_within_classes(offsets: np.ndarray, key: int) -> np.ndarray:
    """``(m,)`` int64: a keyed random order of every class's items, materialised (for small indexes).

    Item at class-position ``p`` of class ``c`` is ``result[offsets[c] + p]``: the items of each
    class sorted by raw PCG64 words (what large indexes do per item with a Feistel permutation).
    """
    total = int(offsets[-1])
    classes = np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(offsets))
    return _sorted_by(classes, np.random.PCG64(key).random_raw(total))


def class_shuffle_key(seed: int, epoch: int) -> int:
    """The key of one epoch's permutations within length classes."""
    return derive_seed(seed, epoch, "pack-classes")


def stratum_order_key(seed: int, epoch: int) -> int:
    """The key of one epoch's order of strata."""
    return derive_seed(seed, epoch, "pack-strata")
