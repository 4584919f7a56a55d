"""The O(n) tables a sampler needs, built once per input and node, memory-mapped by every process.

A sampler describes its table as a *builder*: a function that asks an allocator for named arrays
and fills them (chunk by chunk, so that building needs no O(n) private memory beyond the output).
:func:`shared_arrays` runs it through the node's index cache (``shardwise.index.build_or_open``:
the arrays become ``.npy`` files that every rank and DataLoader worker maps read-only), or, for
inputs below ``SHARED_MIN`` entries, in private memory (a few MiB at most: a cache entry would
cost more than it saves). Both paths give the same arrays, so the same plan.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .cache import DEFAULT_TIMEOUT, CacheDir, build_or_open
from .keys import key_of

SHARED_MIN = 1 << 16
"""Inputs with fewer entries build their table in private memory, without the cache."""

Allocate = Callable[[str, int, Any], np.ndarray]
"""``allocate(name, length, dtype)`` -> a writable 1-D array the builder fills."""

Builder = Callable[[Allocate], None]


def input_key(values: object) -> str:
    """The cache key part of one input: O(1) for a memmap (file identity), a range's three integers.

    ``np.asarray(memmap)`` (what the samplers' checks return) is a plain view of the memmap: its
    key is the memmap's, O(1), rather than a full hash of the file.
    """
    if isinstance(values, range | tuple):
        return repr(values)
    if isinstance(values, np.ndarray) and not isinstance(values, np.memmap):
        base: Any = values.base
        while base is not None and not isinstance(base, np.memmap):
            base = getattr(base, "base", None)  # a chain of views; a tensor or buffer ends it
        same = (
            base is not None
            and base.shape == values.shape
            and base.dtype == values.dtype
            and base.__array_interface__["data"][0] == values.__array_interface__["data"][0]
        )
        if same:
            return key_of(base)
    return key_of(values)


def shared_arrays(
    kind: str,
    key: str,
    builder: Builder,
    *,
    size: int,
    cache_dir: CacheDir = None,
    timeout: float = DEFAULT_TIMEOUT,
    replaces: Callable[[str], bool] | None = None,
) -> dict[str, np.ndarray]:
    """``{name: array}`` of what ``builder`` writes: from the node's cache, or in memory for small inputs.

    Args:
        kind: the table's kind (names the cache entry; bump its version suffix when its format changes).
        key: identifies the input and every option that changes the table.
        builder: fills the arrays it allocates; may raise ``ValueError``/``TypeError`` on bad input.
        size: entries of the input (below ``SHARED_MIN``: built in memory, no cache).
        cache_dir: ``None`` (the default directory), a path, or ``False`` (no cache: private memory, with a warning).
        timeout: seconds to wait for another process building the same table.
        replaces: keys of the same kind this table supersedes (e.g. earlier epochs' plans): the
            process that builds it into the cache removes them (``build_or_open(replaces=...)``).
    """
    if size < SHARED_MIN:
        arrays: dict[str, np.ndarray] = {}

        def in_memory(name: str, length: int, dtype: Any) -> np.ndarray:
            arrays[name] = np.empty(length, dtype=dtype)
            return arrays[name]

        builder(in_memory)
        for array in arrays.values():
            array.flags.writeable = False
        return arrays

    def build(directory: Path) -> None:
        opened: list[np.memmap] = []

        def to_file(name: str, length: int, dtype: Any) -> np.ndarray:
            array = np.lib.format.open_memmap(directory / f"{name}.npy", mode="w+", dtype=dtype, shape=(length,))
            opened.append(array)
            return array

        builder(to_file)
        for array in opened:
            array.flush()
        opened.clear()  # build_or_open reopens the files read-only; keep no writable map alive

    return build_or_open(kind, key, build, cache_dir=cache_dir, timeout=timeout, replaces=replaces)


# -- pickling by reference ---------------------------------------------------------------------------
def mapped_source(array: np.ndarray) -> tuple[str, int, str, tuple[int, ...]] | None:
    """``(path, byte offset, dtype, shape)`` when ``array`` is a C-contiguous view of a file-backed ``np.memmap``."""
    base: Any = array
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    if base is None or base.filename is None or not array.flags.c_contiguous:
        return None
    delta = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return str(base.filename), int(base.offset) + delta, array.dtype.str, tuple(array.shape)


def reopen(path: str, offset: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The array ``mapped_source`` described, mapped read-only again (in another process)."""
    if not shape or 0 in shape:
        return np.empty(shape, dtype=dtype)
    return np.asarray(np.memmap(path, mode="r", dtype=np.dtype(dtype), shape=shape, offset=offset))


class _ByReference:
    """Pickles as a call to :func:`reopen`: the unpickled attribute is the re-mapped array itself."""

    __slots__ = ("source",)

    def __init__(self, source: tuple[str, int, str, tuple[int, ...]]) -> None:
        self.source = source

    def __reduce__(self) -> tuple[Any, ...]:
        return reopen, self.source


def by_reference(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a copy of ``__dict__``) with every memory-mapped array replaced by a reference to its file.

    So pickling a sampler (spawned DataLoader workers, ``ddp_spawn``) sends file names, not the
    gigabytes behind them; the receiving process maps the same files, sharing the page cache.
    """
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            source = mapped_source(value)
            if source is not None:
                state[name] = _ByReference(source)
    return state
