"""The compiled steps of a packing index build (numba, the ``fast`` extra): imported by :mod:`.compiled` only.

This module (and :mod:`.jit_deal`, the chain's kernel, re-exported here) imports numba at its
top: :mod:`.compiled` imports it lazily, once a build or a packing has chosen the compiled path
(``SHARDWISE_NUMBA``), so ``import shardwise`` never loads numba. Every kernel calls only kernels
of its own file: numba's on-disk cache of a function is keyed by its file alone and would not
notice a change in a callee of another file.
Every function here makes exactly what the numpy steps it replaces make, value for value (the
tests compare them on random inputs):

- :func:`count_pieces`, :func:`fill_pieces`: :func:`~.pieces.piece_counts` and
  :func:`~.pieces.fill_pieces` on a range of samples, one pass each, no temporary arrays;
- :func:`pack_strata`: for a range of strata, each stratum's histogram
  (:func:`~.strata.stratum_histogram`), its best-fit placements (:func:`place`) and the
  row of every slot (:func:`~.rows.pack_histogram`), written into the layouts' ``slot_rows``;
- :func:`place`: best-fit decreasing on a histogram, placement for placement what
  :class:`~.rows._Rooms`' loop makes (below);
- :func:`~.jit_deal.deal_strata`: the chain of :func:`~.layout.stratum_layouts` over a range of
  strata (row loads, the rows handed on, :func:`~.rows.deal_rows`, the batch keys).

Every kernel releases the GIL (``nogil``): a build runs them on threads, one range each.
"""

from __future__ import annotations

import numba
import numpy as np

from .jit_deal import deal_strata

__all__ = ["count_pieces", "deal_strata", "fill_pieces", "pack_strata", "place"]

_jit = numba.njit(cache=True, nogil=True)


@_jit
def count_pieces(lengths: np.ndarray, max_len: int, counts: np.ndarray) -> None:  # pragma: no cover - compiled
    """Add ``lengths``' :func:`~.pieces.piece_counts` (``(2, max_len + 1)`` int64) into ``counts``."""
    for i in range(lengths.size):
        length = np.int64(lengths[i])
        if length <= max_len:
            counts[0, length] += 1
        else:
            counts[1, max_len] += length // max_len
            rest = length % max_len
            if rest > 0:
                counts[1, rest] += 1


@_jit
def fill_pieces(  # pragma: no cover - compiled
    lengths: np.ndarray, first: int, max_len: int, sample: np.ndarray, start: np.ndarray,
    short_cursor: np.ndarray, piece_cursor: np.ndarray,
) -> None:  # fmt: skip
    """Write samples ``first + i`` of ``lengths`` (and their pieces) at their cursors, advancing them.

    A sample of length ``l <= max_len`` takes ``short_cursor[l]``; a longer one's pieces, in
    order, take ``piece_cursor`` of their lengths (their first token into ``start``).
    """
    for i in range(lengths.size):
        length = np.int64(lengths[i])
        if length <= max_len:
            at = short_cursor[length]
            sample[at] = first + i
            short_cursor[length] = at + 1
        else:
            begin = 0
            while begin < length:
                piece = min(length - begin, max_len)
                at = piece_cursor[piece]
                sample[at] = first + i
                start[at] = begin
                piece_cursor[piece] = at + 1
                begin += max_len


@_jit
def _histogram(counts: np.ndarray, phase: np.ndarray, num_strata: int, stratum: int,
               out: np.ndarray) -> None:  # fmt: skip  # pragma: no cover - compiled
    """:func:`~.strata.stratum_histogram` into ``out`` (``phase``: the class phases modulo ``num_strata``)."""
    for c in range(counts.size):
        offset = phase[c] // num_strata
        lo = (counts[c] * stratum + phase[c]) // num_strata - offset
        hi = (counts[c] * (stratum + 1) + phase[c]) // num_strata - offset
        out[c] = hi - lo


@_jit
def _stratum_rows(histogram: np.ndarray, max_len: int, out: np.ndarray, at: int) -> int:  # pragma: no cover
    """:func:`~.rows.pack_histogram` of ``histogram``: every slot's row written from ``out[at]`` on; the rows."""
    capacity = 4 * (max_len + 1) + 1024
    while True:
        firsts, sizes, repeats, starts, count, num_rows = place(histogram, max_len, capacity)
        if count >= 0:
            break
        capacity *= 4
    zeros = histogram[0]
    if zeros > 0:
        num_rows = max(num_rows, 1)
        for k in range(zeros):
            out[at] = k % num_rows
            at += 1
    for length in range(1, max_len + 1):  # lengths ascending, each length's placements in the order made
        for i in range(starts[length], starts[length - 1]):
            for row in range(firsts[i], firsts[i] + sizes[i]):
                for _ in range(repeats[i]):
                    out[at] = row
                    at += 1
    return num_rows


@_jit
def pack_strata(  # pragma: no cover - compiled
    counts: np.ndarray, phase: np.ndarray, num_strata: int, max_len: int, first: int, slot_starts: np.ndarray,
    slot_rows: np.ndarray, num_rows: np.ndarray,
) -> None:  # fmt: skip
    """Pack strata ``first .. first + num_rows.size - 1`` into ``slot_rows`` (at ``slot_starts``); their rows."""
    histogram = np.empty(counts.size, dtype=np.int64)
    for i in range(num_rows.size):
        _histogram(counts, phase, num_strata, first + i, histogram)
        num_rows[i] = _stratum_rows(histogram, max_len, slot_rows, slot_starts[i])


@_jit
def place(  # noqa: PLR0912, PLR0915  # pragma: no cover - compiled (one loop, no helper calls)
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
    words = (max_len >> 6) + 1
    open_rooms = np.zeros(words, dtype=np.uint64)  # bit r & 63 of word r >> 6: room r holds rows
    open_words = np.zeros((words >> 6) + 1, dtype=np.uint64)  # bit w & 63 of word w >> 6: open_rooms[w] != 0
    one, every, shift = np.uint64(1), np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64(58)
    debruijn = np.uint64(0x03F79D71B4CB0A89)
    lowest = np.zeros(64, dtype=np.int64)  # the lowest set bit of x is lowest[(x & -x) * debruijn >> 58]
    for bit in range(64):
        lowest[(debruijn << np.uint64(bit)) >> shift] = bit
    got_first = np.empty(capacity, dtype=np.int64)  # the runs one step took, in queue order
    got_size = np.empty(capacity, dtype=np.int64)
    placed = 0
    num_rows = 0
    for length in range(max_len, 0, -1):
        starts[length] = placed
        need = needs[length]
        while need > 0:
            # the smallest room >= length that holds rows: its bit in open_rooms, words skipped by open_words
            room = -1
            word_at = length >> 6
            word = open_rooms[word_at] & (every << np.uint64(length & 63))
            if word != 0:
                room = (word_at << 6) + lowest[((word & (~word + one)) * debruijn) >> shift]
            else:
                word_at += 1
                top_at = word_at >> 6
                mask = every << np.uint64(word_at & 63)
                while top_at < open_words.size:
                    top = open_words[top_at] & mask
                    if top != 0:
                        word_at = (top_at << 6) + lowest[((top & (~top + one)) * debruijn) >> shift]
                        word = open_rooms[word_at]
                        room = (word_at << 6) + lowest[((word & (~word + one)) * debruijn) >> shift]
                        break
                    top_at += 1
                    mask = every
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
                    if count[into] == 0:  # room `into` opens
                        if open_rooms[into >> 6] == 0:
                            open_words[into >> 12] |= one << np.uint64((into >> 6) & 63)
                        open_rooms[into >> 6] |= one << np.uint64(into & 63)
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
                if count[room] == 0:  # room `room` closes
                    open_rooms[room >> 6] &= ~(one << np.uint64(room & 63))
                    if open_rooms[room >> 6] == 0:
                        open_words[room >> 12] &= ~(one << np.uint64((room >> 6) & 63))
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
                if count[into] == 0:  # room `into` opens
                    if open_rooms[into >> 6] == 0:
                        open_words[into >> 12] |= one << np.uint64((into >> 6) & 63)
                    open_rooms[into >> 6] |= one << np.uint64(into & 63)
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
