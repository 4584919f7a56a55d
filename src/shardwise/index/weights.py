"""The weight table of ``WeightedSampler``: quantised cumulative weights, a guide table, draws by position.

Steps 1 and 2 of the method in :mod:`shardwise.samplers.weighted` (quantise the weights to
integers, their cumulative sum plus a Chen & Asau guide table), the lookup of step 3
(:meth:`WeightTable.draw`: the item holding an exactly uniform integer), and the successive
sampling of an epoch without replacement (:func:`distinct_draws`). The table's arrays may be
memory maps of the node's index cache: every read is checked (``read_checked``).

:class:`WeightsInput` is the one step from whatever a user passes as ``weights`` to that table,
as :class:`~shardwise.index.lengths.LengthsInput` is for lengths: resolved and checked once, its
table (kind ``"weight-table-v1"``, :data:`WEIGHT_TABLE`) built once per weights and node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._core.draws import uniform_below
from .._core.indices import has_bits, mark_bits
from .._core.seeds import derive_words
from .builders import populate_ahead
from .cache import DEFAULT_TIMEOUT, CacheDir
from .inputs import held_in, input_array
from .integrity import read_checked
from .keys import BackgroundDigest
from .tables import Allocate, input_key, mapped_source, reopen, shared_arrays

WEIGHT_TABLE = "weight-table-v1"
"""Cache kind of the weight table (cumulative quantised weights, guide table, positive count, digest)."""

WITHOUT_REPLACEMENT = "weighted-distinct"
"""The plan kind without replacement (its seeds derive from it)."""

_BLOCK = 1 << 16  # weights converted / summed per step while building: temporaries stay in a core's cache
_BITS = 62


def _checked_block(weights: np.ndarray, start: int, stop: int) -> np.ndarray:
    """``weights[start:stop]`` in its own dtype, after checking it is finite and non-negative."""
    block = weights[start:stop]
    low, high = block.min(), block.max()  # a NaN makes both NaN, an infinity shows in one of them
    if not (low >= 0 and high < np.inf):
        at = start + int(np.flatnonzero(~np.isfinite(block) | (block < 0))[0])
        raise ValueError(f"weights should be finite and non-negative, but got weights[{at}]={weights[at].item()!r}")
    return block


class Quantised(NamedTuple):
    """What :func:`quantise` returns."""

    cdf: np.ndarray  # int64 inclusive cumulative sum of the quantised weights
    positive: int  # the number of positive weights (what count_positive(cdf) says), counted on the way


def quantise(
    weights: np.ndarray,
    out: np.ndarray | None = None,
    *,
    on_block: Callable[[np.ndarray], None] | None = None,
) -> Quantised:
    """Validated ``weights`` as the int64 inclusive cumulative sum of their quantised values.

    Two streaming passes in blocks of ``_BLOCK`` weights (the largest weight, then the sums):
    private memory O(block) besides ``out``, which may be a writable memmap. ``on_block`` is
    given every block of the result once written (a view, in order).

    Raises:
        ValueError: a NaN, infinite or negative weight, or all weights zero.
    """
    size = len(weights)
    largest = 0.0
    for start in range(0, size, _BLOCK):
        largest = max(largest, float(_checked_block(weights, start, start + _BLOCK).max()))
    if largest == 0:
        raise ValueError(f"weights should have at least one positive weight, but all {size} weights are zero")
    # scale: largest * 2**scale < 2**(62 - bits(n)), so the n quantised weights sum below 2**62.
    scale = (_BITS - size.bit_length()) - int(np.frexp(largest)[1])
    # x * 2.0**scale is x scaled exactly (as ldexp) while 2.0**scale is a normal double
    factor = 2.0**scale if -1022 <= scale <= 1023 else None
    cdf = np.empty(size, dtype=np.int64) if out is None else out
    offset, count, mapped = 0, 0, 0
    for start in range(0, size, _BLOCK):
        mapped = populate_ahead(cdf, start, mapped)
        block = weights[start : start + _BLOCK]
        scaled = block.astype(np.float64)
        if factor is not None:
            scaled *= factor
        else:
            np.ldexp(scaled, scale, out=scaled)
        units = scaled.astype(np.int64)  # the floor: the values are finite, non-negative and below 2**62
        np.maximum(units, block > 0, out=units)  # a positive weight stays drawable
        count += int(np.count_nonzero(units))
        units[0] += offset
        part = cdf[start : start + len(units)]
        np.cumsum(units, out=part)
        offset = int(part[-1])
        if on_block is not None:
            on_block(part)
    return Quantised(cdf, count)


def guide_shift(total: int, size: int) -> int:
    """Bucket width ``2**shift`` of the guide table: about ``size`` buckets over ``[0, total)``."""
    return max(0, total.bit_length() - size.bit_length() + 1)


def guide_length(total: int, size: int) -> int:
    """Entries of the guide table of ``size`` items with total weight ``total``."""
    return ((total - 1) >> guide_shift(total, size)) + 2


def guide_dtype(size: int) -> np.dtype:
    """int32 below 2**31 items, else int64."""
    return np.dtype(np.int32) if size < 2**31 else np.dtype(np.int64)


def fill_guide(cdf: np.ndarray, out: np.ndarray) -> None:
    """Write the guide table of ``cdf`` into ``out`` (``guide_length`` entries), in blocks.

    ``out[k]`` is the item holding value ``k << shift``: with ``a_i = ceil(cdf[i] / 2**shift)``
    (non-decreasing), it is ``i`` on ``[a_(i-1), a_i)``.
    """
    size, total = len(cdf), int(cdf[-1])
    shift = guide_shift(total, size)
    filled, previous, round_up, mapped = 0, 0, (1 << shift) - 1, 0
    for start in range(0, size, _BLOCK):
        mapped = populate_ahead(out, filled, mapped)
        ceilings = (np.asarray(cdf[start : start + _BLOCK]) + round_up) >> shift
        lengths = np.diff(ceilings, prepend=previous)
        previous = int(ceilings[-1])
        part = np.repeat(np.arange(start, start + len(ceilings), dtype=np.int64), lengths)
        out[filled : filled + len(part)] = part
        filled += len(part)
    out[filled:] = size - 1  # values past the last item's end: clip to the last item


def count_positive(cdf: np.ndarray) -> int:
    """How many items have a positive quantised weight, in blocks."""
    count, previous = 0, 0
    for start in range(0, len(cdf), _BLOCK):
        block = np.asarray(cdf[start : start + _BLOCK])
        count += int(np.count_nonzero(np.diff(block, prepend=previous)))
        previous = int(block[-1])
    return count


class WeightTable:
    """Draws items with probability proportional to integer weights, given as their inclusive cumsum.

    Args:
        cdf: ``(n,)`` non-decreasing int64, ``cdf[-1] < 2**62`` and positive (an array or a memmap).
        guide: its guide table (:func:`fill_guide`), e.g. memory-mapped from the node's cache;
            ``None`` builds it here (O(n) private memory).
    """

    __slots__ = ("cdf", "guide", "shift", "total")

    def __init__(self, cdf: np.ndarray, guide: np.ndarray | None = None) -> None:
        size = len(cdf)
        self.cdf = cdf
        self.total = int(cdf[-1])
        self.shift = guide_shift(self.total, size)
        if guide is None:
            guide = np.empty(guide_length(self.total, size), dtype=guide_dtype(size))
            fill_guide(cdf, guide)
        self.guide = guide

    def __len__(self) -> int:
        return len(self.cdf)

    def __reduce__(self) -> tuple[Any, ...]:
        # A memory-mapped table travels as its file names (spawned workers map the same files).
        parts = []
        for array in (self.cdf, self.guide):
            source = mapped_source(array)
            parts.append((reopen, source) if source is not None else (np.asarray, (array,)))
        return _rebuild_table, tuple(parts)

    def locate(self, values: np.ndarray) -> np.ndarray:
        """The item holding each value in ``[0, total)``: the first ``i`` with ``cdf[i] > value``."""
        bucket = values >> self.shift
        low = read_checked(self.guide, self.guide[bucket]).astype(np.int64)
        high = read_checked(self.guide, self.guide[bucket + 1]).astype(np.int64)
        open_ = np.flatnonzero(low < high)
        while open_.size:
            lows, highs = low[open_], high[open_]
            middle = (lows + highs) >> 1
            above = read_checked(self.cdf, self.cdf[middle]) > values[open_]
            highs = np.where(above, middle, highs)
            lows = np.where(above, lows, middle + 1)
            low[open_], high[open_] = lows, highs
            open_ = open_[lows < highs]
        found: np.ndarray = low
        return found

    def draw(self, positions: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """The item drawn at each stream position (int64), a pure function of ``(keys, position)``."""
        return self.locate(uniform_below(self.total, positions, keys))


def _rebuild_table(*parts: tuple[Any, tuple[Any, ...]]) -> WeightTable:
    cdf, guide = (make(*args) for make, args in parts)
    return WeightTable(cdf, guide)


def distinct_draws(table: WeightTable, count: int, seed: int, epoch: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``count`` distinct items of the with-replacement stream: successive sampling.

    Once the items drawn hold half of the table's weight, the table is rebuilt without them and a
    new stream (keyed by the round) continues: the next new item then has the same distribution,
    the remaining weights renormalised, and repeats stay rare.

    The items are written into ``out`` (``count`` int64, e.g. a writable memmap of the cache
    entry), or into a new array, and returned. Private memory besides ``out``: a bit per item
    (``n / 8`` bytes), a block of at most 2**20 draws, and the rebuilt table while there is one.
    """
    plan = np.empty(count, dtype=np.int64) if out is None else out
    if plan.shape != (count,) or plan.dtype != np.int64:
        raise ValueError(f"out should be a ({count},) int64 array, but got {plan.dtype} of shape {plan.shape}")
    seen = np.zeros((len(table) >> 3) + 1, dtype=np.uint8)  # a bit per item: n / 8 bytes
    have, position, taken, round_ = 0, 0, 0, 0
    while have < count:
        keys = derive_words(seed, epoch, WITHOUT_REPLACEMENT, round_, count=2)
        block = min(max(2 * (count - have), 1024), 1 << 20)
        drawn = table.draw(np.arange(position, position + block, dtype=np.int64), keys)
        position += block
        items, first = np.unique(drawn, return_index=True)
        new = ~has_bits(seen, items)
        fresh = items[new][np.argsort(first[new], kind="stable")][: count - have]
        mark_bits(seen, fresh)
        plan[have : have + len(fresh)] = fresh
        have += len(fresh)
        taken += int((table.cdf[fresh] - np.where(fresh > 0, table.cdf[fresh - 1], 0)).sum())
        if 2 * taken > table.total and have < count:
            units = np.diff(table.cdf, prepend=0)
            units[np.unpackbits(seen, count=len(units), bitorder="little").view(bool)] = 0
            table = WeightTable(np.cumsum(units, out=units))  # in place: one O(n) array, not two
            position, taken, round_ = 0, 0, round_ + 1
    return plan


def build_weight_table(weights: np.ndarray, allocate: Allocate) -> None:
    """Write the table of ``weights``: ``cdf``, ``guide``, ``positive`` (the positive count) and ``digest``."""
    size = len(weights)
    # the digest of the quantised weights (exactly what a plan depends on), hashed on another core as
    # their cumulative sums are written
    with BackgroundDigest(dtype=np.int64, length=size) as hashing:
        cdf, positive = quantise(weights, allocate("cdf", size, np.int64), on_block=hashing.feed)
        fill_guide(cdf, allocate("guide", guide_length(int(cdf[-1]), size), guide_dtype(size)))
        allocate("positive", 1, np.int64)[0] = positive
        allocate("digest", 8, np.uint8)[:] = np.frombuffer(bytes.fromhex(hashing.result()), dtype=np.uint8)


class WeightsInput:
    """One ``weights`` input, resolved and checked once, with its weight table: what ``WeightedSampler`` reads.

    Build it with :meth:`of` (a ``WeightsInput`` given again is returned as is). :attr:`values`
    are the weights as given (a memory map stays one); :meth:`table`, :attr:`positive` and
    :attr:`digest` come from the table, built (two streaming passes, which check every weight)
    or opened when first asked for, so that a sampler checks its other arguments before an O(n)
    build. Cost at 1e9 weights: the input, then the table, 12 GB shared by the node.

    Example:
        >>> weights = WeightsInput.of([0.0, 1.0, 3.0], cache_dir=False)
        >>> len(weights), weights.positive
        (3, 2)
        >>> cdf = weights.table().cdf  # quantised, cumulated: the second weight is 3 times the first
        >>> int(cdf[0]), int((cdf[2] - cdf[1]) // cdf[1])
        (0, 3)
    """

    __slots__ = ("_arrays", "cache_dir", "timeout", "values")

    def __init__(self, values: np.ndarray, *, cache_dir: CacheDir = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.values, self.cache_dir, self.timeout = values, cache_dir, timeout
        self._arrays: dict[str, np.ndarray] | None = None

    @classmethod
    def of(cls, weights: object, *, cache_dir: CacheDir = None, timeout: float = DEFAULT_TIMEOUT) -> WeightsInput:
        """``weights`` as one checked input, or raise naming ``weights`` (``TypeError``/``ValueError``).

        Args:
            weights: 1-D non-negative finite real weights (a sequence, numpy array or memory map, CPU
                tensor, ``pyarrow`` array, HF ``dataset["column"]``), or a ``WeightsInput`` (as is).
            cache_dir: where the table is shared (see :func:`~shardwise.index.build_or_open`).
            timeout: seconds to wait for another process of the node building the same table.
        """
        if isinstance(weights, WeightsInput):
            return weights
        array = input_array("weights", weights, sequence_of="weights", one="weight", kinds="iuf", holds="real numbers")
        return cls(array, cache_dir=cache_dir, timeout=timeout)

    def __len__(self) -> int:
        return len(self.values)

    def _table_arrays(self) -> dict[str, np.ndarray]:
        """The table's arrays, built once per weights and node, then mapped (bad weights: ``ValueError``)."""
        if self._arrays is None:
            values = self.values

            def build(allocate: Allocate) -> None:
                build_weight_table(values, allocate)

            self._arrays = shared_arrays(WEIGHT_TABLE, input_key(values), build, size=len(values),
                                         cache_dir=self.cache_dir, timeout=self.timeout)  # fmt: skip
        return self._arrays

    def table(self) -> WeightTable:
        """The :class:`WeightTable` of these weights (its arrays memory-mapped from the node's cache)."""
        arrays = self._table_arrays()
        return WeightTable(arrays["cdf"], arrays["guide"])

    @property
    def positive(self) -> int:
        """How many weights are positive (what ``replacement=False`` can draw at most)."""
        return int(self._table_arrays()["positive"][0])

    @property
    def digest(self) -> str:
        """The digest (hex) of the quantised weights: exactly what a plan depends on."""
        return bytes(self._table_arrays()["digest"]).hex()

    def __repr__(self) -> str:
        return f"WeightsInput(<{len(self.values)} weights in {held_in(self.values)}>)"
