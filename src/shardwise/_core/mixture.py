"""Mixture plans: which source, and which draw of it, sits at each plan position, in O(1) from the position.

A mixture draws from ``S`` sources of sizes ``n_0 .. n_(S-1)`` with weights ``w_i``. Its global plan
is cut into **blocks** of ``B`` consecutive positions; everything is integer arithmetic.

1. **Exact weights.** Each weight vector becomes integers ``a_i`` with ``D = sum(a_i)``, exactly
   (``w_i = a_i / D``) when the weights are simple fractions (``[0.5, 0.3, 0.2]`` is ``5:3:2``,
   ``[3, 1]`` is ``3:1``, denominators up to ``2**20``), else the nearest multiples of ``2**-30``.
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

import enum
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .arrays import as_weight_array, digest
from .errors import check_int
from .permutation import ROUNDS, feistel, mix64
from .seeds import derive_words

WEIGHT_DENOMINATOR = 1 << 30
"""Weights that are not simple fractions are rounded to multiples of ``1 / WEIGHT_DENOMINATOR``."""

MAX_DENOMINATOR = 1 << 31
"""Largest exact denominator ``D``: keeps ``Q_i * (m mod D)`` within int64."""

MAX_BLOCK = 1 << 31
"""Largest block: keeps ``j * g`` within int64 for the unshuffled interleave."""

_SIMPLE = 1 << 20  # denominators tried for an exact fraction per weight
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SLOTS, _DRAWS = "mixture-slots", "mixture-draws"


# -- weights ------------------------------------------------------------------------------------
def exact_weights(weights: np.ndarray) -> tuple[tuple[int, ...], int]:
    """Validated float weights as integers ``a_i`` and their sum ``D``: ``w_i / sum(w) == a_i / D``.

    Exact when each weight is a fraction with denominator up to ``2**20`` (to double precision) and
    the common denominator stays below ``2**31``; otherwise the nearest multiples of ``2**-30``
    (largest remainder, so they sum to ``2**30`` exactly; a positive weight stays positive).
    """
    fractions = [Fraction(float(w)).limit_denominator(_SIMPLE) for w in weights]
    close = (abs(float(f) - float(w)) <= 1e-12 * float(w) for f, w in zip(fractions, weights, strict=True))
    if all(close):
        total = sum(fractions, Fraction(0))
        shares = [f / total for f in fractions]
        common = math.lcm(*(s.denominator for s in shares))
        if common <= MAX_DENOMINATOR:
            return tuple(int(s * common) for s in shares), common
    scaled = weights / weights.sum() * WEIGHT_DENOMINATOR
    floors = np.floor(scaled).astype(np.int64)
    floors = np.maximum(floors, (weights > 0).astype(np.int64))
    short = WEIGHT_DENOMINATOR - int(floors.sum())
    order = np.argsort(-(scaled - np.floor(scaled)), kind="stable")
    order = order[weights[order] > 0]  # a zero weight stays zero, whatever the rounding of the others
    if short >= 0:
        floors[order[:short]] += 1
    else:  # positive weights lifted to 1 overshoot: take the excess from the largest weights
        for at in np.argsort(-floors, kind="stable")[:-short]:
            floors[at] -= 1
    return tuple(int(a) for a in floors), WEIGHT_DENOMINATOR


def temperature_weights(sizes: Sequence[int] | np.ndarray, alpha: object) -> list[float]:
    """Temperature sampling weights ``w_i ~ n_i ** alpha``, normalised to sum to 1.

    ``alpha = 1`` draws in proportion to the sizes, ``alpha = 0`` uniformly over the sources, and
    values in between up-weight small sources (``alpha = 0.3`` is common for multilingual corpora,
    i.e. a temperature ``T = 1 / alpha``).

    Example:
        >>> [round(w, 3) for w in temperature_weights([900, 100], alpha=0.5)]
        [0.75, 0.25]
    """
    from .arrays import as_size_array

    array = as_size_array("sizes", sizes).astype(np.float64)
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha should be a real number, but got alpha={alpha!r} ({type(alpha).__name__})")
    alpha = float(alpha)
    if not math.isfinite(alpha) or alpha < 0:
        raise ValueError(
            f"alpha should be a finite number >= 0 (0: uniform over sources, 1: proportional to size), but got "
            f"alpha={alpha!r}"
        )
    # Divide by the largest first: n ** alpha overflows for large n and alpha.
    powered = (array / array.max()) ** alpha
    return [float(x) for x in powered / powered.sum()]


@dataclass(frozen=True)
class Weights:
    """One weight vector as exact integers: ``a`` (one per source) over ``denominator``."""

    a: tuple[int, ...]
    denominator: int

    @property
    def prefix(self) -> tuple[int, ...]:
        """``Q_0 .. Q_S``: ``0, a_0, a_0 + a_1, ..., D``."""
        out = [0]
        for value in self.a:
            out.append(out[-1] + value)
        return tuple(out)

    def smallest_block(self) -> int:
        """The least ``B`` with ``a_i * B >= D`` for every positive ``a_i`` (every block holds them all)."""
        return max(-(-self.denominator // a) for a in self.a if a > 0)

    def shares(self) -> list[float]:
        return [a / self.denominator for a in self.a]


_CONSTANT, _BY_SAMPLES, _BY_EPOCH = "constant", "by_samples", "by_epoch"


class WeightSchedule:
    """Mixture weights as a function of the epoch or of the samples consumed (a curriculum).

    Build one with :meth:`constant`, :meth:`by_samples` or :meth:`by_epoch`. ``samples`` counts plan
    positions over all ranks together across the run (epoch ``e`` starts where epoch ``e - 1``'s
    plan ended), so a schedule never depends on the world size. A change takes effect at the first
    block boundary at or after its threshold (at most ``block - 1`` samples late), mid-epoch too.

    Example:
        >>> schedule = WeightSchedule.by_samples({0: [0.9, 0.1], 10_000: [0.5, 0.5]})
        >>> schedule.at(epoch=0, samples=12_000)
        [0.5, 0.5]
    """

    __slots__ = ("_kind", "_thresholds", "_weights")

    def __init__(self, kind: str, thresholds: tuple[int, ...], weights: tuple[np.ndarray, ...]) -> None:
        """Use the constructors; this one takes validated parts."""
        self._kind, self._thresholds, self._weights = kind, thresholds, weights

    @classmethod
    def constant(cls, weights: Any) -> WeightSchedule:
        """The same weights for the whole run."""
        return cls(_CONSTANT, (0,), (as_weight_array("weights", weights),))

    @classmethod
    def by_samples(cls, points: Mapping[int, Any]) -> WeightSchedule:
        """``{samples consumed (all ranks, whole run): weights}``, e.g. ``{0: [0.9, 0.1], 10**6: [0.5, 0.5]}``."""
        return cls(_BY_SAMPLES, *_read_points(points, "samples"))

    @classmethod
    def by_epoch(cls, points: Mapping[int, Any]) -> WeightSchedule:
        """``{first epoch: weights}``, e.g. ``{0: [0.9, 0.1], 3: [0.5, 0.5]}``."""
        return cls(_BY_EPOCH, *_read_points(points, "epoch"))

    @property
    def kind(self) -> str:
        """``"constant"``, ``"by_samples"`` or ``"by_epoch"``."""
        return self._kind

    @property
    def thresholds(self) -> tuple[int, ...]:
        return self._thresholds

    @property
    def weights(self) -> tuple[np.ndarray, ...]:
        return self._weights

    def index_at(self, epoch: int, samples: int) -> int:
        """Which entry applies at ``epoch`` with ``samples`` consumed over the run.

        Raises:
            TypeError: ``epoch`` or ``samples`` is not an integer (a float or bool).
            ValueError: ``epoch`` or ``samples`` is negative.
        """
        epoch, samples = check_int("epoch", epoch, minimum=0), check_int("samples", samples, minimum=0)
        value = epoch if self._kind == _BY_EPOCH else samples
        return int(np.searchsorted(np.asarray(self._thresholds), value, side="right")) - 1

    def at(self, epoch: int, samples: int) -> list[float]:
        """The weights in effect at ``epoch`` with ``samples`` consumed (as given, not normalised)."""
        return [float(x) for x in self._weights[self.index_at(epoch, samples)]]

    def check_sources(self, count: int) -> None:
        """Raise unless every weight vector has one weight per source."""
        for threshold, weights in zip(self._thresholds, self._weights, strict=True):
            name = "weights" if self._kind == _CONSTANT else f"weights[{threshold}]"
            as_weight_array(name, weights, length=count)

    def fingerprint(self) -> str:
        """A digest of the kind, the thresholds and the weights."""
        parts = [np.asarray(self._thresholds, dtype=np.int64), *self._weights]
        return f"{self._kind}:" + digest(np.concatenate([p.astype(np.float64) for p in parts]))

    def __repr__(self) -> str:
        if self._kind == _CONSTANT:
            return f"WeightSchedule.constant({self._weights[0].tolist()!r})"
        points = {t: w.tolist() for t, w in zip(self._thresholds, self._weights, strict=True)}
        return f"WeightSchedule.{self._kind}({points!r})"


def _read_points(points: object, unit: str) -> tuple[tuple[int, ...], tuple[np.ndarray, ...]]:
    """Validate ``{threshold: weights}``: thresholds from 0, strictly increasing, in the order given."""
    if not isinstance(points, Mapping) or not points:
        raise TypeError(f"weights should be a non-empty mapping {{{unit}: weights}} starting at 0, but got {points!r}")
    thresholds: list[int] = []
    vectors: list[np.ndarray] = []
    for key, value in points.items():
        threshold = check_int(f"weights schedule key ({unit})", key, minimum=0)
        if thresholds and threshold <= thresholds[-1]:
            raise ValueError(
                f"weights schedule {unit} thresholds should be strictly increasing, but got {threshold} after "
                f"{thresholds[-1]}; list the entries in order"
            )
        vectors.append(as_weight_array(f"weights[{threshold}]", value))
        thresholds.append(threshold)
    if thresholds[0] != 0:
        raise ValueError(
            f"weights schedule should start at {unit} 0 (the weights before the first change), but its first key is "
            f"{thresholds[0]}"
        )
    lengths = {len(v) for v in vectors}
    if len(lengths) > 1:
        raise ValueError(
            f"weights schedule entries should all have one weight per source, but got lengths {sorted(lengths)}"
        )
    return tuple(thresholds), tuple(vectors)


def as_weight_schedule(weights: object) -> WeightSchedule:
    """A :class:`WeightSchedule` as is, else constant weights."""
    if isinstance(weights, WeightSchedule):
        return weights
    if isinstance(weights, Mapping):
        raise TypeError(
            "weights should be a sequence of weights or a WeightSchedule, but got a mapping; "
            "use WeightSchedule.by_samples(...) or WeightSchedule.by_epoch(...)"
        )
    return WeightSchedule.constant(weights)


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


# -- positions ------------------------------------------------------------------------------------
def keyed_permute(values: np.ndarray, size: int, rounds: np.ndarray) -> np.ndarray:
    """A Feistel bijection of ``[0, size)`` with cycle walking, keyed per element.

    ``rounds`` is ``(ROUNDS, len(values))`` uint64, one key per round and element: every element is
    permuted by the bijection of its own key, so one call serves many blocks or cycles; or
    ``(ROUNDS,)``, one key for all (cheaper: the common case of a chunk inside one cycle).
    """
    bits = max(1, (size - 1).bit_length())
    limit = np.uint64(size)
    out = feistel(values.astype(np.uint64), bits, rounds)  # feistel iterates over the rows of rounds
    outside = np.flatnonzero(out >= limit)
    while outside.size:
        walked = feistel(out[outside], bits, rounds[:, outside] if rounds.ndim == 2 else rounds)
        out[outside] = walked
        outside = outside[walked >= limit]
    return out.astype(np.int64)


def element_keys(base: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Round keys per element, ``(ROUNDS, len(labels))``: the base keys mixed with a hash of each label.

    When every label is the same (a chunk inside one cycle of a source), one key per round, ``(ROUNDS,)``.
    """
    first = labels[:1]
    if labels.size and (labels == first[0]).all():
        salt = mix64(first.astype(np.uint64) * _GOLDEN + np.uint64(1))
        uniform: np.ndarray = base ^ salt[0]
        return uniform
    salt = mix64(labels.astype(np.uint64) * _GOLDEN + np.uint64(1))
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
            rotation = mix64((positions // block).astype(np.uint64) * _GOLDEN ^ slot_keys[0]) % np.uint64(block)
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


def draw_indices(
    found: Draws, sizes: np.ndarray, offsets: np.ndarray, keys: np.ndarray | None
) -> np.ndarray:
    """Global indices: draw ``k`` of source ``i`` is ``offsets[i] + perm_(i, k // n_i)(k % n_i)``."""
    out = np.empty(len(found.sources), dtype=np.int64)
    for source in np.unique(found.sources).tolist():
        where = np.flatnonzero(found.sources == source)
        size = int(sizes[source])
        cycles, within = np.divmod(found.draws[where], size)
        if keys is not None and size > 1:
            within = keyed_permute(within, size, element_keys(keys[source], cycles))
        out[where] = within + int(offsets[source])
    return out


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


# -- the plan of a mixture --------------------------------------------------------------------------
class MixtureStop(str, enum.Enum):
    """Where an epoch of a mixture ends."""

    NUM_SAMPLES = "num_samples"
    """After ``num_samples`` plan positions."""
    FIRST_EXHAUSTED = "first_exhausted"
    """At the end of the block in which the first source has been drawn as many times as it has samples."""
    ALL_EXHAUSTED = "all_exhausted"
    """At the end of the block in which the last source has been drawn as many times as it has samples."""
    PRIMARY = "primary"
    """At the end of the block in which the ``primary`` source has been drawn as many times as it has samples."""


class MixturePlan:
    """The global plan of a mixture, epoch by epoch: sizes, stop rule and the positions' indices.

    Holds O(sources x weight changes) integers and a cache of the latest epoch's layout; nothing
    grows with the number of samples. ``epoch_start`` for a ``by_samples`` schedule with an
    exhaustion stop memoises one integer per epoch (each epoch's length depends on the weights, which
    depend on where the epoch starts).

    Args:
        sizes: ``(S,)`` positive int64 source sizes.
        schedule: the weights (one per source in every entry).
        stop: the epoch's end.
        num_samples: plan positions per epoch with ``MixtureStop.NUM_SAMPLES``.
        primary: the source that ends the epoch with ``MixtureStop.PRIMARY``.
        block: positions per block; ``None``: the smallest block every weight allows.
        shuffle: shuffle within blocks and within sources.
        interleave: order each block by the golden interleave (rotated per block when shuffling)
            instead of shuffling it; the samples drawn from each source stay shuffled.
    """

    def __init__(
        self,
        sizes: np.ndarray,
        schedule: WeightSchedule,
        *,
        stop: MixtureStop,
        num_samples: int | None,
        primary: int | None,
        block: int | None,
        shuffle: bool,
        interleave: bool = False,
    ) -> None:
        self.sizes = sizes
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.schedule = schedule
        schedule.check_sources(len(sizes))
        self.entries = [Weights(*exact_weights(w)) for w in schedule.weights]
        self.stop, self.num_samples, self.primary, self.shuffle = stop, num_samples, primary, shuffle
        self.interleave = interleave or not shuffle
        need = max(w.smallest_block() for w in self.entries)
        if block is None:
            self.block = need
        else:
            self.block = check_int("block", block, minimum=1, maximum=MAX_BLOCK)
            if self.block < need:
                raise ValueError(
                    f"block should be at least {need}, so that every block holds at least one sample of each source "
                    f"with a positive weight (the smallest weight is 1/{need} or more of the mix), but got "
                    f"block={block}; pass block>={need} or raise the smallest weight"
                )
        if need > MAX_BLOCK:
            raise ValueError(
                f"weights whose smallest share is below 1/{MAX_BLOCK} are not supported; raise the smallest weight"
            )
        if stop is MixtureStop.PRIMARY:
            if primary is None:
                raise ValueError("primary should be the index of the source that ends the epoch with stop='primary'")
            entries = self.entries[-1:] if schedule.kind == _BY_SAMPLES else self.entries
            for entry in entries:
                if entry.a[primary] == 0:
                    raise ValueError(
                        f"primary={primary} has weight 0 in a weights entry, so stop='primary' would never end the "
                        f"epoch; give source {primary} a positive weight"
                    )
        self._starts: list[int] = [0]
        self._layout: tuple[int, Layout] | None = None
        self._keys: tuple[int, int, np.ndarray | None, np.ndarray | None] | None = None

    @property
    def num_sources(self) -> int:
        return len(self.sizes)

    def epoch_start(self, epoch: int) -> int:
        """Plan positions of all earlier epochs together (the ``samples`` of a schedule)."""
        if self.stop is MixtureStop.NUM_SAMPLES:
            return epoch * int(self.num_samples or 0)
        return self._memo_start(epoch)

    def _memo_start(self, epoch: int) -> int:
        while len(self._starts) <= epoch:
            e = len(self._starts) - 1
            self._starts.append(self._starts[e] + self.plan_size(e))
        return self._starts[epoch]

    def layout(self, epoch: int) -> Layout:
        """Where the weights change in ``epoch``'s plan, and the draws made before each change."""
        if self._layout is not None and self._layout[0] == epoch:
            return self._layout[1]
        schedule = self.schedule
        if schedule.kind != _BY_SAMPLES:
            stretches = [(0, self.entries[schedule.index_at(epoch, 0)])]
        else:
            start = self.epoch_start(epoch)
            stretches = [(0, self.entries[schedule.index_at(epoch, start)])]
            end = start + self.num_samples if self.num_samples is not None else None
            for threshold, entry in zip(schedule.thresholds, self.entries, strict=True):
                if threshold <= start or (end is not None and threshold >= end):
                    continue
                first = -(-(threshold - start) // self.block)
                if first == stretches[-1][0]:
                    stretches[-1] = (first, entry)
                else:
                    stretches.append((first, entry))
        layout = make_layout(self.block, stretches)
        self._layout = (epoch, layout)
        return layout

    def plan_size(self, epoch: int) -> int:
        """Plan positions in ``epoch``."""
        if self.stop is MixtureStop.NUM_SAMPLES:
            return int(self.num_samples or 0)
        layout = self.layout(epoch)
        primary = self.stop is MixtureStop.PRIMARY
        sources = [int(self.primary or 0)] if primary else list(range(self.num_sources))
        reached = [layout.blocks_to_reach(i, int(self.sizes[i])) for i in sources]
        blocks = [b for b in reached if b is not None]
        if not blocks:
            raise RuntimeError(f"no source of the mixture is ever exhausted in epoch {epoch}: every weight is zero")
        chosen = min(blocks) if self.stop is MixtureStop.FIRST_EXHAUSTED else max(blocks)
        return chosen * self.block

    def _epoch_keys(self, seed: int, epoch: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        if not self.shuffle:
            return None, None
        if self._keys is None or self._keys[:2] != (seed, epoch):
            self._keys = (seed, epoch, slot_keys_for(seed, epoch), source_keys(seed, epoch, self.num_sources))
        return self._keys[2], self._keys[3]

    def locate(self, seed: int, epoch: int, positions: np.ndarray) -> Draws:
        """Source and draw number at each position of ``epoch``'s plan."""
        slot_keys, _ = self._epoch_keys(seed, epoch)
        return locate(self.layout(epoch), positions, slot_keys, self.interleave)

    def indices(self, seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The global (concatenated) index at each position of ``epoch``'s plan."""
        slot_keys, keys = self._epoch_keys(seed, epoch)
        found = locate(self.layout(epoch), positions, slot_keys, self.interleave)
        return draw_indices(found, self.sizes, self.offsets, keys)

    def counts(self, seed: int, epoch: int, position: int) -> list[int]:
        """Draws of each source in ``epoch`` before ``position`` (O(S) + O(block))."""
        slot_keys, _ = self._epoch_keys(seed, epoch)
        return counts_before(self.layout(epoch), position, slot_keys, self.interleave)

    def weights_at(self, epoch: int, position: int) -> list[float]:
        """The exact weights (shares summing to 1) in effect at ``position`` of ``epoch``."""
        layout = self.layout(epoch)
        s = int(layout.stretch_of(np.asarray([position // self.block]))[0])
        prefix = layout.prefix[s]
        return [float(x) for x in np.diff(prefix) / float(layout.denominator[s])]
