"""How many tokens of each source a packed mixture's batch holds: cumulative quotas, exact per batch.

A batch is ``T = rows_per_batch * max_len`` tokens. Under weights ``a_i / D`` (exact integers,
:func:`~shardwise._core.weights.exact_weights`), the first ``j`` batches of a weight segment hold

    Q_i(j) = floor(a_i * j * T / D)                for every source but the absorber,
    Q_m(j) = j * T - sum of the others' Q_i(j)     for the absorber ``m`` (the largest weight),

tokens of source ``i`` (NOTE [ Monotone quotas ]). Batch ``j`` holds ``Q_i(j + 1) - Q_i(j)`` tokens:
within one token of ``a_i * T / D`` for every source but the absorber, within ``S - 1`` for it, so
every window of whole batches is within ``S`` tokens of its target share, whatever its length, and
a source whose share of a batch is at least one token is in every batch. Python integers
throughout: ``a_i * j * T`` passes int64 at 1e9 batches of 64Ki tokens.

NOTE [ Monotone quotas ]: largest-remainder rounding of ``w_i * j * T`` sums exactly but is not
monotone in ``j`` (Hamilton's method has the Alabama paradox): a batch could get a negative count.
Floors are monotone; the absorber takes what the floors leave (fewer than ``S`` tokens), and its
count per batch is at least ``a_m * T / D - (S - 1) >= T / S - S + 1``, positive when ``T >= S**2``,
which the plan checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..weights import Weights


@dataclass(frozen=True)
class QuotaSegment:
    """Constant weights from batch ``start`` of an epoch on, with every source's tokens before it."""

    start: int
    before: tuple[int, ...]
    weights: Weights

    @property
    def absorber(self) -> int:
        """The source that takes the floors' remainder: the largest weight (the first of equals)."""
        a = self.weights.a
        return max(range(len(a)), key=lambda i: (a[i], -i))

    def cumulative(self, batch: int, tokens_per_batch: int) -> list[int]:
        """Every source's tokens in batches ``[0, batch)`` of the epoch (``batch >= start``)."""
        a, denominator = self.weights.a, self.weights.denominator
        total = (batch - self.start) * tokens_per_batch
        grown = [a_i * total // denominator for a_i in a]
        absorber = self.absorber
        grown[absorber] = total - (sum(grown) - grown[absorber])
        return [b + g for b, g in zip(self.before, grown, strict=True)]


def check_quota_size(tokens_per_batch: int, sources: int) -> None:
    """Refuse batches too small for monotone quotas (NOTE [ Monotone quotas ])."""
    if tokens_per_batch < sources * sources:
        raise ValueError(
            f"rows_per_batch * max_len should be at least sources**2 = {sources * sources} tokens (each of "
            f"{sources} sources needs room in every batch), but got {tokens_per_batch}; raise max_len or rows_per_batch"
        )


class EpochQuotas:
    """An epoch's weight segments: the tokens of each source before any batch, in O(log segments)."""

    __slots__ = ("_segments", "tokens_per_batch")

    def __init__(self, first: Weights, tokens_per_batch: int) -> None:
        self.tokens_per_batch = tokens_per_batch
        self._segments = [QuotaSegment(0, (0,) * len(first.a), first)]

    @property
    def segments(self) -> tuple[QuotaSegment, ...]:
        return tuple(self._segments)

    def change(self, batch: int, weights: Weights) -> None:
        """New weights from batch ``batch`` on (at or after the last change)."""
        last = self._segments[-1]
        if batch < last.start:
            raise ValueError(f"weight changes should come in order, but got batch {batch} after {last.start}")
        if weights == last.weights:
            return
        before = tuple(last.cumulative(batch, self.tokens_per_batch))
        if batch == last.start:
            self._segments[-1] = QuotaSegment(batch, last.before, weights)
        else:
            self._segments.append(QuotaSegment(batch, before, weights))

    def segment_at(self, batch: int) -> QuotaSegment:
        low, high = 0, len(self._segments) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self._segments[middle].start <= batch:
                low = middle
            else:
                high = middle - 1
        return self._segments[low]

    def cumulative(self, batch: int) -> list[int]:
        """Every source's tokens in the epoch's batches ``[0, batch)``."""
        return self.segment_at(batch).cumulative(batch, self.tokens_per_batch)

    def batch_tokens(self, batch: int) -> list[tuple[int, int]]:
        """Every source's token range ``[first, stop)`` of its epoch stream that batch ``batch`` holds."""
        before, after = self.cumulative(batch), self.cumulative(batch + 1)
        return list(zip(before, after, strict=True))

    def first_reaching(self, source: int, tokens: int, *, limit: int) -> int | None:
        """The fewest batches (at most ``limit``) holding at least ``tokens`` of ``source``; ``None`` if more."""
        if self.cumulative(limit)[source] < tokens:
            return None
        low, high = 0, limit
        while low < high:
            middle = (low + high) // 2
            if self.cumulative(middle)[source] >= tokens:
                high = middle
            else:
                low = middle + 1
        return low

    def batch_of(self, source: int, token: int, *, limit: int) -> int:
        """The batch (below ``limit``) whose range of ``source`` holds stream token ``token``; ``limit`` if none."""
        reached = self.first_reaching(source, token + 1, limit=limit)
        return limit if reached is None else reached - 1
