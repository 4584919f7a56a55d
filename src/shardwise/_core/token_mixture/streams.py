"""One source of a packed mixture as a stream of tokens: its documents, in a keyed order per cycle.

A source's documents are dealt into ``K`` **strided chunks** (chunk ``k`` holds the blocks ``k, k +
K, k + 2K, ...`` of ``BLOCK`` consecutive documents, so every chunk samples the whole index range:
data sorted by date, length or topic is spread over all chunks, and a chunk's lengths are a few
pages of a memory map); without shuffling, into contiguous chunks read in index order. Each
cycle of the source (a pass over all its tokens) visits the chunks in a keyed order and each chunk's
documents in a keyed order of their own, and concatenates them: the cycle's stream of tokens. A
token offset is found by two binary searches (the cycle's chunk prefix sums, then the chunk's
document prefix sums), so any range of the stream is read in O(K + chunk) without replaying the
stream.

Memory: ``K <= MAX_CHUNKS`` chunk totals (computed once, one pass over the lengths), the current
cycle's chunk order and prefix sums (``K`` each), and the current chunk (``n / K`` documents): at
most ~1.5 MB whatever ``n``; at 1e9 documents chunks of 15,259 documents. Zero-length documents take
no tokens and are never in a range.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..permutation import Permutation, positions_of
from ..seeds import derive_seed

MAX_CHUNKS = 1 << 16
"""Most chunks a source is dealt into: bounds the per-cycle tables (8 bytes a chunk, twice)."""

CHUNK_DOCUMENTS = 1 << 12
"""Documents a chunk holds while fewer than ``MAX_CHUNKS`` chunks are needed."""

BLOCK = 1 << 10
"""Consecutive documents dealt together: a chunk is every ``K``-th block of ``BLOCK`` documents, so reading a
chunk's lengths touches one page of a memory map per block, not one per document."""

_READ_ROWS = 1 << 10  # blocks (or contiguous chunks) summed at a time by chunk_tokens: O(1Mi) temporaries

CYCLE_CHUNKS, CHUNK_DOCS = "token-mixture-chunks", "token-mixture-documents"
"""Purposes of the keyed orders (``derive_seed`` paths)."""


def chunk_count(n: int) -> int:
    """Chunks of a source of ``n`` documents: one up to ``CHUNK_DOCUMENTS``, at most ``MAX_CHUNKS``."""
    return 1 if n <= CHUNK_DOCUMENTS else min(MAX_CHUNKS, -(-n // CHUNK_DOCUMENTS))


def chunk_tokens(lengths: Any, chunks: int, *, strided: bool) -> np.ndarray:
    """``(chunks,)`` int64: the tokens of each chunk (strided, else contiguous), one pass over ``lengths`` in blocks."""
    n = len(lengths)
    totals = np.zeros(chunks, dtype=np.int64)
    if not strided:  # chunk k: documents [k * size, (k + 1) * size)
        size = -(-n // chunks)
        for first in range(0, chunks, _READ_ROWS):
            stop = min(chunks, first + _READ_ROWS)
            block = np.asarray(lengths[first * size : min(n, stop * size)], dtype=np.int64)
            totals[first:stop] = np.add.reduceat(block, np.arange(0, block.size, size)) if block.size else 0
        return totals
    blocks = -(-n // BLOCK)  # chunk k: blocks k, k + K, k + 2K, ... of BLOCK documents
    for first in range(0, blocks, _READ_ROWS):
        stop = min(blocks, first + _READ_ROWS)
        read = np.asarray(lengths[first * BLOCK : min(n, stop * BLOCK)], dtype=np.int64)
        sums = np.add.reduceat(read, np.arange(0, read.size, BLOCK))
        np.add.at(totals, np.arange(first, stop) % chunks, sums)
    return totals


class SourceStream:
    """The token stream of one source, cycle by cycle, read by token range.

    Args:
        lengths: the source's document lengths (a 1-D integer array or memory map, read by slices).
        key: the source's key for an epoch (``derive_seed(seed, epoch, source)``); cycles derive from it.
        shuffle: keyed orders; ``False`` reads the documents in index order.
        totals: the chunk totals, if already computed (they do not depend on the key).
    """

    __slots__ = ("_chunk", "_cycle", "chunks", "key", "lengths", "n", "shuffle", "size", "tokens", "totals")

    def __init__(self, lengths: Any, key: int, *, shuffle: bool, totals: np.ndarray | None = None) -> None:
        self.lengths, self.key, self.shuffle = lengths, key, shuffle
        self.n = len(lengths)
        self.chunks = chunk_count(self.n)
        self.size = -(-self.n // self.chunks)  # documents a contiguous chunk holds (without shuffling)
        self.totals = chunk_tokens(lengths, self.chunks, strided=shuffle) if totals is None else totals
        self.tokens = int(self.totals.sum())
        self._cycle: tuple[int, np.ndarray, np.ndarray] | None = None  # (cycle, chunk order, prefix sums)
        self._chunk: tuple[int, int, np.ndarray, np.ndarray] | None = None  # (cycle, chunk, documents, prefix)

    # -- one cycle: the order of chunks and of documents -----------------------------------------
    def _chunk_order(self, cycle: int) -> tuple[np.ndarray, np.ndarray]:
        if self._cycle is None or self._cycle[0] != cycle:
            if self.chunks == 1 or not self.shuffle:
                order = np.arange(self.chunks, dtype=np.int64)
            else:
                order = Permutation(self.chunks, derive_seed(self.key, CYCLE_CHUNKS, cycle))(np.arange(self.chunks))
            prefix = np.zeros(self.chunks + 1, dtype=np.int64)
            np.cumsum(self.totals[order], out=prefix[1:])
            self._cycle = (cycle, order, prefix)
        return self._cycle[1], self._cycle[2]

    def _spans(self, chunk: int) -> list[tuple[int, int]]:
        """The document ranges of ``chunk`` in index order: every ``K``-th block when shuffling, else one range."""
        if self.shuffle:
            firsts = range(chunk * BLOCK, self.n, self.chunks * BLOCK)
            return [(first, min(self.n, first + BLOCK)) for first in firsts]
        return [(chunk * self.size, min(self.n, (chunk + 1) * self.size))]

    def _slot(self, document: int) -> tuple[int, int]:
        """``(chunk, slot)``: the chunk holding ``document`` and its place there in index order."""
        if self.shuffle:
            block = document // BLOCK
            return block % self.chunks, block // self.chunks * BLOCK + document % BLOCK
        return document // self.size, document % self.size

    def _document_permutation(self, cycle: int, chunk: int, size: int) -> Permutation:
        return Permutation(size, derive_seed(self.key, CHUNK_DOCS, cycle, chunk))

    def _chunk_documents(self, cycle: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """The documents of ``chunk`` in the cycle's order, and their prefix sums of tokens."""
        if self._chunk is None or self._chunk[:2] != (cycle, chunk):
            spans = self._spans(chunk)
            members = np.concatenate([np.arange(first, stop, dtype=np.int64) for first, stop in spans])
            sizes = np.concatenate([np.asarray(self.lengths[first:stop], dtype=np.int64) for first, stop in spans])
            if self.shuffle:
                order = self._document_permutation(cycle, chunk, members.size)(np.arange(members.size))
                members, sizes = members[order], sizes[order]
            prefix = np.zeros(members.size + 1, dtype=np.int64)
            np.cumsum(sizes, out=prefix[1:])
            self._chunk = (cycle, chunk, members, prefix)
        return self._chunk[2], self._chunk[3]

    # -- reading ---------------------------------------------------------------------------------
    def pieces(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The documents covering stream tokens ``[first, stop)`` (across cycles) and each one's token range.

        Returns ``(documents, starts, stops)``: document ``documents[k]``'s tokens ``[starts[k],
        stops[k])``, in stream order; a document cut by the range's ends gives its part inside.
        """
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        while first < stop:
            cycle, offset = divmod(first, self.tokens)
            end = min(stop - first, self.tokens - offset) + offset
            self._cycle_pieces(cycle, offset, end, out)
            first += end - offset
        if not out:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, empty
        return tuple(np.concatenate(parts) for parts in zip(*out, strict=True))  # type: ignore[return-value]

    def _cycle_pieces(self, cycle: int, first: int, stop: int, out: list[Any]) -> None:
        order, prefix = self._chunk_order(cycle)
        at = int(np.searchsorted(prefix, first, side="right")) - 1
        while first < stop:
            base = int(prefix[at])
            documents, inner = self._chunk_documents(cycle, int(order[at]))
            low, high = first - base, min(stop, int(prefix[at + 1])) - base
            lo = int(np.searchsorted(inner, low, side="right")) - 1
            hi = int(np.searchsorted(inner, high, side="left"))
            starts = np.maximum(low - inner[lo:hi], 0)
            stops = np.minimum(high - inner[lo:hi], np.diff(inner[lo : hi + 1]))
            keep = starts < stops
            out.append((documents[lo:hi][keep], starts[keep], stops[keep]))
            first = base + high
            at += 1

    def offset_of(self, cycle: int, document: int) -> tuple[int, int]:
        """Where ``document`` lies in the cycle's stream: its first token's offset and its length."""
        order, prefix = self._chunk_order(cycle)
        chunk, slot = self._slot(document)
        rank = int(np.flatnonzero(order == chunk)[0]) if self.chunks > 1 else 0
        documents, inner = self._chunk_documents(cycle, chunk)
        if self.shuffle:
            where = int(positions_of(self._document_permutation(cycle, chunk, documents.size), np.asarray([slot]))[0])
        else:
            where = slot
        return int(prefix[rank] + inner[where]), int(inner[where + 1] - inner[where])
