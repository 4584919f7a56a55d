"""The plan of a packed mixture weighted in tokens: epoch sizes, weight segments, and every batch's rows.

Batch ``j`` of epoch ``e`` holds, of every source ``i``, the tokens ``[Q_i(j), Q_i(j + 1))`` of the
source's stream for the epoch (:mod:`.quotas`: exact to a token per batch; :mod:`.streams`: the
source's documents in keyed orders, cycle after cycle), dealt within its group of batches for equal
attention cost (:mod:`.balance`) and filled into full rows (:mod:`.rows`). Every batch is found from
its position in O(sources x (chunks + chunk) + group) without replay or table, and nothing depends
on the world size.
"""

from __future__ import annotations

import bisect
import enum
from typing import Any

import numpy as np

from ..adaptive import known_prefix
from ..mixture import PendingWeightsError
from ..offsets import offsets_from_counts
from ..seeds import derive_seed
from ..thresholds import BY_EPOCH
from ..weights import BY_TOKENS, Weights, WeightSchedule, exact_weights
from .balance import deal_group
from .quotas import EpochQuotas, check_quota_size
from .rows import cut_rows, fill_rows
from .streams import SourceStream, chunk_count, chunk_tokens

SOURCE_STREAM, ROW_ORDER = "token-mixture-source", "token-mixture-rows"
"""Purposes of the plan's keys (``derive_seed`` paths)."""


class TokenStop(str, enum.Enum):
    """Where an epoch of a packed mixture ends."""

    NUM_BATCHES = "num_batches"
    """After ``num_batches`` batches."""
    ALL_EXHAUSTED = "all_exhausted"
    """At the first batch by which every source with a positive weight has given all its tokens."""
    FIRST_EXHAUSTED = "first_exhausted"
    """At the first batch by which some source with a positive weight has given all its tokens."""


class TokenMixturePlan:
    """The global plan of a packed mixture: batches of ``rows_per_batch`` full rows of ``max_len`` tokens.

    Args:
        lengths: one 1-D integer array (or memory map) of document lengths per source.
        schedule: the weights, shares of tokens: constant, ``by_epoch`` or ``by_tokens``.
        max_len: tokens per row.
        rows_per_batch: rows per batch (a plan unit).
        stop: the epoch's end; ``num_batches`` with :attr:`TokenStop.NUM_BATCHES`.
        shuffle: keyed orders of documents, chunks and pieces; ``False``: index order, sources' pieces
            in source order.
        totals: every source's chunk totals (:func:`.streams.chunk_tokens`), if computed already.
        balance_group: batches dealt together for equal attention cost (:mod:`.balance`); 1 (and without
            shuffling): each batch reads its sources' stream ranges as they come.
    """

    def __init__(
        self,
        lengths: list[Any],
        schedule: WeightSchedule,
        *,
        max_len: int,
        rows_per_batch: int,
        stop: TokenStop,
        num_batches: int | None,
        shuffle: bool,
        totals: list[np.ndarray] | None = None,
        balance_group: int = 1,
    ) -> None:
        self.balance_group = balance_group if shuffle else 1  # without shuffling: index order, batch after batch
        self.lengths, self.schedule, self.shuffle = lengths, schedule, shuffle
        self.max_len, self.rows_per_batch = max_len, rows_per_batch
        self.tokens_per_batch = max_len * rows_per_batch
        self.stop, self.num_batches = stop, num_batches
        self.sizes = np.asarray([len(x) for x in lengths], dtype=np.int64)
        self.offsets = offsets_from_counts(self.sizes)[:-1]  # where each source starts in the concatenation
        check_quota_size(self.tokens_per_batch, len(lengths))
        self.totals = totals or [chunk_tokens(x, chunk_count(len(x)), strided=shuffle) for x in lengths]
        self.source_tokens = np.asarray([int(t.sum()) for t in self.totals], dtype=np.int64)
        self._entries = [Weights(*exact_weights(np.asarray(w, dtype=np.float64))) for w in schedule.weights]
        for entry, threshold in zip(self._entries, schedule.thresholds, strict=True):
            self._check_tokens(entry, threshold)
        self._starts: list[int] = [0]  # batches before each epoch, memoised
        # Weights by run batch: the initial ones, then every by_tokens change (at the first batch at or after
        # its threshold) or adaptive update (``extend``); known_until: batches past the ledger's are refused.
        self._change_at, self._changes = [0], [self._entries[0]]
        if schedule.kind == BY_TOKENS:
            for threshold, entry in zip(schedule.thresholds[1:], self._entries[1:], strict=True):
                self.extend(-(-threshold // self.tokens_per_batch), entry, 0)
        self.known_until: int | None = None
        self._quotas: tuple[int, EpochQuotas] | None = None
        self._streams: tuple[int, int, list[SourceStream]] | None = None  # (epoch, seed, streams)
        self._dealt: tuple[int, int, int, list[Any]] | None = None  # (epoch, seed, group, its batches' pieces)

    def _check_tokens(self, weights: Weights, threshold: int) -> None:
        empty = [i for i, (a, tokens) in enumerate(zip(weights.a, self.source_tokens, strict=True)) if a and not tokens]
        if empty:
            kind = self.schedule.kind
            where = "" if kind == "constant" else f" (weights from {kind} threshold {threshold})"
            raise ValueError(
                f"lengths of source {empty[0]} add up to 0 tokens, but its weight is positive{where}: a source "
                f"with a weight needs tokens; give it weight 0 or leave it out"
            )

    # -- weights and sizes -----------------------------------------------------------------------
    def epoch_start(self, epoch: int) -> int:
        """Batches of the run before ``epoch`` (all ranks together)."""
        while len(self._starts) <= epoch:
            self._starts.append(self._starts[-1] + self.epoch_size(len(self._starts) - 1))
        return self._starts[epoch]

    def quotas(self, epoch: int) -> EpochQuotas:
        """The epoch's weight segments: its ``by_epoch`` weights, or every change at a run batch placed on its batch."""
        if self._quotas is None or self._quotas[0] != epoch:
            if self.schedule.kind == BY_EPOCH:
                quotas = EpochQuotas(self._entries[self.schedule.level_at(epoch, 0)], self.tokens_per_batch)
            else:
                start = self.epoch_start(epoch)
                at = bisect.bisect_right(self._change_at, start) - 1
                quotas = EpochQuotas(self._changes[at], self.tokens_per_batch)
                later = zip(self._change_at[at + 1 :], self._changes[at + 1 :], strict=True)
                for batch, weights in later:  # only with num_batches (by_tokens, adaptive): the size is known
                    if batch >= start + self.epoch_size(epoch):
                        break
                    quotas.change(batch - start, weights)
            self._quotas = (epoch, quotas)
        return self._quotas[1]

    def reveal_until(self, known_until: int) -> None:
        """Run batches below ``known_until`` are known (an adaptive ledger's reach): units past it are refused."""
        self.known_until = known_until

    def renewed(self, block: int = 1) -> TokenMixturePlan:
        """A plan of the same sources, schedule and stop rule, before any update ``extend`` added.

        What a resume replays a saved adaptive ledger onto (``Feedback.plan_of``); the sources' chunk
        totals are shared, not recomputed. ``block``: 1, as a packed plan's weights change at any batch.
        """
        if block != 1:
            raise ValueError(f"block should be 1 for a packed mixture (weights change at any batch), but got {block}")
        return TokenMixturePlan(self.lengths, self.schedule, max_len=self.max_len, rows_per_batch=self.rows_per_batch,
                                stop=self.stop, num_batches=self.num_batches, shuffle=self.shuffle, totals=self.totals,
                                balance_group=self.balance_group)  # fmt: skip

    def extend(self, batch: int, weights: Weights, known_until: int) -> None:
        """New weights from run batch ``batch`` on (an adaptive ledger's update); batches below ``known_until`` known.

        NOTE [ An adaptive ledger is a weight schedule written at run time ] (``_core/adaptive``).
        """
        last = self._change_at[-1]
        if batch < last:
            raise ValueError(f"weight changes should come in order, but got run batch {batch} after {last}")
        if batch == last:
            self._changes[-1] = weights
        else:
            self._change_at.append(batch)
            self._changes.append(weights)
        self.known_until = known_until
        self._quotas = self._dealt = None

    def weights_at(self, epoch: int, batch: int) -> list[float]:
        """The weights in force at batch ``batch`` of ``epoch`` (exact shares summing to 1)."""
        return self.quotas(epoch).segment_at(batch).weights.shares()

    def known_prefix(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The leading ``positions`` of ``epoch`` whose weights are known (a pass stops there until the next update).

        Raises:
            PendingWeightsError: not even the first one is known.
        """
        if self.known_until is None:
            return positions
        return known_prefix(positions, self.known_until - self.epoch_start(epoch), lambda p: self.check_known(epoch, p))

    def check_known(self, epoch: int, positions: np.ndarray) -> None:
        """Raise :class:`PendingWeightsError` if a position's weights are not known yet."""
        if self.known_until is not None and positions.size:
            self._refuse_unknown(epoch, int(positions.max()))

    def _refuse_unknown(self, epoch: int, batch: int) -> None:
        run = self.epoch_start(epoch) + batch
        if self.known_until is not None and run >= self.known_until:
            raise PendingWeightsError(
                f"batch {batch} of epoch {epoch} (run batch {run}) draws with weights that no update has set yet: "
                f"the ledger holds them up to run batch {self.known_until}. Call sampler.adaptive.update() on every "
                "rank when sampler.adaptive.update_due()"
            )

    def epoch_size(self, epoch: int) -> int:
        """Batches in ``epoch``."""
        if self.stop is TokenStop.NUM_BATCHES:
            assert self.num_batches is not None
            return self.num_batches
        quotas = self.quotas(epoch)
        weights = quotas.segments[0].weights
        reach = []
        for source, (a, tokens) in enumerate(zip(weights.a, self.source_tokens, strict=True)):
            if a:
                guess = -(-int(tokens) * weights.denominator // (a * self.tokens_per_batch)) + 1  # floors: enough
                reached = quotas.first_reaching(source, int(tokens), limit=guess)
                assert reached is not None, "a source's floor quota reaches its tokens by the guess"
                reach.append(reached)
        return max(1, max(reach) if self.stop is TokenStop.ALL_EXHAUSTED else min(reach))

    # -- the batches -----------------------------------------------------------------------------
    def streams(self, epoch: int, seed: int) -> list[SourceStream]:
        if self._streams is None or self._streams[:2] != (epoch, seed):
            streams = [
                SourceStream(x, derive_seed(seed, epoch, SOURCE_STREAM, i), shuffle=self.shuffle, totals=t)
                for i, (x, t) in enumerate(zip(self.lengths, self.totals, strict=True))
            ]
            self._streams = (epoch, seed, streams)
        return self._streams[2]

    def batch(self, epoch: int, seed: int, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Batch ``batch`` of ``epoch``: ``(ids, rows, starts, stops)``, ids in the sources' concatenation.

        Raises:
            PendingWeightsError: an adaptive ledger has not set the batch's weights yet.
        """
        self._refuse_unknown(epoch, batch)
        if self.balance_group > 1:
            group = self._group(epoch, seed, batch // self.balance_group)
            ids, starts, stops = group[batch % self.balance_group]
        else:
            parts = [self._source_pieces(epoch, seed, source, first, stop)
                     for source, (first, stop) in enumerate(self.quotas(epoch).batch_tokens(batch))]  # fmt: skip
            ids, starts, stops = (np.concatenate(p) for p in zip(*parts, strict=True))
        if not self.shuffle:  # the sources' pieces in order, cut every max_len
            return cut_rows(ids, starts, stops, max_len=self.max_len)
        return fill_rows(ids, starts, stops, max_len=self.max_len, key=derive_seed(seed, epoch, ROW_ORDER, batch))

    def _source_pieces(
        self, epoch: int, seed: int, source: int, first: int, stop: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Source ``source``'s stream tokens ``[first, stop)`` of ``epoch`` as pieces, ids in the concatenation."""
        documents, starts, stops = self.streams(epoch, seed)[source].pieces(first, stop)
        return documents + self.offsets[source], starts, stops

    def _group(self, epoch: int, seed: int, group: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The batches of a balancing group (:mod:`.balance`), computed once and kept while the pass reads them."""
        if self._dealt is None or self._dealt[:3] != (epoch, seed, group):
            first = group * self.balance_group
            last = min(first + self.balance_group, self.epoch_size(epoch))
            self._refuse_unknown(epoch, last - 1)  # a group is dealt whole: every batch's weights known
            quotas = self.quotas(epoch)
            bounds = np.asarray([quotas.cumulative(b) for b in range(first, last + 1)], dtype=np.int64)  # (G + 1, S)
            sources = [self._source_pieces(epoch, seed, s, int(bounds[0, s]), int(bounds[-1, s]))
                       for s in range(len(self.lengths))]  # fmt: skip
            self._dealt = (epoch, seed, group, deal_group(sources, np.diff(bounds, axis=0), self.max_len))
        return self._dealt[3]

    def source_of(self, index: int) -> tuple[int, int]:
        """``(source, document)`` of a global id."""
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return source, index - int(self.offsets[source])

    def positions_of(self, epoch: int, seed: int, index: int) -> np.ndarray:
        """Every batch of ``epoch`` holding a piece of global id ``index``, once a piece, sorted (every cycle)."""
        source, document = self.source_of(index)
        size = self.epoch_size(epoch)
        quotas = self.quotas(epoch)
        drawn = quotas.cumulative(size)[source]  # the source's tokens in the epoch
        tokens = int(self.source_tokens[source])
        stream = self.streams(epoch, seed)[source]
        found: list[int] = []
        for cycle in range(-(-drawn // tokens) if tokens else 0):
            offset, length = stream.offset_of(cycle, document)
            first = cycle * tokens + offset
            if not length or first >= drawn:
                continue
            last = min(first + length, drawn) - 1
            low, high = quotas.batch_of(source, first, limit=size), quotas.batch_of(source, last, limit=size)
            found.extend(range(low, high + 1))
        group = self.balance_group
        if group > 1:  # dealt within its group: any batch of the groups the stream range touches
            groups = sorted({b // group for b in found})
            found = [b for g in groups for b in range(g * group, min(size, g * group + group))]
        # a piece per row it spans: count them in each batch found (O(batch) each, provenance only)
        pieces = [int(np.count_nonzero(self.batch(epoch, seed, b)[0] == index)) for b in sorted(set(found))]
        return np.repeat(np.asarray(sorted(set(found)), dtype=np.int64), pieces)
