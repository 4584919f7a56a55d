"""Staggered streams: a locality-aware keyed permutation whose shards start and end one at a time.

NOTE [ Staggered streams ]
The window plan (NOTE [ Locality-aware shuffle ] in ``locality.py``) mixes ``window`` shards, then
the next ``window``: at each boundary every shard of the next window starts at once, so a loader
that prefetches holds two windows, and same-shard neighbours fall only as ``1 / window``. This plan
mixes ``streams`` shards at every position with shards starting and ending at staggered times:

1. the shard order is permuted per epoch (keyed): slot ``j`` holds shard ``order[j]``;
2. the slots, in order, are cut into ``k <= streams`` runs of about ``n / streams`` samples
   (``stream_cuts``: a slot goes to the run its middle sample falls in; a shard larger than
   ``n / streams`` is a run of its own): stream ``i`` reads its run's shards one after the other,
   each shard's samples in a keyed order of their own;
3. the streams are interleaved in proportion to their sizes ``T_i``: the plan is cut into ``K``
   blocks; block ``b`` holds elements ``[floor(T_i b / K), floor(T_i (b + 1) / K))`` of every stream
   ``i`` (about four positions a stream), in a keyed order of the block.

Every stream advances at the same rate, so at each position about ``k`` shards are being read, one
a stream, and a shard ends while the others are midway: a cache holds the ``k`` shards being read
and the one or two starting next. Two consecutive positions come from one stream, hence nearly
always from one shard, with probability ``sum_i (T_i / n)**2``: about ``1 / streams`` because the
runs hold equal samples, on even and uneven shards alike (plan 1 dealt the slots round robin: on
shards of sizes spread 1:1000 the streams' totals differed several times over, and same-shard
neighbours rose to about twice ``1 / streams``). A shard of ``f n`` samples, ``f > 1 / streams``,
is read over the whole epoch at rate ``f``, as a uniform shuffle reads it.
``bench/bench_shuffle_locality.py``: at the same cache bytes,
about half the same-shard neighbours of the window plan; fewer than MosaicML Streaming's ``py1e``
over tens of shards, as many over 1,000 shards from 8 streams up (with fewer streams the cache's
peak is set by moments when several streams read their largest shards at once). Like every
plan it is a bijection on ``[0, n)`` and a pure function of ``(key, position)``: independent of the
world size, exact to resume, invertible (``positions_of``).

Cost: ``O(S + k)`` memory (shard order, shard and slot offsets: 24 bytes a shard, 2.4 MB at 1e5
shards, 1e9 samples included), ``O(k + log S)`` per position: the block and shard orders are keyed
bijections computed per element (``groups.permute_within``), nothing materialised. Numpy only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np

from .errors import check_int
from .groups import group_keys, permute_within, unpermute_within
from .locality import LocalityPermutation, check_shard_sizes, split_wrap
from .permutation import Permutation, inverse_permutation
from .seeds import derive_seed

SHARDS = "stream-shard-order"
BLOCK = "stream-block"
SAMPLES = "stream-shard-samples"
PER_STREAM = 4  # positions a stream holds in a block: the interleave's granularity
_MAX_BLOCKS = (1 << 31) - 1  # keeps floor(T_i * b / K) exact in int64 (r_i * b < K**2 < 2**62)
_ROWS = 1 << 20  # position x stream cells computed at once (bounds temporaries to ~8 MB an array)
_MARGIN = 4  # blocks the floating-point estimate of a position's block may be off by, looked up around it

PLAN_VERSION = 2
"""The version of the stream plan (1: slots dealt to the streams round robin, so on uneven shards a
stream could hold several times another's samples, and same-shard neighbours rose to ~0.19 at 8
streams; 2: the slots cut into runs of about ``n / streams`` samples, ``stream_cuts``). States of
another version are refused."""


class Mixing(str, enum.Enum):
    """How a locality plan mixes the shards it holds (``LocalitySampler(mixing=...)``)."""

    WINDOWS = "windows"
    """``window`` shards mixed together, then the next ``window`` (NOTE [ Locality-aware shuffle ])."""
    STREAMS = "streams"
    """``window`` streams, each reading one shard at a time, interleaved (NOTE [ Staggered streams ])."""


class StreamPermutation:
    """Keyed bijection on the global sample ids of sharded data that reads ``streams`` shards at a time.

    Global sample ids number the samples shard by shard: shard ``s`` holds ids
    ``[starts[s], starts[s] + sizes[s])``. See NOTE [ Staggered streams ].

    Args:
        sizes: ``(S,)`` samples per shard (zeros allowed).
        streams: shards read at once (``>= S``: every shard at once, one stream each).
        key: 64-bit key of the epoch; derive it with :func:`shardwise._core.seeds.derive_seed`.

    Example:
        >>> perm = StreamPermutation([3, 0, 5, 2], streams=2, key=7)
        >>> sorted(perm(np.arange(10)).tolist()) == list(range(10))
        True
    """

    __slots__ = ("_block_key", "_blocks", "_key", "_n", "_order", "_q", "_r", "_shard_key", "_shard_starts",
                 "_sm_starts", "_stream_first", "_streams", "_totals")  # fmt: skip
    mixing = Mixing.STREAMS

    def __init__(self, sizes: object, *, streams: int, key: int) -> None:
        sizes = check_shard_sizes("sizes", sizes)
        streams = check_int("streams", streams, minimum=1)
        self._key = check_int("key", key, minimum=0, maximum=2**64 - 1)
        n_shards = len(sizes)
        self._shard_starts = np.zeros(n_shards + 1, dtype=np.int64)  # (S + 1,) first id of each shard
        np.cumsum(sizes, out=self._shard_starts[1:])
        self._n = n = int(self._shard_starts[-1])
        # order: (S,) slot -> shard, the epoch's shard order
        self._order = Permutation(n_shards, derive_seed(self._key, SHARDS))(np.arange(n_shards))
        # Stream-major layout = slot order: each stream reads a run of consecutive slots (NOTE, step 2).
        self._sm_starts = np.zeros(n_shards + 1, dtype=np.int64)  # (S + 1,) first element of each slot
        np.cumsum(sizes[self._order], out=self._sm_starts[1:])
        self._stream_first = stream_cuts(self._sm_starts, max(1, min(streams, n_shards)))  # (k + 1,)
        self._streams = k = len(self._stream_first) - 1
        offsets = self._sm_starts[self._stream_first]  # (k + 1,) first element of each stream
        self._totals = np.diff(offsets)  # (k,) T_i
        self._blocks = max(1, min(n // (PER_STREAM * k), _MAX_BLOCKS))  # K
        self._q, self._r = np.divmod(self._totals, self._blocks)  # T_i = q_i K + r_i
        self._block_key = derive_seed(self._key, BLOCK)
        self._shard_key = derive_seed(self._key, SAMPLES)

    def __len__(self) -> int:
        return self._n

    @property
    def streams(self) -> int:
        """Shards read at once (at most the number of shards)."""
        return self._streams

    def shard_order(self) -> np.ndarray:
        """``(S,)`` shard ids by slot: stream ``i`` reads slots ``i, i + streams, ...`` in turn."""
        order: np.ndarray = self._order.copy()
        return order

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """The shard holding each global sample id."""
        return np.searchsorted(self._shard_starts, np.asarray(ids, dtype=np.int64), side="right") - 1

    # -- the interleave: blocks of the plan, chunks of the streams ------------------------------------
    def _chunk_start(self, streams: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """``floor(T_i b / K)``, exactly: the first element of stream ``i`` in block ``b`` (broadcast)."""
        found: np.ndarray = self._q[streams] * blocks + (self._r[streams] * blocks) // self._blocks
        return found

    def _chunks(self, blocks: np.ndarray) -> np.ndarray:
        """``(m, k)`` first element of every stream in each block (``blocks`` may be ``K``: the ends)."""
        return self._chunk_start(np.arange(self._streams)[None, :], blocks[:, None])

    def _block_start(self, blocks: np.ndarray) -> np.ndarray:
        """The first plan position of each block (``K``: ``n``)."""
        found: np.ndarray = self._chunks(blocks).sum(axis=1)
        return found

    def _block_of(self, positions: np.ndarray) -> np.ndarray:
        """The block holding each plan position: the last ``b`` with ``B(b) <= p``.

        Positions of a few blocks (a rank's chunk: ascending, ``W`` apart) look up every block start
        of their span at once, O(span * k); scattered ones settle block by block (``_settle``).
        """
        estimate = positions.astype(np.float64) * self._blocks / max(self._n, 1)
        if positions.size:
            low = max(0, int(estimate.min()) - _MARGIN)
            high = min(self._blocks, int(estimate.max()) + _MARGIN + 1)  # the start of the block after the last
            if high - low <= 2 * positions.size + 64:
                starts = self._block_start(np.arange(low, high + 1))
                if starts[0] <= positions.min() and positions.max() < starts[-1]:
                    found: np.ndarray = low + np.searchsorted(starts, positions, side="right") - 1
                    return found
        return self._settle(estimate, positions, self._block_start)

    def _stream_block_of(self, streams: np.ndarray, elements: np.ndarray) -> np.ndarray:
        """The block holding element ``e`` of stream ``i``: the last ``b`` with ``floor(T_i b / K) <= e``."""
        totals = np.maximum(self._totals[streams], 1).astype(np.float64)
        estimate = np.ceil((elements + 1).astype(np.float64) * self._blocks / totals) - 1
        return self._settle(estimate, elements, lambda blocks: self._chunk_start(streams, blocks))

    def _settle(self, estimate: np.ndarray, values: np.ndarray, start: Callable[[np.ndarray], np.ndarray]
                ) -> np.ndarray:
        """The last block ``b`` with ``start(b) <= value``, from a floating-point estimate a block or two off."""
        top = self._blocks - 1
        blocks: np.ndarray = np.clip(estimate.astype(np.int64), 0, top)
        for _ in range(64):  # each step moves every block by one
            down = start(blocks) > values
            up = (blocks < top) & (start(blocks + 1) <= values)
            if not (down.any() or up.any()):
                return blocks
            blocks = blocks - down + up
        raise AssertionError("StreamPermutation: block search did not converge")  # pragma: no cover

    def _in_block(self, blocks: np.ndarray, sizes: np.ndarray, values: np.ndarray, *, inverse: bool) -> np.ndarray:
        """Each block's keyed order (``_core.groups``): the slot at position ``values`` (or, inverted, the position)."""
        keys = group_keys(self._block_key, blocks)
        way = unpermute_within if inverse else permute_within
        return way(values, sizes, keys)

    def _in_shard(self, shards: np.ndarray, offsets: np.ndarray, *, inverse: bool) -> np.ndarray:
        """Each shard's keyed sample order: the sample read ``offsets``-th (or, inverted, when a sample is read)."""
        sizes = self._shard_starts[shards + 1] - self._shard_starts[shards]
        keys = group_keys(self._shard_key, shards)
        way = unpermute_within if inverse else permute_within
        return way(offsets, sizes, keys)

    # -- the plan ---------------------------------------------------------------------------------
    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Global sample ids at plan ``positions`` (int array, each in ``[0, n)``), int64 of the same shape."""
        return self._in_pieces(self._ids, positions)

    def _in_pieces(self, function: Callable[[np.ndarray], np.ndarray], values: np.ndarray) -> np.ndarray:
        """``function`` over ``values``, a piece at a time (a piece's ``(m, k)`` temporaries stay bounded)."""
        values = np.asarray(values, dtype=np.int64)
        flat = values.ravel()
        out = np.empty_like(flat)
        step = max(1, _ROWS // self._streams)
        for begin in range(0, flat.size, step):
            out[begin : begin + step] = function(flat[begin : begin + step])
        return out.reshape(values.shape)

    def _ids(self, flat: np.ndarray) -> np.ndarray:
        blocks = self._block_of(flat)
        touched, which = np.unique(blocks, return_inverse=True)
        chunks = self._chunks(touched)  # (u, k)
        ends = self._chunks(touched + 1)
        starts = chunks.sum(axis=1)
        sizes = ends.sum(axis=1) - starts
        slot = self._in_block(touched[which], sizes[which], flat - starts[which], inverse=False)
        widths = np.cumsum(ends - chunks, axis=1)  # (u, k) slots of streams 0..i in each block
        streams = (widths[which] <= slot[:, None]).sum(axis=1)  # the stream of each slot
        before = np.where(streams > 0, widths[which, np.maximum(streams - 1, 0)], 0)
        elements = chunks[which, streams] + (slot - before)  # element of the stream
        return self._ids_of_elements(streams, elements)

    def _ids_of_elements(self, streams: np.ndarray, elements: np.ndarray) -> np.ndarray:
        sm = self._sm_starts[self._stream_first[streams]] + elements  # stream-major element
        index = np.searchsorted(self._sm_starts, sm, side="right") - 1
        shards = self._order[index]
        offsets = sm - self._sm_starts[index]
        ids: np.ndarray = self._shard_starts[shards] + self._in_shard(shards, offsets, inverse=False)
        return ids

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """The plan positions holding global sample ``ids`` (the inverse of calling the plan)."""
        return self._in_pieces(self._positions, ids)

    def _positions(self, flat: np.ndarray) -> np.ndarray:
        shards = self.shard_of(flat)
        offsets = self._in_shard(shards, flat - self._shard_starts[shards], inverse=True)
        slots = inverse_permutation(self._order)[shards]
        streams = np.searchsorted(self._stream_first, slots, side="right") - 1
        elements = self._sm_starts[slots] + offsets - self._sm_starts[self._stream_first[streams]]
        blocks = self._stream_block_of(streams, elements)
        touched, which = np.unique(blocks, return_inverse=True)
        chunks = self._chunks(touched)
        ends = self._chunks(touched + 1)
        starts = chunks.sum(axis=1)
        sizes = ends.sum(axis=1) - starts
        before = np.cumsum(ends - chunks, axis=1) - (ends - chunks)  # (u, k) slots of streams before i
        slot = before[which, streams] + elements - chunks[which, streams]
        found: np.ndarray = starts[which] + self._in_block(touched[which], sizes[which], slot, inverse=True)
        return found

    # -- what a cache needs -----------------------------------------------------------------------
    def upcoming_shards(self, positions: np.ndarray, ahead: int) -> np.ndarray:
        """Shards ``positions`` read, then the ``ahead`` next shards of every stream, in the order they start.

        Padded positions wrapped back into the plan (see :func:`split_wrap`) add only their own shards.
        """
        ahead_of, wrapped = split_wrap(positions)
        if ahead_of.size == 0:
            return ahead_of
        k = np.arange(self._streams)
        blocks = self._block_of(ahead_of[[0, -1]])
        first = self._chunk_start(k, np.full(self._streams, blocks[0]))  # (k,) elements read first and last
        last = self._chunk_start(k, np.full(self._streams, blocks[1] + 1)) - 1
        base = self._sm_starts[self._stream_first[:-1]]
        lo = np.searchsorted(self._sm_starts, base + first, side="right") - 1
        hi = np.searchsorted(self._sm_starts, base + np.maximum(last, first), side="right") - 1
        ends = self._stream_first[1:]
        stop = hi
        for _ in range(ahead):  # the stream's next shard that holds samples (empty ones are skipped)
            following = np.searchsorted(self._sm_starts, self._sm_starts[np.minimum(stop + 1, len(self._order))],
                                        side="right") - 1
            stop = np.where(following < ends, following, stop)
        index = np.concatenate([np.arange(a, min(b + 1, e)) for a, b, e in zip(lo, stop, ends, strict=True)])
        index = index[self._sm_starts[index + 1] > self._sm_starts[index]]  # empty shards are never read
        streams = np.searchsorted(self._stream_first, index, side="right") - 1
        begins = (self._sm_starts[index] - base[streams]) / np.maximum(self._totals[streams], 1)
        shards = self._order[index[np.argsort(begins, kind="stable")]]
        extra = self.shard_of(self(wrapped))
        return np.asarray(list(dict.fromkeys([*shards.tolist(), *extra.tolist()])), dtype=np.int64)

    def mixed_shards(self, positions: np.ndarray) -> int:
        """Shards a reader of ``positions`` has open at once: one a stream, and one starting."""
        return self._streams + 1

    def __repr__(self) -> str:
        return f"StreamPermutation(n={self._n}, shards={len(self._order)}, streams={self._streams})"


def stream_cuts(slot_starts: np.ndarray, streams: int) -> np.ndarray:
    """``(k + 1,)`` first slot of each stream: the slots cut into ``k <= streams`` runs of ~``n / streams`` samples.

    A slot goes to stream ``floor(streams * m / n)``, ``m`` the middle of its samples in slot order;
    streams left empty (a shard larger than ``n / streams`` spans their share) are dropped, so a
    large shard is a stream of its own, read at its share of the plan. Stream totals differ from
    ``n / streams`` by at most one shard.
    """
    n_slots = len(slot_starts) - 1
    total = int(slot_starts[-1])
    if n_slots == 0:
        return np.zeros(2, dtype=np.int64)
    middles = slot_starts[:-1] + slot_starts[1:]  # 2 m: exact in int64 (n < 2**62)
    # floor(streams * m / n) = #{j >= 1 : 2 m >= ceil(2 n j / streams)}, in Python ints: no overflow
    bounds = np.asarray([-(-2 * total * j // streams) for j in range(1, streams)], dtype=np.int64)
    raw = np.searchsorted(bounds, middles, side="right")  # (S,) non-decreasing
    firsts = np.flatnonzero(np.diff(raw, prepend=-1) > 0)
    return np.append(firsts, n_slots).astype(np.int64)


def locality_plan(sizes: object, *, window: int, mixing: Mixing, key: int) -> LocalityPermutation | StreamPermutation:
    """The epoch's locality plan over ``sizes``: ``window`` shards at a time, mixed as ``mixing`` says."""
    if mixing is Mixing.STREAMS:
        return StreamPermutation(sizes, streams=window, key=key)
    return LocalityPermutation(sizes, window=window, key=key)
