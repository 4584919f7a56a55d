"""The layout of a stratum, the same every epoch: which slot goes to which row, which row to which batch.

Each stratum is packed on its own: best-fit decreasing into rows of ``max_len`` tokens on its
length histogram (:func:`~.rows.pack_histogram`), then the rows are dealt into batches so that
every batch costs about the same, in tokens or in attention cost (:class:`Balance`,
:func:`~.rows.deal_rows`). Strata form a chain: each hands its emptiest rows beyond a multiple of
``rows_per_batch`` on to the next (:data:`CARRIED`), so only the last stratum has a short batch.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .rows import deal_rows, pack_histogram, row_loads
from .strata import class_phases, stratum_histogram


class Balance(str, enum.Enum):
    """What ``PackedBatchSampler`` makes equal across the batches of a step."""

    TOKENS = "tokens"
    """Real tokens per batch (the cost of linear layers, and of attention when documents are short)."""
    ATTENTION = "attention"
    """The sum of squared document lengths per batch (the cost of per-document attention)."""


CARRIED = -2
"""``batch_of_row`` of a row handed on to the next stratum (``-1``: a row left out by ``drop_short``)."""

PLAN_VERSION = 3
"""The version of the packing plan (1: every stratum rounded its rows up to whole batches alone;
2: a stratum hands its emptiest rows beyond a multiple of ``rows_per_batch`` on to the next;
3: the batches of a balancing group come in the keyed tree order of ``_core.tree_order``, no
longer ascending or descending in cost). States and cached layouts of another version are refused."""


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
    packed: tuple[np.ndarray, int] | None = None,
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
        packed: :func:`pack_histogram` of ``histogram``, if computed already (by another process).

    Returns:
        The layout and ``(tokens, squares)`` of the rows handed on.
    """
    slot_rows, num_rows = pack_histogram(histogram, max_len) if packed is None else packed
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
    not_handed = np.ones(tokens.size, dtype=bool)
    not_handed[handed] = False
    dealt = np.flatnonzero(not_handed)
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


def stratum_layouts(
    counts: np.ndarray,
    num_strata: int,
    max_len: int,
    *,
    rows_per_batch: int | None,
    tokens_per_batch: int | None,
    balance: Balance,
    drop_short: bool = False,
    packed: Callable[[int], tuple[np.ndarray, int]] | None = None,
) -> Iterator[StratumLayout]:
    """Every stratum's layout, stratum by stratum (each stratum's batch count is fixed: the same every epoch).

    A chain: stratum ``s`` deals the rows stratum ``s - 1`` handed on with its own and hands its
    emptiest own rows beyond a multiple of ``rows_per_batch`` on to ``s + 1``
    (:func:`layout_stratum`), so the plan has ``ceil(rows / rows_per_batch)`` batches in all, not
    one partial batch per stratum. A generator: one stratum in memory at a time. ``packed(s)``,
    if given, is stratum ``s``'s :func:`pack_histogram` computed before (the packing of each
    stratum does not depend on the chain: a build may spread it over processes).
    """
    phases = class_phases(counts.size)
    carry: tuple[np.ndarray, np.ndarray] | None = None
    for stratum in range(num_strata):
        last = stratum == num_strata - 1
        layout, carry = layout_stratum(
            stratum_histogram(counts, num_strata, stratum, phases), max_len, rows_per_batch=rows_per_batch,
            tokens_per_batch=tokens_per_batch, balance=balance, drop_short=drop_short, carry_in=carry,
            hand_on=not last, packed=None if packed is None else packed(stratum),
        )  # fmt: skip
        yield layout
