"""The placements of :func:`~.rows.pack_histogram` compiled with numba (the optional ``fast`` extra).

numba is imported here only, lazily, on the first call that wants it; ``SHARDWISE_NUMBA`` chooses:
unset, empty or ``auto`` (numba if installed, once the process has packed :data:`AUTO_FROM` items
in plain Python, else plain Python), ``1`` (numba, an ImportError if
it is missing), ``0`` (plain Python always). :func:`placements` returns ``None`` when the plain
Python steps of :mod:`.rows` are to be used.

:func:`_place` makes exactly the placements of :class:`~.rows._Rooms`' loop, in the same order,
on preallocated arrays: the runs ``(first, size)`` of every room are a stack (a linked list of
nodes, the front on top); a room's rows are counted in ``count`` and the open rooms are found
by a scan of ``count`` within a block of 64 rooms, blocks skipped by their count of open rooms.
Every run put into a room is the run of one placement, so the nodes never outnumber the
placements: one capacity bounds both, made four times larger and run again when it is too small.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

ENV_NUMBA = "SHARDWISE_NUMBA"
_MODES = {"": "auto", "auto": "auto", "1": "on", "0": "off"}
AUTO_FROM = 1 << 22
"""Items a process packs in plain Python before ``auto`` turns to numba: about 1.2 s of packing, what
importing numba costs a process (and ~35 MB of private memory), so a small build never pays it
and a large one (1e8 items) loses about a second. The rows are the same either way."""
_python_items = [0]  # items this process packed in plain Python under ``auto``


def numba_mode() -> str:
    """``"auto"``, ``"on"`` or ``"off"``, from ``SHARDWISE_NUMBA`` (ValueError on any other value)."""
    value = os.environ.get(ENV_NUMBA, "").strip().lower()
    if value not in _MODES:
        raise ValueError(
            f"{ENV_NUMBA}={os.environ[ENV_NUMBA]!r}: accepted values are 0 (plain Python), "
            "1 (numba, required) and auto or unset (numba if installed)"
        )
    return _MODES[value]


@lru_cache(maxsize=1)
def _compiled() -> Callable[..., Any] | None:
    """The numba-compiled :func:`_place` (cached on disk), or None when numba is not installed."""
    try:
        import numba  # noqa: F401  (optional: the ``fast`` extra; :mod:`.jit` compiles with it)
    except ImportError:
        return None
    from . import jit  # the compiled kernels: loaded here only, once numba is known to import

    compiled: Callable[..., Any] = jit.place
    return compiled


def kernels(items: int) -> ModuleType | None:
    """The compiled kernels of an index build (:mod:`.jit`) for ``items`` items, or None (the numpy steps).

    ``SHARDWISE_NUMBA``: ``0`` None; ``1`` the kernels (ImportError without numba); ``auto`` the
    kernels from :data:`AUTO_FROM` items on (or once the process turned to numba), if installed.
    A build knows its size up front, so a large one is compiled from its first step.
    """
    mode = numba_mode()
    if mode == "off" or (mode == "auto" and items < AUTO_FROM and _python_items[0] < AUTO_FROM):
        return None
    if _compiled() is None:
        if mode == "on":
            raise ImportError(f"{ENV_NUMBA}=1 but numba is not installed: pip install 'shardwise[fast]'")
        return None
    from . import jit

    return jit


def numba_available() -> bool:
    """Whether numba can be imported (the compiled kernel is built on first use)."""
    return _compiled() is not None


def placements(
    histogram: np.ndarray, max_len: int, *, capacity: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None:
    """``(firsts, sizes, repeats, starts, num_rows)`` as :func:`~.rows.pack_histogram` makes them, or None (use Python).

    ``capacity``: the placements to allocate for at first (default ``4 * (max_len + 1) + 1024``).
    """
    mode = numba_mode()
    if mode == "off":
        return None
    if mode == "auto" and _python_items[0] < AUTO_FROM:  # not worth numba's import yet
        _python_items[0] += int(np.asarray(histogram).sum())
        return None
    kernel = _compiled()
    if kernel is None:
        if mode == "on":
            raise ImportError(f"{ENV_NUMBA}=1 but numba is not installed: pip install 'shardwise[fast]'")
        return None
    needs = np.ascontiguousarray(histogram, dtype=np.int64)
    if capacity is None:
        capacity = 4 * (max_len + 1) + 1024
    while True:
        firsts, sizes, repeats, starts, count, num_rows = kernel(needs, max_len, capacity)
        if count >= 0:
            return firsts[:count], sizes[:count], repeats[:count], starts, int(num_rows)
        capacity *= 4


def _place(  # noqa: PLR0912, PLR0915 (one loop, compiled whole: no helper calls)
    needs: np.ndarray, max_len: int, capacity: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The placements of best-fit decreasing on ``needs``; ``count`` -1: ``capacity`` was too small."""
    firsts = np.empty(capacity, dtype=np.int64)  # placement i: rows firsts[i] .. + sizes[i] - 1, repeats[i] items each
    sizes = np.empty(capacity, dtype=np.int64)
    repeats = np.empty(capacity, dtype=np.int64)
    starts = np.zeros(max_len + 2, dtype=np.int64)
    node_first = np.empty(capacity, dtype=np.int64)  # the runs of the rooms' stacks
    node_size = np.empty(capacity, dtype=np.int64)
    node_next = np.empty(capacity, dtype=np.int64)
    nodes = 0
    head = np.full(max_len + 1, -1, dtype=np.int64)  # room -> its front run (-1: none)
    count = np.zeros(max_len + 1, dtype=np.int64)  # room -> rows with that room
    blocks = (max_len >> 6) + 1
    block_open = np.zeros(blocks, dtype=np.int64)  # block of 64 rooms -> rooms with rows
    got_first = np.empty(capacity, dtype=np.int64)  # the runs one step took, in queue order
    got_size = np.empty(capacity, dtype=np.int64)
    placed = 0
    num_rows = 0
    for length in range(max_len, 0, -1):
        starts[length] = placed
        need = needs[length]
        while need > 0:
            # the smallest room >= length that holds rows
            room = -1
            block = length >> 6
            if block_open[block] > 0:
                end = min((block + 1) << 6, max_len + 1)
                for at in range(length, end):
                    if count[at] > 0:
                        room = at
                        break
            if room < 0:
                block += 1
                while block < blocks and block_open[block] == 0:
                    block += 1
                if block < blocks:
                    at = block << 6
                    while count[at] == 0:
                        at += 1
                    room = at
            if room < 0:  # no row has room: open rows, each filled with as many as fit
                per_row = max_len // length
                opened = (need + per_row - 1) // per_row
                rest = need - (opened - 1) * per_row
                if placed + 2 > capacity:
                    return firsts, sizes, repeats, starts, -1, num_rows
                for part in range(2):
                    if part == 0:
                        if opened <= 1:
                            continue
                        first, size, per, into = num_rows, opened - 1, per_row, max_len - per_row * length
                    else:
                        first, size, per, into = num_rows + opened - 1, 1, rest, max_len - rest * length
                    firsts[placed] = first
                    sizes[placed] = size
                    repeats[placed] = per
                    placed += 1
                    if count[into] == 0:
                        block_open[into >> 6] += 1
                    count[into] += size
                    node_first[nodes] = first
                    node_size[nodes] = size
                    node_next[nodes] = head[into]
                    head[into] = nodes
                    nodes += 1
                num_rows += opened
                break
            per_row = room // length
            full = min(count[room], need // per_row)
            for part in range(2):
                if part == 0:
                    take = full  # rows of this room that the run fills to the brim, one after another
                    per = per_row
                else:
                    if need == 0 or count[room] == 0:
                        break
                    take = 1  # the rest of the run: fewer than fill one row
                    per = need
                if take == 0:
                    continue
                # take: the first `take` rows of `room`, as runs in queue order
                count[room] -= take
                if count[room] == 0:
                    block_open[room >> 6] -= 1
                got = 0
                left = take
                while left > 0:
                    node = head[room]
                    first = node_first[node]
                    size = node_size[node]
                    if size > left:
                        node_first[node] = first + left
                        node_size[node] = size - left
                        got_first[got] = first
                        got_size[got] = left
                        got += 1
                        break
                    head[room] = node_next[node]
                    got_first[got] = first
                    got_size[got] = size
                    got += 1
                    left -= size
                if placed + got > capacity:
                    return firsts, sizes, repeats, starts, -1, num_rows
                for i in range(got):
                    firsts[placed] = got_first[i]
                    sizes[placed] = got_size[i]
                    repeats[placed] = per
                    placed += 1
                # put: the runs in front of the new room's queue, their order kept
                into = room - per * length
                if count[into] == 0:
                    block_open[into >> 6] += 1
                count[into] += take
                for i in range(got - 1, -1, -1):
                    node_first[nodes] = got_first[i]
                    node_size[nodes] = got_size[i]
                    node_next[nodes] = head[into]
                    head[into] = nodes
                    nodes += 1
                need -= take * per
    starts[0] = placed
    return firsts, sizes, repeats, starts, placed, num_rows
