"""The class index, part one: the distinct labels and their counts, class ids, and the one-pass sort.

:func:`count_classes` reads the labels once (a ``bincount`` per chunk for dense integer labels,
or a compiled loop); :func:`~.class_buckets.group_by_class` then writes every sample index grouped
by class. The compiled kernels (:mod:`.class_jit`, numba: the ``fast`` extra, chosen by
``SHARDWISE_NUMBA`` as packing's are, :func:`kernels`) write exactly what the numpy steps write.

The one-pass sort (:func:`group_in_one_pass`) is the fallback of the two passes
(NOTE [ Class index in two passes ], in :mod:`.class_buckets`) and the reference the tests compare them with.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np

CHUNK = 1 << 18
"""Labels read per step of the numpy steps: bounds their private memory (a few MiB)."""

COMPILED_CHUNK = 1 << 22
"""Labels per call of a compiled kernel (no temporaries: only the Python loop's overhead to amortise)."""

DENSE_SPAN = 1 << 22
"""Integer labels spanning at most this many values are counted with ``bincount`` (the fast path)."""

COMPILED_FROM = 1 << 24
"""Labels from which ``SHARDWISE_NUMBA=auto`` takes the kernels: below it the numpy steps take about
as long as importing numba (~1 s, ~35 MB of private memory). The index is the same either way."""


# -- which path --------------------------------------------------------------------------------
def kernels(size: int) -> ModuleType | None:
    """The compiled kernels (:mod:`.class_jit`) for an index of ``size`` labels, or None (the numpy steps).

    ``SHARDWISE_NUMBA``: ``0`` None; ``1`` the kernels (ImportError naming the extra without numba);
    unset or ``auto`` the kernels from :data:`COMPILED_FROM` labels on, when numba is installed.
    """
    from .packing.compiled import ENV_NUMBA, numba_mode  # the one reader of the switch

    mode = numba_mode()
    if mode == "off" or (mode == "auto" and size < COMPILED_FROM):
        return None
    try:
        import numba  # noqa: F401  (optional: the ``fast`` extra; class_jit compiles with it)
    except ImportError:
        if mode == "on":
            raise ImportError(f"{ENV_NUMBA}=1 but numba is not installed: pip install 'shardwise[fast]'") from None
        return None
    from . import class_jit

    return class_jit


# -- counting ----------------------------------------------------------------------------------
def _dense_counts(labels: np.ndarray, jit: ModuleType | None) -> tuple[int, np.ndarray] | None:
    """``(low, counts of low, low + 1, ...)`` of integer labels spanning at most ``DENSE_SPAN`` values, else ``None``.

    One pass: each chunk's range widens the counts as needed before it is counted (no separate
    passes for the smallest and largest label). With the kernels, two threads count a half each.
    """
    if labels.dtype.kind not in "iu":
        return None
    if jit is None or len(labels) < 2 * COMPILED_CHUNK:
        return _count_range(labels, 0, len(labels), jit)
    from .threads import Pool

    middle = len(labels) // 2 // COMPILED_CHUNK * COMPILED_CHUNK
    pool = Pool(1, name="shardwise-class-count")
    try:
        second = pool.submit(_count_range, labels, middle, len(labels), jit)
        first = _count_range(labels, 0, middle, jit)
        last = second.result()
    finally:
        pool.shutdown(cancel=True)
    if first is None or last is None:
        return None
    low, high = min(first[0], last[0]), max(first[0] + len(first[1]), last[0] + len(last[1]))
    if high - low > DENSE_SPAN:
        return None
    counts = np.zeros(high - low, dtype=np.int64)
    for start, part in (first, last):
        counts[start - low : start - low + len(part)] += part
    return low, counts


def _count_range(labels: np.ndarray, begin: int, end: int, jit: ModuleType | None) -> tuple[int, np.ndarray] | None:
    """:func:`_dense_counts` of ``labels[begin:end]`` (not empty), in one thread."""
    low, high, counts = 0, -1, np.zeros(0, dtype=np.int64)
    chunk = CHUNK if jit is None else COMPILED_CHUNK
    for start in range(begin, end, chunk):
        part = np.asarray(labels[start : min(start + chunk, end)])
        first, last = (int(v) for v in (jit.value_range(part) if jit is not None else (part.min(), part.max())))
        if high < low:
            low, high = first, first - 1
        if first < low or last > high:
            new_low, new_high = min(low, first), max(high, last)
            if new_high - new_low + 1 > DENSE_SPAN:
                return None
            counts = np.concatenate([np.zeros(low - new_low, dtype=np.int64), counts,
                                     np.zeros(new_high - high, dtype=np.int64)])  # fmt: skip
            low, high = new_low, new_high
        if jit is not None:
            jit.add_counts(part, low, counts)
        else:
            counts += np.bincount(minus(part, low), minlength=counts.size)
    return low, counts


def count_classes(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct labels and how many samples each has (int64), read in chunks.

    Private memory O(classes + chunk): integer labels within ``DENSE_SPAN`` values are counted
    into one table (``bincount`` per chunk, or a compiled loop); others merge each chunk's
    ``np.unique`` into the running result.
    """
    size = len(labels)
    dense = _dense_counts(labels, raw_kernels(labels)) if size else None
    if dense is not None:
        low, counts = dense
        present = np.flatnonzero(counts)
        return present.astype(labels.dtype) + labels.dtype.type(low), counts[present]  # exact modulo 2**bits
    classes: np.ndarray = np.empty(0, dtype=labels.dtype)
    totals = np.empty(0, dtype=np.int64)
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    waiting = 0
    for start in range(0, size, CHUNK):
        found, found_counts = np.unique(np.asarray(labels[start : start + CHUNK]), return_counts=True)
        pending.append((found, found_counts))
        waiting += len(found)
        # Merge once the chunks' distinct labels outnumber the classes so far (amortised O(n log n)).
        if waiting >= max(len(classes), 16 * CHUNK) or start + CHUNK >= size:
            merged, where = np.unique(np.concatenate([classes, *(f for f, _ in pending)]), return_inverse=True)
            weights = np.concatenate([totals, *(c for _, c in pending)]).astype(np.float64)  # exact below 2**53
            summed = np.bincount(where.reshape(-1), weights=weights, minlength=len(merged)).astype(np.int64)
            classes, totals, pending, waiting = merged, summed, [], 0
    return classes, totals


def raw_kernels(labels: np.ndarray) -> ModuleType | None:
    """The kernels, when they may read ``labels`` themselves: integers whose differences fit int64."""
    if labels.dtype.kind not in "iu" or (labels.dtype.kind == "u" and labels.dtype.itemsize > 4):
        return None
    return kernels(len(labels))


def minus(values: np.ndarray, low: int) -> np.ndarray:
    """``values - low`` as int64, for integer ``values`` of any dtype at least ``low`` and less than 2**63 above it
    (uint64 labels past 2**63 included, which int64 arithmetic would overflow)."""
    result: np.ndarray
    if values.dtype == np.uint64:
        result = np.subtract(values, np.uint64(low)).astype(np.int64)
    else:
        result = np.subtract(values, low, dtype=np.int64)
    return result


def class_ids(chunk: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The position in ``classes`` (sorted, holding every value of ``chunk``) of each label, int64."""
    if chunk.dtype.kind in "iu" and len(classes) and int(classes[-1]) - int(classes[0]) + 1 == len(classes):
        return np.asarray(chunk, dtype=np.int64) - int(classes[0])  # labels 0..C-1 and the like: no search
    found, where = np.unique(chunk, return_inverse=True)
    ids: np.ndarray = np.searchsorted(classes, found)[where.reshape(-1)]
    return ids.astype(np.int64)


def id_function(classes: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``chunk -> class ids (int64)`` for labels drawn from ``classes`` (sorted): a subtraction for
    consecutive integer classes, a table look-up for integers spanning at most ``DENSE_SPAN`` values,
    else :func:`class_ids`' search."""
    table = dense_table(classes)
    if table is not None:
        low, ids = table
        if ids is None:
            return lambda chunk: minus(chunk, low)
        return lambda chunk: ids[minus(chunk, low)]
    return lambda chunk: class_ids(chunk, classes)


def dense_table(classes: np.ndarray) -> tuple[int, np.ndarray | None] | None:
    """``(low, ids)`` for integer classes spanning at most ``DENSE_SPAN`` values: label ``v`` is class
    ``ids[v - low]`` (``ids`` None: consecutive classes, ``v - low`` itself); else None."""
    if classes.dtype.kind not in "iu" or not len(classes):
        return None
    low, span = int(classes[0]), int(classes[-1]) - int(classes[0]) + 1
    if span == len(classes):
        return low, None
    if span > DENSE_SPAN:
        return None
    ids = np.zeros(span, dtype=np.int64)
    ids[minus(classes, low)] = np.arange(len(classes), dtype=np.int64)
    return low, ids


# -- the one-pass sort ---------------------------------------------------------------------------
def group_in_one_pass(
    labels: np.ndarray, classes: np.ndarray, counts: np.ndarray, out: np.ndarray, *, chunk: int = CHUNK,
    progress: Callable[[int], object] | None = None,
) -> None:  # fmt: skip
    """:func:`~.class_buckets.group_by_class` in one pass, ``chunk`` labels at a time: every chunk ordered
    by class (stable), then scattered to the classes' cursors; ``progress`` is told of every chunk.
    (NOTE [ Class index in two passes ] says why it is the fallback.)"""
    count, size = len(counts), len(labels)
    ids_of = id_function(classes)
    cursor = np.cumsum(counts) - counts
    class_bits = max(1, (count - 1).bit_length())
    chunk = min(chunk, 1 << max(1, 64 - class_bits))  # a class and a chunk position fit in 64 bits together
    local_bits = max(1, (min(chunk, size) - 1).bit_length())
    # keys: class << local_bits | chunk position, unsigned, 32 bits when they fit (a faster sort)
    composite = np.dtype(np.uint32) if class_bits + local_bits <= 32 else np.dtype(np.uint64)
    mask = (1 << local_bits) - 1
    by_table = count <= chunk  # each chunk's per-class starts as one O(classes) table, else from its runs
    for start in range(0, size, chunk):
        ids = ids_of(np.asarray(labels[start : start + chunk]))
        length = len(ids)
        local: np.ndarray
        if class_bits <= 16:  # numpy's stable sort of 16-bit keys is a radix sort: the fastest here
            here = np.bincount(ids, minlength=count)
            ids = ids.astype(np.uint16)  # the int64 ids freed before the sort's output is made
            local = np.argsort(ids, kind="stable")
            # the sorted ids are runs: one np.repeat of each class's base, not a gather by id
            destination = np.repeat(cursor - (np.cumsum(here) - here), here)
            cursor += here
        else:
            keys: np.ndarray = ids.astype(composite, copy=False) if composite == np.uint32 else ids.view(np.uint64)
            keys <<= local_bits
            keys |= np.arange(length, dtype=composite)
            keys.sort()
            sorted_ids = keys >> local_bits
            if composite == np.uint64:
                sorted_ids = sorted_ids.view(np.int64)  # below 2**63: bincount takes it
            if by_table:
                here = np.bincount(sorted_ids, minlength=count)
                # destination of the j-th sorted label: j + (its class's cursor - the class's first j in the chunk)
                destination = (cursor - (np.cumsum(here) - here))[sorted_ids]
                cursor += here
            else:
                firsts = np.flatnonzero(np.concatenate([[True], sorted_ids[1:] != sorted_ids[:-1]]))
                runs = np.diff(np.append(firsts, length))
                present = sorted_ids[firsts]
                destination = np.repeat(cursor[present] - firsts, runs)
                cursor[present] += runs
            del sorted_ids
            local = np.bitwise_and(keys, mask, out=keys)
        destination += np.arange(length, dtype=np.int64)
        local = local.astype(out.dtype, copy=False)
        local += start
        np.put(out, destination, local)  # np.put: several times faster than out[destination] = local here
        del ids, local, destination  # before the next chunk's: private memory of one chunk, not two
        if progress is not None:
            progress(length)
