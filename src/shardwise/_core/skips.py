"""The skip ledger: ranges of plan positions that are never trained, removed from the plan before dealing.

A ledger holds, per epoch, sorted disjoint ranges ``[first, stop)`` of positions of that epoch's
global plan (the plan every rank shares, whatever the world size). Honouring it means dealing a
**compacted** plan: position ``q`` of the compacted plan is the ``q``-th position that is not
skipped. Every rank then takes the same number of units of the compacted plan (the usual
``Even`` rule), nothing skipped is ever trained, everything else exactly once, and ``consumed``
counts compacted positions: the state stays world-size independent.

Cost: O(ranges) integers in the state (three a range) and O(log ranges) per position mapped.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .errors import MalformedStateError, check_int

SKIP = "skip"
"""The state key of the ledger: ``[[epoch, first, stop], ...]`` (absent when nothing is skipped)."""


class SkipLedger:
    """Ranges of plan positions never trained, per epoch; see the module docstring.

    Example:
        >>> ledger = SkipLedger().add(0, 2, 4)
        >>> ledger.to_plan(0, np.arange(4), total=8).tolist()  # compacted -> plan positions
        [0, 1, 4, 5]
        >>> ledger.size(0, 8), ledger.from_plan(0, 5), ledger.from_plan(0, 3)
        (6, 3, None)
    """

    __slots__ = ("_ranges",)

    def __init__(self, ranges: dict[int, np.ndarray] | None = None) -> None:
        self._ranges: dict[int, np.ndarray] = ranges or {}  # epoch -> (k, 2) int64, sorted, disjoint

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __len__(self) -> int:
        return sum(len(r) for r in self._ranges.values())

    def add(self, epoch: int, first: int, stop: int) -> SkipLedger:
        """A ledger with ``[first, stop)`` of ``epoch`` skipped too (merged with what overlaps or touches it)."""
        first = check_int("first", first, minimum=0)
        return self.add_many(epoch, np.asarray([[first, check_int("stop", stop, minimum=first)]], dtype=np.int64))

    def add_many(self, epoch: int, ranges: np.ndarray) -> SkipLedger:
        """A ledger with every ``[first, stop)`` row of ``ranges`` of ``epoch`` skipped too, in O(k log k)."""
        epoch = check_int("epoch", epoch, minimum=0)
        merged = _merged(np.vstack([self.ranges(epoch), np.asarray(ranges, dtype=np.int64).reshape(-1, 2)]))
        out = dict(self._ranges)
        if merged.size:
            out[epoch] = merged
        return SkipLedger(out)

    def ranges(self, epoch: int) -> np.ndarray:
        """The skipped ranges of ``epoch``, ``(k, 2)`` int64."""
        return self._ranges.get(epoch, np.empty((0, 2), dtype=np.int64))

    def _clipped(self, epoch: int, total: int) -> np.ndarray:
        ranges = self.ranges(epoch)
        if ranges.size and ranges[-1, 1] > total:
            ranges = np.minimum(ranges, total)
            ranges = ranges[ranges[:, 1] > ranges[:, 0]]
        return ranges

    def size(self, epoch: int, total: int) -> int:
        """Positions of a plan of ``total`` left to train in ``epoch``."""
        ranges = self._clipped(epoch, total)
        return total - int((ranges[:, 1] - ranges[:, 0]).sum())

    def to_plan(self, epoch: int, positions: np.ndarray, total: int) -> np.ndarray:
        """Plan positions of compacted ``positions`` (each in ``[0, size)``), vectorised, O(log ranges) each."""
        ranges = self._clipped(epoch, total)
        if not ranges.size:
            return positions
        lengths = ranges[:, 1] - ranges[:, 0]
        before = np.concatenate([[0], np.cumsum(lengths)])  # skipped positions before range i
        keys = ranges[:, 0] - before[:-1]  # compacted position at which range i is jumped over
        mapped: np.ndarray = positions + before[np.searchsorted(keys, positions, side="right")]
        return mapped

    def from_plan(self, epoch: int, position: int) -> int | None:
        """The compacted position of plan ``position``, or ``None`` if it is skipped."""
        ranges = self.ranges(epoch)
        if not ranges.size:
            return position
        i = int(np.searchsorted(ranges[:, 0], position, side="right")) - 1
        if i >= 0 and position < ranges[i, 1]:
            return None
        lengths = ranges[: i + 1, 1] - ranges[: i + 1, 0]
        return position - int(lengths.sum())

    def to_state(self) -> list[list[int]]:
        """``[[epoch, first, stop], ...]``: plain ints, for ``torch.save`` and JSON."""
        return [[epoch, int(a), int(b)] for epoch in sorted(self._ranges) for a, b in self._ranges[epoch].tolist()]

    @classmethod
    def from_state(cls, value: object) -> SkipLedger:
        """Read ``to_state()`` output.

        Raises:
            MalformedStateError: not a list of ``[epoch, first, stop]`` with ``0 <= first <= stop``.
        """
        if not isinstance(value, Iterable) or isinstance(value, (str, bytes)):
            raise MalformedStateError(f"state['skip'] should be a list of [epoch, first, stop], but got {value!r}")
        try:
            table = np.asarray(list(value))
            if table.dtype.kind != "i" or table.ndim != 2 or table.shape[1] != 3 or (table < 0).any():
                # Not plain non-negative int rows: check entry by entry, for a message naming the culprit.
                rows = np.asarray(list(value), dtype=object).reshape(-1, 3)
                table = np.asarray(
                    [[check_int("state['skip'] entry", x, minimum=0) for x in row] for row in rows.tolist()],
                    dtype=np.int64,
                ).reshape(-1, 3)
        except (TypeError, ValueError) as error:
            raise MalformedStateError(
                f"state['skip'] should hold [epoch, first, stop] rows of non-negative ints: {error}"
            ) from None
        ints = table.tolist()
        bad = np.flatnonzero(table[:, 2] < table[:, 1])
        if bad.size:
            raise MalformedStateError(
                f"state['skip'] should hold [epoch, first, stop] with first <= stop, but got {ints[bad[0]]}"
            )
        ledger = cls()
        for epoch in np.unique(table[:, 0]).tolist():
            ledger = ledger.add_many(epoch, table[table[:, 0] == epoch, 1:])
        return ledger


def _merged(ranges: np.ndarray) -> np.ndarray:
    """Sorted, disjoint ranges covering the union of ``ranges`` (``(k, 2)``), vectorised: O(k log k)."""
    ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    ranges = ranges[ranges[:, 1] > ranges[:, 0]]
    if not ranges.size:
        return ranges
    ranges = ranges[np.argsort(ranges[:, 0], kind="stable")]
    reach = np.maximum.accumulate(ranges[:, 1])
    opens = np.ones(len(ranges), dtype=bool)
    opens[1:] = ranges[1:, 0] > reach[:-1]  # a range starts a new group past everything before it
    starts = np.flatnonzero(opens)
    return np.stack([ranges[starts, 0], np.maximum.reduceat(ranges[:, 1], starts)], axis=1)


SKIP_IDS = "skip_ids"
"""The state key of the skipped sample ids: ``[[epoch, position, first, stop], ...]`` (absent when none)."""


class IdSkips:
    """Ranges of sample ids never trained from a point on: ``[first, stop)`` from plan ``position`` of ``epoch``.

    An entry applies to every epoch after ``epoch``, and to ``epoch`` itself at plan positions from
    ``position`` (what was trained before it was added stays trained). A sampler turns the ids into
    the plan positions that hold them, epoch by epoch, and skips those like a :class:`SkipLedger`
    range (``samplers.skipping``). Cost: four ints a range in the state.

    Example:
        >>> IdSkips().add(1, 40, 7, 9).applying(2).tolist()
        [[0, 7, 9]]
    """

    __slots__ = ("_rows",)

    def __init__(self, rows: np.ndarray | None = None) -> None:
        self._rows = np.empty((0, 4), dtype=np.int64) if rows is None else rows  # (k, 4): epoch, position, first, stop

    def __bool__(self) -> bool:
        return bool(len(self._rows))

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, epoch: int, position: int, first: int, stop: int) -> IdSkips:
        """These skips and ids ``[first, stop)`` from plan ``position`` of ``epoch`` on."""
        first = check_int("first", first, minimum=0)
        return self.add_many(epoch, position, np.asarray([[first, check_int("stop", stop, minimum=first + 1)]]))

    def add_many(self, epoch: int, position: int, ranges: np.ndarray) -> IdSkips:
        """These skips and every ``[first, stop)`` row of ``ranges`` (``(k, 2)``, ``first < stop``), in O(k)."""
        ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        head = [check_int("epoch", epoch, minimum=0), check_int("position", position, minimum=0)]
        rows = np.concatenate([np.tile(np.asarray(head, dtype=np.int64), (len(ranges), 1)), ranges], axis=1)
        return IdSkips(np.vstack([self._rows, rows]))

    def applying(self, epoch: int) -> np.ndarray:
        """``(k, 3)`` rows ``[from position, first, stop]`` in force in ``epoch`` (from 0 for later epochs)."""
        rows = self._rows[self._rows[:, 0] <= epoch]
        out: np.ndarray = np.stack([np.where(rows[:, 0] == epoch, rows[:, 1], 0), rows[:, 2], rows[:, 3]], axis=1)
        return out

    @staticmethod
    def holding(rows: np.ndarray, positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Whether each plan position, holding the id beside it, is skipped by ``rows`` (``applying``'s).

        Vectorised: O((n + k) log k) for ``n`` positions and ``k`` rows.

        Example:
            >>> rows = IdSkips().add(0, 3, 7, 9).applying(0)
            >>> IdSkips.holding(rows, np.arange(5), np.asarray([7, 8, 9, 7, 8])).tolist()
            [False, False, False, True, True]
        """
        held = np.zeros(len(positions), dtype=bool)
        for floor in np.unique(rows[:, 0]).tolist():  # usually one distinct floor
            ranges = _merged(rows[rows[:, 0] == floor, 1:])
            slot = np.searchsorted(ranges[:, 0], ids, side="right") - 1
            inside = (slot >= 0) & (ids < ranges[np.maximum(slot, 0), 1])
            held |= inside & (positions >= floor)
        return held

    def to_state(self) -> list[list[int]]:
        """``[[epoch, position, first, stop], ...]``: plain ints, for ``torch.save`` and JSON."""
        return [[int(x) for x in row] for row in self._rows.tolist()]

    @classmethod
    def from_state(cls, value: object) -> IdSkips:
        """Read ``to_state()`` output (an absent key, in a state saved before ids could be skipped: none).

        Raises:
            MalformedStateError: not a list of ``[epoch, position, first, stop]`` with ``first < stop``.
        """
        if not isinstance(value, Iterable) or isinstance(value, (str, bytes)):
            raise MalformedStateError(
                f"state['skip_ids'] should be a list of [epoch, position, first, stop], but got {value!r}"
            )
        try:
            table = np.asarray(
                [[check_int("state['skip_ids'] entry", x, minimum=0) for x in row] for row in value], dtype=np.int64
            ).reshape(-1, 4)
        except (TypeError, ValueError) as error:
            raise MalformedStateError(
                f"state['skip_ids'] should hold [epoch, position, first, stop] rows of non-negative ints: {error}"
            ) from None
        bad = np.flatnonzero(table[:, 3] <= table[:, 2])
        if bad.size:
            raise MalformedStateError(
                f"state['skip_ids'] should hold [epoch, position, first, stop] with first < stop, but got "
                f"{table[bad[0]].tolist()}"
            )
        return cls(table)
