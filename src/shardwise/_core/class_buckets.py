"""The class index, part two: every sample index grouped by class, in two local passes.

NOTE [ Class index in two passes ]: a one-pass counting sort appends every sample to its class's
cursor: with 1e5 classes, consecutive writes land on 1e5 places spread over the 4 GB output at 1e9
samples, each a cache miss, a TLB miss and, on a file mapping, a page fault on a page the kernel
may have written back meanwhile (54 s at 1e9, most of ClassBalanced's 60 s cold start). So
:func:`group_by_class` fills the output in two passes whose writes stay local, MSD radix-sort style:

1. the classes are cut into **buckets** of consecutive classes (:func:`bucket_plan`), each of at
   most ``2 * BUCKET_ITEMS`` samples (a class larger than ``BUCKET_ITEMS`` is a bucket of its own)
   and at most ``BUCKET_CLASSES`` classes. The labels are read in order, a chunk at a time; each
   chunk's samples are grouped by bucket and every group is appended to its bucket's run of the
   output (a few hundred sequential write streams at 1e9), as **codes**: the class within the
   bucket above ``block_bits`` bits, the position within its **block** (``2 ** block_bits``
   consecutive samples) below. How many samples of each bucket every block gave is kept
   (``blocks x buckets`` integers): it tells pass 2 the block of every code;
2. each bucket's run (at most 16 MiB, or one class) is read back through the mapping, decoded and
   ordered by class into a scratch buffer (a counting sort: the classes' starts are known from the
   counts; stable, since codes are read in dataset order), and written over the run.

Both passes run the compiled kernels of :mod:`.class_jit` (numba, the ``fast`` extra: per item, a
few operations a numpy step would spend a pass and a temporary on each) on two threads
(:data:`THREADS`, through :class:`~.threads.KernelThreads`): in pass 1 the second half of the
labels fills each run from its end, backwards, so neither half needs the other's counts; in pass 2
the buckets are dealt round-robin. Without numba, the one-pass sort
(:func:`~.class_index.group_in_one_pass`) is used: the same passes in numpy took longer at 1e8 (5.3 s against 3.1 s) and
needed ~40 bytes of temporaries an item of a chunk.

The output is written with ``pwrite`` when it is a file mapping (:class:`_Output`): on a fresh
file, the page faults of writes through the mapping cost more than the sort (1e6 faults at 1e9,
about 10 us each on a busy virtual machine; ``pwrite`` fills the page cache without them).

Codes must fit the output's integers (uint32 below 2**32 samples): ``block_bits`` is what the class
leaves. When that leaves fewer than ``MIN_BLOCK_BITS`` bits or more than ``SEGMENTS_MAX`` block
counts (millions of classes at 1e9 samples), the one-pass sort
(:func:`~.class_index.group_in_one_pass`) is used instead. Both write the same index.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from . import threads
from .class_index import CHUNK, COMPILED_CHUNK, dense_table, group_in_one_pass, id_function, kernels, raw_kernels
from .foreign import private

BUCKET_ITEMS = 1 << 21
"""A bucket of several classes holds at most twice this many samples: pass 2's scratch (16 MiB of uint32)."""

BUCKET_CLASSES = 1 << 12
"""Most classes in one bucket: the class of a code takes at most 12 of its bits."""

MIN_BLOCK_BITS = 16
"""Fewest position bits a code may have (blocks of 65,536 samples); fewer: the one-pass sort."""

BUCKETS_MAX = 1 << 16
"""Most buckets: a bucket number takes 16 bits (beside a code, below its position bits)."""

SEGMENTS_MAX = 1 << 21
"""Most ``blocks x buckets`` counts pass 2 may need (16 MiB); more: the one-pass sort."""


THREADS = 2
"""Threads of the two passes (the kernels release the GIL): pass 1 fills the runs from both ends.

``SHARDWISE_BUILD_WORKERS`` overrides it (:func:`~.threads.build_threads`): pass 2 deals its buckets
to that many threads more; pass 1 still uses two at most."""


class BucketPlan(NamedTuple):
    """How :func:`group_by_class` cuts the classes into buckets and codes a sample.

    See NOTE [ Class index in two passes ].
    """

    bucket: np.ndarray  # (C,) int64: the bucket of each class
    local: np.ndarray  # (C,) int64: the class's number within its bucket
    firsts: np.ndarray  # (buckets + 1,) int64: each bucket's first class (then C)
    block_bits: int  # position bits of a code: blocks of 2**block_bits samples


def bucket_plan(counts: np.ndarray, size: int, dtype: np.dtype) -> BucketPlan | None:
    """The buckets of the classes of ``counts`` and the codes' layout in integers of ``dtype``; None if they do not fit.

    O(classes), vectorised: a bucket ends where the running count enters another window of
    ``BUCKET_ITEMS`` samples, around a class larger than that, and after ``BUCKET_CLASSES`` classes.
    """
    count = len(counts)
    if count == 0 or size == 0:
        return None
    counts = np.asarray(counts, dtype=np.int64)
    number = np.arange(count, dtype=np.int64)
    big = counts > BUCKET_ITEMS
    starts = np.cumsum(counts) - counts
    new = np.ones(count, dtype=bool)
    # classes, none big, starting in one window of BUCKET_ITEMS samples: at most 2 * BUCKET_ITEMS in all
    new[1:] = (starts[1:] // BUCKET_ITEMS != starts[:-1] // BUCKET_ITEMS) | big[1:] | big[:-1]
    first = np.maximum.accumulate(np.where(new, number, 0))
    new |= (number - first) % BUCKET_CLASSES == 0
    bucket = np.cumsum(new) - 1
    firsts = np.append(np.flatnonzero(new), count).astype(np.int64)
    class_bits = int(np.diff(firsts).max() - 1).bit_length()
    value_bits = dtype.itemsize * 8 - (1 if dtype.kind == "i" else 0)
    block_bits = min(max(1, (size - 1).bit_length()), value_bits - class_bits)
    blocks = -(-size // (1 << block_bits))
    buckets = len(firsts) - 1
    # a bucket number sits in a code's position bits while pass 1 groups a chunk: below 2**block_bits
    if block_bits < MIN_BLOCK_BITS or buckets > min(BUCKETS_MAX, 1 << block_bits) or blocks * buckets > SEGMENTS_MAX:
        return None
    return BucketPlan(bucket, number - firsts[bucket], firsts, block_bits)


def group_by_class(
    labels: np.ndarray, classes: np.ndarray, counts: np.ndarray, out: np.ndarray, *, chunk: int = CHUNK,
    progress: Callable[[int], object] | None = None, before_one_pass: Callable[[np.ndarray], object] | None = None,
) -> None:  # fmt: skip
    """Write every sample index into ``out``, grouped by class in ``classes`` order, dataset order within.

    Two local passes (NOTE [ Class index in two passes ]) with the compiled kernels, when
    :func:`~.class_index.kernels` gives them and the codes fit ``out``; else the one-pass sort.
    Private memory O(classes + chunk), never O(n): about 50 MiB of buffers for the two passes.

    Args:
        labels: ``(n,)`` labels (any array, a memmap is read a chunk at a time).
        classes, counts: from :func:`~.class_index.count_classes` (``counts`` may hold zeros).
        out: ``(n,)`` integer output, e.g. a writable memmap.
        chunk: labels per step of the one-pass sort (the two passes take ``COMPILED_CHUNK``).
        progress: told of the labels grouped as it goes (``n`` in all), from this thread only.
        before_one_pass: called with ``out`` before the one-pass sort, which writes through its
            mapping (e.g. to fault its pages in at once); the two passes write with ``pwrite``.
    """
    # which path, and the class ids the kernels read: decided here, once (numba, dtypes, counts)
    jit, raw = kernels(len(labels)), raw_kernels(labels)
    plan = bucket_plan(counts, len(labels), out.dtype) if jit is not None else None
    if jit is None or plan is None:
        if before_one_pass is not None:
            before_one_pass(out)
        group_in_one_pass(labels, classes, counts, out, chunk=chunk, progress=progress)
        return
    dense = dense_table(classes) if raw is not None else None
    ids_of = id_function(classes)
    workers = threads.build_threads(min(THREADS, threads.usable_cpus()))
    kernel_threads = threads.KernelThreads(workers, name="shardwise-class-index", with_caller=True)
    with kernel_threads, _Output(out) as output:
        per_block = _scatter(labels, (dense, ids_of), counts, output, plan, jit, kernel_threads, workers, progress)
        _order(counts, output, plan, np.cumsum(per_block, axis=0), jit, kernel_threads, workers)


def _scatter(
    labels: np.ndarray, ids: tuple[tuple[int, np.ndarray | None] | None, Callable[[np.ndarray], np.ndarray]],
    counts: np.ndarray, output: _Output, plan: BucketPlan, jit: ModuleType, kernel_threads: threads.KernelThreads,
    workers: int, progress: Callable[[int], object] | None,
) -> np.ndarray:  # fmt: skip
    """Pass 1: every sample's code appended to its bucket's run; ``(blocks, buckets)`` int64: the codes of
    each bucket from each block.

    ``ids``: ``(dense, ids_of)``, the classes' :func:`~.class_index.dense_table` when the kernels read the
    labels as they are (else None) and their :func:`~.class_index.id_function`.

    With a second thread, the first half of the labels (whole blocks) fills the runs from their
    starts, forwards, and the second half from their ends, chunk after chunk backwards (each chunk's
    codes still written in order below the run's cursor): the two meet where the first half ends,
    so neither needs the other's counts.
    """
    size, block, dtype = len(labels), 1 << plan.block_bits, output.dtype
    buckets = len(plan.firsts) - 1
    class_starts = np.cumsum(counts) - counts
    starts = class_starts[plan.firsts[:-1]]  # each bucket's run: [starts, stops)
    stops = np.append(starts[1:], int(class_starts[-1] + counts[-1]))
    # a class's code, its bucket in the low bits (the position bits, free until the position is added)
    table = (plan.local.astype(dtype) << dtype.type(plan.block_bits)) | plan.bucket.astype(dtype)
    dense, ids_of = ids
    low = 0
    if dense is not None:  # the kernel reads the labels as they are: its table is by label - low
        low, by_label = dense
        if by_label is not None:
            table = table[by_label]  # a label absent from classes is never looked up
    chunk = min(COMPILED_CHUNK, block)
    mask = dtype.type(min(BUCKETS_MAX, block) - 1)
    per_block = np.zeros((-(-size // block), buckets), dtype=np.int64)

    def fill(first: int, stop: int, forwards: bool) -> None:
        into = np.empty(min(chunk, size), dtype=dtype)
        which = np.empty(len(into), dtype=np.uint16)
        cursor = (starts if forwards else stops).copy()
        steps = range(first, stop, chunk)
        for start in steps if forwards else reversed(steps):
            part = np.asarray(labels[start : start + chunk])
            here = np.zeros(buckets, dtype=np.int64)
            values = part if dense is not None else ids_of(part)
            jit.partition_chunk(values, low, table, mask, start % block, here, which, into)
            per_block[start // block] += here  # a block is read by one thread only
            if not forwards:
                cursor -= here
            at = 0
            for b in np.flatnonzero(here).tolist():
                amount = int(here[b])
                output.write(int(cursor[b]), into[at : at + amount])
                at += amount
            if forwards:
                cursor += here
                if progress is not None:  # this thread's half as it goes, the other's once done
                    progress(len(part))

    middle = (size // 2) // block * block if workers > 1 else 0
    if middle == 0:
        fill(0, size, True)
    else:
        kernel_threads.run([(fill, (0, middle, True)), (fill, (middle, size, False))])
        if progress is not None:
            progress(size - middle)
    return per_block


def _order(
    counts: np.ndarray, output: _Output, plan: BucketPlan, ends: np.ndarray, jit: ModuleType,
    kernel_threads: threads.KernelThreads, workers: int,
) -> None:  # fmt: skip
    """Pass 2: each bucket's codes decoded into sample indices and ordered by class (stable), in place
    (the buckets dealt round-robin to ``workers`` threads, each with its buffers)."""
    class_starts = np.cumsum(counts) - counts
    totals = ends[-1]
    several = np.diff(plan.firsts) > 1
    largest = int(totals[several].max(initial=0))
    present = np.flatnonzero(totals)

    def order(worker: int) -> None:
        scratch = np.empty(max(largest, min(int(totals.max(initial=0)), COMPILED_CHUNK)), dtype=output.dtype)
        for b in present[worker::workers].tolist():
            first, stop = int(plan.firsts[b]), int(plan.firsts[b + 1])
            begin, total = int(class_starts[first]), int(totals[b])
            if several[b]:
                cursor = class_starts[first:stop] - begin
                jit.order_bucket(output.codes(begin, total), ends[:, b], plan.block_bits, 0, cursor, scratch)
                output.write(begin, scratch[:total])
                continue
            for skip in range(0, total, len(scratch)):  # one class, of any size: in order, decoded a piece at a time
                piece = output.codes(begin + skip, min(len(scratch), total - skip))
                jit.order_bucket(piece, ends[:, b], plan.block_bits, skip, np.zeros(1, dtype=np.int64), scratch)
                output.write(begin + skip, scratch[: len(piece)])

    kernel_threads.run([(order, (worker,)) for worker in range(workers)])


class _Output:
    """Writes runs of ``out``: through its file (``pwrite``) when it is a writable file mapping (no page
    fault per page written), else in memory. A context manager."""

    def __init__(self, out: np.ndarray) -> None:
        self.out = out
        self.dtype: np.dtype[Any] = out.dtype
        self.fd: int | None = None
        self.offset = 0
        where = _file_offset(out)
        if where is not None:
            self.fd = os.open(where[0], os.O_RDWR)
            self.offset = where[1]

    def write(self, at: int, values: np.ndarray) -> None:
        """``out[at : at + len(values)] = values`` (``values``: contiguous, of ``out``'s dtype)."""
        if self.fd is None:
            self.out[at : at + len(values)] = values
            return
        view, position = values.data.cast("B"), self.offset + at * self.dtype.itemsize
        while view:
            done = os.pwrite(self.fd, view, position)
            view, position = view[done:], position + done

    def codes(self, at: int, length: int) -> np.ndarray:
        """``out[at : at + length]``, to read (through the mapping: pass 1's pages are in the page cache)."""
        return np.asarray(self.out[at : at + length])

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _file_offset(out: np.ndarray) -> tuple[str, int] | None:
    """``(path, byte offset of out[0])`` when ``out`` is a contiguous 1-D view of a writable shared file mapping."""
    raw = getattr(out, private("numpy", "_mmap"), None)
    if not isinstance(out, np.memmap) or not out.filename or getattr(out, "mode", None) not in ("r+", "w+"):
        return None
    if not isinstance(raw, mmap.mmap) or out.ndim != 1 or not out.flags.c_contiguous or not hasattr(os, "pwrite"):
        return None
    base = np.frombuffer(raw, dtype=np.uint8).ctypes.data
    start = out.offset - out.offset % mmap.ALLOCATIONGRANULARITY  # where numpy's mapping of the file begins
    return str(out.filename), start + out.ctypes.data - base
