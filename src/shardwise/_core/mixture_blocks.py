"""The block arithmetic of a mixture: which source, and which draw of it, sits at each plan position, in O(1).

A mixture draws from ``S`` sources of sizes ``n_0 .. n_(S-1)`` with weights ``w_i``. Its global plan
is cut into **blocks** of ``B`` consecutive positions; everything is integer arithmetic.

1. **Exact weights** (:func:`~shardwise._core.weights.exact_weights`). Each weight vector becomes
   integers ``a_i`` with ``D = sum(a_i)``, exactly (``w_i = a_i / D``) when the weights are simple
   fractions (``[0.5, 0.3, 0.2]`` is ``5:3:2``, ``[3, 1]`` is ``3:1``, denominators up to ``2**20``),
   else the nearest multiples of ``2**-30``.
   With prefix sums ``Q_i = a_0 + .. + a_(i-1)`` (``Q_0 = 0``, ``Q_S = D``) and a phase ``phi``,
   ``G_i(m) = floor((Q_i * m + phi) / D)``.
2. **Counts at block boundaries.** After ``m = b * B`` positions (``b`` whole blocks), source ``i``
   has been drawn ``C_i(m) = G_(i+1)(m) - G_i(m)`` times. The ``C_i`` sum to ``m`` exactly (the sum
   telescopes to ``G_S(m) - G_0(m) = m``) and ``|C_i(m) - w_i * m| < 1`` (a difference of two floors
   of values that differ by exactly ``w_i * m``). Block ``b`` holds ``c_i = C_i(m + B) - C_i(m)``
   samples of source ``i``, which is never negative when ``a_i * B >= D``, i.e. ``w_i * B >= 1``
   for every positive weight: the default block is the smallest such ``B``.
3. **Order within a block.** Position ``j`` of block ``b`` holds slot ``v = perm_b(j)``, a keyed
   Feistel bijection of ``[0, B)``; or, with ``interleave`` (and ``shuffle=False``), the golden
   interleave ``v = j * g + o_b mod B`` with ``g`` near ``B`` over the golden ratio and coprime to
   ``B`` and a keyed rotation ``o_b`` per block (0 without shuffling), a low-discrepancy order.
   Slot ``v`` belongs to the source ``i`` with ``P_i <= v < P_(i+1)``, where
   ``P_i = G_i(m + B) - G_i(m)`` is the prefix sum of the block's quotas, found by bisection over
   the sources; it is draw
   ``k = C_i(m) + (v - P_i)`` of source ``i``.
4. **Each source cycles on its own.** Draw ``k`` of source ``i`` is element
   ``perm_(i, cycle)(k mod n_i)`` with ``cycle = k // n_i``: a keyed permutation of the source per
   cycle, so a small source is reshuffled each time it is used up and a large one never repeats
   before it is used up.

So ``position -> (source, draw) -> index`` costs O(log S) arithmetic plus two keyed permutations,
with no table and no replay: resume at any position, at any world size, is O(1).

**The bound** (``w_i`` the exact weights of step 1): over the positions ``[0, m)`` of a stretch of
constant weights, ``|count_i - w_i * m| < 1`` whenever ``m`` is a multiple of ``B``; so any window of
whole blocks deviates by less than 2 (the count is within one of ``w_i * L`` rounded down or up),
whatever its length. A window that cuts blocks adds, for each cut block, the deviation of a prefix of
that block, at most ``max(c_i * (1 - w_i), w_i * (B - c_i)) < w_i * B + 1``; with the shuffled order it
is about ``sqrt(w_i * (1 - w_i) * j)`` for a prefix of ``j`` positions. The interleaved order keeps
a block's prefixes within a few samples of ``w_i * j`` (a Kronecker sequence), so every window stays
within a few samples of its target, as a greedy index does, while the samples drawn stay shuffled.
Note: a draw's number within its source follows the slot value, not the position, so a cut block
holds a subset of its block's draws (whole blocks hold all of them).

**Weight changes** (a :class:`WeightSchedule`) take effect at the first block boundary at or after
their threshold, so a block never mixes two weight vectors; each stretch of constant weights
restarts the count of step 2 from the draws already made. An epoch's plan costs O(changes x S) to
lay out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .permutation import GOLDEN, ROUNDS, cycle_walk, domain_bits, feistel, feistel_rounds, mix64
from .seeds import derive_words
from .weights import Weights

MAX_BLOCK = 1 << 31
"""Largest block: keeps ``j * g`` within int64 for the unshuffled interleave."""

_SLOTS, _DRAWS = "mixture-slots", "mixture-draws"


# -- counting -----------------------------------------------------------------------------------
def floor_share(prefix: Any, m: Any, phase: Any, denominator: Any) -> Any:
    """``G = floor((prefix * m + phase) / denominator)`` without int64 overflow (arrays or ints).

    ``m = q * D + r`` so ``prefix * m / D = prefix * q + prefix * r / D`` with ``prefix * r < D**2 <= 2**62``.
    """
    q, r = m // denominator, m % denominator
    return prefix * q + (prefix * r + phase) // denominator


@dataclass(frozen=True)
class Layout:
    """The stretches of constant weights in one epoch's plan, and the draws made before each.

    Stretch ``s`` starts at block ``first[s]`` (``first[0] == 0``); its weights are ``prefix[s]``
    (``Q_0 .. Q_S``) over ``denominator[s]`` with ``phase[s]``; ``base[s, i]`` counts the draws of
    source ``i`` in the epoch before the stretch. The last stretch runs on without end.
    """

    block: int
    first: np.ndarray  # (K,) int64
    prefix: np.ndarray  # (K, S + 1) int64
    denominator: np.ndarray  # (K,) int64
    phase: np.ndarray  # (K,) int64
    base: np.ndarray  # (K, S) int64

    @property
    def num_sources(self) -> int:
        return int(self.prefix.shape[1]) - 1

    def stretch_of(self, blocks: np.ndarray) -> np.ndarray:
        """The stretch holding each block."""
        found: np.ndarray = np.searchsorted(self.first, blocks, side="right") - 1
        return found

    def counts_at_block(self, block: int) -> list[int]:
        """Draws of each source in the epoch's first ``block`` blocks (exact Python ints)."""
        s = int(self.stretch_of(np.asarray([block]))[0])
        m = (block - int(self.first[s])) * self.block
        q = [floor_share(int(x), m, int(self.phase[s]), int(self.denominator[s])) for x in self.prefix[s]]
        return [int(self.base[s, i]) + q[i + 1] - q[i] for i in range(self.num_sources)]

    def blocks_to_reach(self, source: int, count: int) -> int | None:
        """The fewest whole blocks after which ``source`` has been drawn ``count`` times; None if never."""
        stretches = len(self.first)
        for s in range(stretches):
            base = int(self.base[s, source])
            lo_q, hi_q = int(self.prefix[s, source]), int(self.prefix[s, source + 1])
            phase, denominator = int(self.phase[s]), int(self.denominator[s])

            def drawn(blocks: int, base: int = base, lo_q: int = lo_q, hi_q: int = hi_q, phase: int = phase,
                      denominator: int = denominator) -> int:  # fmt: skip
                m = blocks * self.block
                return int(base + floor_share(hi_q, m, phase, denominator) - floor_share(lo_q, m, phase, denominator))

            if s + 1 < stretches:
                length = int(self.first[s + 1] - self.first[s])
                if drawn(length) < count:
                    continue
            elif hi_q == lo_q:
                return None
            else:
                # C(m) > w * m - 1 reaches count once w * m >= count + 1.
                length = -(-(count + 1 - base) * denominator // ((hi_q - lo_q) * self.block)) + 1
            low, high = 0, max(length, 0)  # drawn(high) >= count; find the least such
            while low < high:
                middle = (low + high) // 2
                if drawn(middle) >= count:
                    high = middle
                else:
                    low = middle + 1
            return int(self.first[s]) + low
        return None


def make_layout(block: int, stretches: Sequence[tuple[int, Weights]], phases: Sequence[int] | None = None) -> Layout:
    """The :class:`Layout` of ``[(first block, weights), ...]`` (first blocks increasing from 0)."""
    count = len(stretches)
    sources = len(stretches[0][1].a)
    first = np.asarray([f for f, _ in stretches], dtype=np.int64)
    prefix = np.asarray([w.prefix for _, w in stretches], dtype=np.int64).reshape(count, sources + 1)
    denominator = np.asarray([w.denominator for _, w in stretches], dtype=np.int64)
    phase = np.asarray(phases if phases is not None else [d // 2 for d in denominator], dtype=np.int64)
    base = np.zeros((count, sources), dtype=np.int64)
    running = [0] * sources
    for s in range(count):
        base[s] = running
        if s + 1 < count:
            m = int(first[s + 1] - first[s]) * block
            q = [floor_share(int(x), m, int(phase[s]), int(denominator[s])) for x in prefix[s]]
            running = [running[i] + q[i + 1] - q[i] for i in range(sources)]
    return Layout(block, first, prefix, denominator, phase, base)


class LayoutBuffer:
    """A :class:`Layout` with room to grow: appending a stretch (an adaptive update) is amortised O(S).

    The rows live in arrays of twice the needed capacity; :meth:`append` writes one row (or
    replaces the last, when the new stretch starts at the same block) and returns a view of the rows.
    """

    __slots__ = ("base", "block", "count", "denominator", "first", "phase", "prefix")

    def __init__(self, layout: Layout) -> None:
        count, sources = len(layout.first), layout.num_sources
        capacity = max(8, 2 * count)
        self.block, self.count = layout.block, count
        self.first = np.zeros(capacity, dtype=np.int64)
        self.prefix = np.zeros((capacity, sources + 1), dtype=np.int64)
        self.denominator = np.ones(capacity, dtype=np.int64)
        self.phase = np.zeros(capacity, dtype=np.int64)
        self.base = np.zeros((capacity, sources), dtype=np.int64)
        for name in ("first", "prefix", "denominator", "phase", "base"):
            getattr(self, name)[:count] = getattr(layout, name)

    def view(self) -> Layout:
        count = self.count
        return Layout(self.block, self.first[:count], self.prefix[:count], self.denominator[:count],
                      self.phase[:count], self.base[:count])  # fmt: skip

    def append(self, first: int, weights: Weights) -> Layout:
        """The layout with ``weights`` from block ``first`` on (at or after the last stretch's first block)."""
        last = self.count - 1
        if first == int(self.first[last]):
            row = last  # the last stretch never drew: replace it (its base stays)
        else:
            base = self.view().counts_at_block(first)
            row = self.count
            if row == len(self.first):
                for name in ("first", "prefix", "denominator", "phase", "base"):
                    old = getattr(self, name)
                    grown = np.zeros((2 * len(old), *old.shape[1:]), dtype=np.int64)
                    grown[: len(old)] = old
                    setattr(self, name, grown)
            self.base[row] = base
            self.count += 1
        self.first[row] = first
        self.prefix[row] = weights.prefix
        self.denominator[row] = weights.denominator
        self.phase[row] = weights.denominator // 2
        return self.view()


# -- positions ----------------------------------------------------------------------------------
def keyed_permute(values: np.ndarray, size: int, rounds: np.ndarray) -> np.ndarray:
    """A Feistel bijection of ``[0, size)`` with cycle walking, keyed per element.

    ``rounds`` is ``(ROUNDS, len(values))`` uint64, one key per round and element: every element is
    permuted by the bijection of its own key, so one call serves many blocks or cycles; or
    ``(ROUNDS,)``, one key for all (cheaper: the common case of a chunk inside one cycle).
    """
    if values.size > _MERGED_MAX:
        return cycle_walk(feistel, values, size, rounds)
    # A small query: walk the whole array (fewer numpy calls than indexing the values still outside).
    bits = domain_bits(size)
    limit = np.uint64(size)
    out = feistel(values.astype(np.uint64), bits, rounds)  # feistel iterates over the rows of rounds
    stray = out >= limit
    while stray.any():
        walked = feistel(out, bits, rounds)
        out = np.where(stray, walked, out)
        stray &= walked >= limit
    return out.astype(np.int64)


def element_keys(base: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Round keys per element, ``(ROUNDS, len(labels))``: the base keys mixed with a hash of each label.

    When every label is the same (a chunk inside one cycle of a source), one key per round, ``(ROUNDS,)``.
    """
    first = labels[:1]
    if labels.size and (labels == first[0]).all():
        salt = mix64(first.astype(np.uint64) * GOLDEN + np.uint64(1))
        uniform: np.ndarray = base ^ salt[0]
        return uniform
    salt = mix64(labels.astype(np.uint64) * GOLDEN + np.uint64(1))
    per_element: np.ndarray = base[:, None] ^ salt[None, :]
    return per_element


def golden_step(block: int) -> int:
    """A multiplier near ``block / golden ratio``, coprime to ``block``: ``j -> j * g mod block`` interleaves evenly."""
    step = max(1, round(block * (math.sqrt(5) - 1) / 2))
    while math.gcd(step, block) != 1:
        step += 1
    return step % block if block > 1 else 0


@dataclass(frozen=True)
class Draws:
    """What plan positions hold: the source and the draw number of that source (both int64 arrays)."""

    sources: np.ndarray
    draws: np.ndarray


def slots(layout: Layout, positions: np.ndarray, slot_keys: np.ndarray | None, interleave: bool = False) -> np.ndarray:
    """The slot each position takes within its block.

    Shuffled: a keyed Feistel bijection per block. Interleaved: ``j * g + o_b mod B``, the golden
    interleave rotated by a keyed offset ``o_b`` per block (``o_b = 0`` without keys), so that ranks
    dealt by stride do not always land on the same sources when the world size divides the pattern.
    """
    block = layout.block
    offsets = positions % block
    if slot_keys is None or interleave:
        found: np.ndarray = offsets * golden_step(block)
        if slot_keys is not None:
            rotation = mix64((positions // block).astype(np.uint64) * GOLDEN ^ slot_keys[0]) % np.uint64(block)
            found += rotation.astype(np.int64)
        found %= block
        return found
    return keyed_permute(offsets, block, element_keys(slot_keys, positions // block))


def locate(layout: Layout, positions: np.ndarray, slot_keys: np.ndarray | None, interleave: bool = False) -> Draws:
    """The source and draw at each epoch position, in O(log S) vectorised steps and O(len) memory."""
    block = layout.block
    blocks = positions // block
    values = slots(layout, positions, slot_keys, interleave)
    stretch = layout.stretch_of(blocks)
    start = (blocks - layout.first[stretch]) * block  # positions into the stretch at the block start
    denominator, phase = layout.denominator[stretch], layout.phase[stretch]

    def share(column: np.ndarray, m: np.ndarray) -> np.ndarray:
        result: np.ndarray = floor_share(layout.prefix[stretch, column], m, phase, denominator)
        return result

    end = start + block
    # Bisection for the source i with P_i <= v < P_(i+1); P_0 = 0 and P_S = B bracket every slot.
    low = np.zeros(len(positions), dtype=np.int64)
    high = np.full(len(positions), layout.num_sources, dtype=np.int64)
    for _ in range(max(1, (layout.num_sources - 1).bit_length())):
        middle = (low + high) // 2
        below = share(middle, end) - share(middle, start) <= values
        low = np.where(below, middle, low)
        high = np.where(below, high, middle)
    source = low
    at_start_low, at_start_high = share(source, start), share(source + 1, start)
    prefix_in_block = share(source, end) - at_start_low
    draws = layout.base[stretch, source] + (at_start_high - at_start_low) + (values - prefix_in_block)
    return Draws(source, draws)


def source_keys(seed: int, epoch: int, count: int) -> np.ndarray:
    """The base round keys of every source's per-cycle permutations for one epoch, ``(count, ROUNDS)``.

    One hash for all sources: a resume builds them once, and SeedSequence costs ~50 us a call.
    """
    return derive_words(seed, epoch, _DRAWS, count=ROUNDS * count).reshape(count, ROUNDS)


def slot_keys_for(seed: int, epoch: int) -> np.ndarray:
    """The base round keys of the block shuffles of one epoch."""
    return derive_words(seed, epoch, _SLOTS, count=ROUNDS)


def draw_indices(found: Draws, sizes: np.ndarray, offsets: np.ndarray, keys: np.ndarray | None) -> np.ndarray:
    """Global indices: draw ``k`` of source ``i`` is ``offsets[i] + perm_(i, k // n_i)(k % n_i)``."""
    if keys is not None and len(found.sources) <= _MERGED_MAX:
        return _draw_indices_merged(found, sizes, offsets, keys)
    out = np.empty(len(found.sources), dtype=np.int64)
    for source in np.unique(found.sources).tolist():
        where = np.flatnonzero(found.sources == source)
        size = int(sizes[source])
        cycles, within = np.divmod(found.draws[where], size)
        if keys is not None and size > 1:
            within = keyed_permute(within, size, element_keys(keys[source], cycles))
        out[where] = within + int(offsets[source])
    return out


_MERGED_MAX = 4096
"""Up to this many positions (a provenance query, a step's batch), every source's draws are permuted in
one vectorised call (per-element domains and keys) rather than one call per source: the cost of a
small query is numpy's per-call overhead, not arithmetic."""


def _draw_indices_merged(found: Draws, sizes: np.ndarray, offsets: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """:func:`draw_indices` in one Feistel pass over all sources (the same bijections, element by element)."""
    sources = found.sources
    size = sizes[sources].astype(np.int64)
    cycles, within = np.divmod(found.draws, size)
    salt = mix64(cycles.astype(np.uint64) * GOLDEN + np.uint64(1))
    rounds = keys[sources].T ^ salt[None, :]  # (ROUNDS, m): element_keys of each element's source and cycle
    live = np.flatnonzero(size > 1)
    permuted = within.copy()
    if live.size:
        permuted[live] = keyed_permute_each(within[live], size[live], rounds[:, live])
    indices: np.ndarray = permuted + offsets[sources]
    return indices


def keyed_permute_each(values: np.ndarray, sizes: np.ndarray, rounds: np.ndarray) -> np.ndarray:
    """:func:`keyed_permute` with a domain ``[0, sizes[i])`` per element (``rounds``: ``(ROUNDS, m)``)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    bits = np.frexp((np.maximum(sizes, 2) - 1).astype(np.float64))[1].astype(np.uint64)  # max(1, bit_length)
    low = bits // np.uint64(2)
    low_mask = (np.uint64(1) << low) - np.uint64(1)
    high_mask = (np.uint64(1) << (bits - low)) - np.uint64(1)
    limit = sizes.astype(np.uint64)
    out = feistel_rounds(values.astype(np.uint64), low, low_mask, high_mask, list(rounds))
    outside = out >= limit
    while outside.any():  # walk the whole (small) array; elements already inside keep their value
        walked = feistel_rounds(out, low, low_mask, high_mask, list(rounds))
        out = np.where(outside, walked, out)
        outside &= walked >= limit
    return out.astype(np.int64)


def counts_before(
    layout: Layout, position: int, slot_keys: np.ndarray | None, interleave: bool = False, *, chunk: int = 1 << 16
) -> list[int]:
    """Draws of each source at epoch positions ``[0, position)``: O(S) for whole blocks plus O(B) for a cut one."""
    block_index, offset = divmod(position, layout.block)
    counts = layout.counts_at_block(block_index)
    first = block_index * layout.block
    for start in range(first, first + offset, chunk):
        positions = np.arange(start, min(start + chunk, first + offset), dtype=np.int64)
        sources = locate(layout, positions, slot_keys, interleave).sources
        for source, extra in enumerate(np.bincount(sources, minlength=layout.num_sources).tolist()):
            counts[source] += extra
    return counts
