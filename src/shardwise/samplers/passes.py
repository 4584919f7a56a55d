"""One rank's live pass over an epoch: where it started, what it handed out, what was trained.

``state_dict`` reads the position back from it (see ``shardwise.samplers.base``): the units are
handed out through one list iterator per chunk, and what is left of the current one is its
``__length_hint__``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._core.plan import Even, pass_end, rank_positions
from .delivery import LoaderDriver

UnitSource = Callable[[np.ndarray], list[Any]]
"""Turns an array of plan positions (each in ``[0, total)``) into the units at those positions.

A list with a ``pieces()`` method is handed out one piece (a list) at a time, each pulled as the
last ends (``LocalitySampler``: its source hears where the reading is at each piece)."""


class LivePass:
    """One rank's live pass over an epoch: where it started, what it handed out, what was trained."""

    __slots__ = ("count", "current", "current_len", "done_chunks", "driver", "even", "start", "stopped", "total",
                 "world_size")  # fmt: skip

    def __init__(self, start: int, count: int, total: int, world_size: int, even: Even = Even.PAD) -> None:
        self.start, self.count, self.total, self.world_size, self.even = start, count, total, world_size, even
        self.done_chunks = 0
        self.current: Iterator[Any] | None = None
        self.current_len = 0
        self.driver: LoaderDriver | None = None
        self.stopped: str | None = None  # why the pass's iterator raises at its next unit (see ``stop``)

    def stop(self, reason: str) -> None:
        """Make the pass's iterator raise ``RuntimeError(reason)`` at its next unit instead of carrying on.

        The chunk being handed out is cut short (a chunk iterator supports ``__setstate__(index)``,
        as list iterators do); the pass raises when the next chunk is asked for (:meth:`check`).
        """
        self.stopped = reason
        current = self.current
        if current is not None:
            current.__setstate__(self.current_len)  # type: ignore[attr-defined]

    def check(self) -> None:
        """Raise if the pass was stopped (see :meth:`stop`)."""
        if self.stopped is not None:
            raise RuntimeError(self.stopped)

    def local_done(self) -> int:
        """Units this rank has handed out in this pass."""
        if self.current is None:
            return self.done_chunks
        remaining: int = self.current.__length_hint__()  # type: ignore[attr-defined]
        return self.done_chunks + self.current_len - remaining

    def trained(self) -> int:
        """Units of this pass that reached the training loop (see ``delivery``): at most ``local_done``."""
        handed = self.local_done()
        driver = self.driver
        return handed if driver is None else driver.trained(handed, self.count)

    def consumed_at(self, done: int) -> int:
        """The global ``consumed`` once every rank has gone ``done`` units into this pass (``done < count``)."""
        return self.start + done * self.world_size

    def chunks(self, source: UnitSource, rank: int, first_size: int, size: int, period: int | None,
               known: Callable[[np.ndarray], np.ndarray] | None) -> Iterator[Iterator[Any]]:  # fmt: skip
        """The pass's units for ``rank``, chunk by chunk: ``first_size`` units, doubling up to ``size``.

        Only chunk boundaries depend on the chunk sizes, never the units (a source is a pure function
        of the positions), so small first chunks just make the first units cheaper. ``known`` cuts a
        chunk at the positions a plan written at run time knows yet (computed when the chunk is pulled,
        after the loop's last update); ``period``: where padded positions wrap (``_core.plan.wrap``).
        """
        first, step = 0, first_size
        while first < self.count:
            stop = min(first + step, self.count)
            positions = rank_positions(self.start, rank, self.world_size, first, stop, self.total, period)
            if known is not None:
                positions = known(positions)
                stop = first + len(positions)
            units = source(positions)
            if len(units) != stop - first:
                raise RuntimeError(f"the plan produced {len(units)} units for {stop - first} positions")
            pieces = getattr(units, "pieces", None)  # a chunk handed out in pieces, each pulled as the last ends
            for piece in (units,) if pieces is None else pieces():
                self.done_chunks += self.current_len
                self.current, self.current_len = iter(piece), len(piece)
                yield self.current
            first, step = stop, min(2 * step, size)

    def consumed_after(self, done: int) -> int:
        """The global ``consumed`` once every rank has gone ``done`` units into this pass: :meth:`end` when complete."""
        return self.end() if done >= self.count else self.consumed_at(done)

    def end(self) -> int:
        """The global ``consumed`` once the pass is complete: ``total`` or past it (padding)."""
        return pass_end(self.total, self.start, self.world_size, self.even)
