"""The compiled path of packing (numba, the optional ``fast`` extra): when it is taken, and its kernels' loader.

numba is imported here only, lazily, on the first call that wants it (with it :mod:`.jit`, the
modules of kernels, which import numba at their top); ``SHARDWISE_NUMBA`` chooses: unset, empty or
``auto`` (numba if installed, for a build of :data:`AUTO_FROM` items or more, or once the process
has packed that many items in plain Python, else plain Python), ``1`` (numba, an ImportError if
it is missing), ``0`` (plain Python and numpy always). :func:`placements` returns ``None`` when
the plain Python steps of :mod:`.rows` are to be used; :func:`kernels` gives an index build the
compiled kernels (:mod:`.jit`, run by :mod:`.fast_build`) or ``None`` (the numpy build).

:func:`.jit.place` makes exactly the placements of :class:`~.rows._Rooms`' loop, in the same order,
on preallocated arrays: the runs ``(first, size)`` of every room are a stack (a linked list of
nodes, the front on top); a room's rows are counted in ``count``, and the open rooms are bits of
64-bit words (a second level of bits marks the words that are not empty), so the least open room
from a length on is found by a few word operations (the lowest set bit by a de Bruijn multiply).
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
    """The numba-compiled :func:`.jit.place` (cached on disk), or None when numba is not installed."""
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
    if _loaded(mode) is None:
        return None
    from . import jit

    return jit


def _loaded(mode: str) -> Callable[..., Any] | None:
    """The compiled placements kernel, or None without numba (an ImportError naming the extra when ``mode`` is on)."""
    kernel = _compiled()
    if kernel is None and mode == "on":
        raise ImportError(f"{ENV_NUMBA}=1 but numba is not installed: pip install 'shardwise[fast]'")
    return kernel


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
    kernel = _loaded(mode)
    if kernel is None:
        return None
    needs = np.ascontiguousarray(histogram, dtype=np.int64)
    if capacity is None:
        capacity = 4 * (max_len + 1) + 1024
    while True:
        firsts, sizes, repeats, starts, count, num_rows = kernel(needs, max_len, capacity)
        if count >= 0:
            return firsts[:count], sizes[:count], repeats[:count], starts, int(num_rows)
        capacity *= 4
