"""Mixture weights: exact integer shares, temperature weights, and weight schedules (a curriculum).

A weight vector becomes integers ``a_i`` over a denominator ``D`` (:func:`exact_weights`), exactly
when the weights are simple fractions; the block arithmetic of
:mod:`~shardwise._core.mixture_blocks` works on those integers. A :class:`WeightSchedule` changes the
weights with the epoch or with the samples consumed; its thresholds are read and looked up as a
batch-size schedule's are (:mod:`~shardwise._core.thresholds`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .arrays import as_weight_array, check_weight_count, digest
from .errors import check_int
from .public import public
from .thresholds import BY_EPOCH, Stepwise, read_thresholds

WEIGHT_DENOMINATOR = 1 << 30
"""Weights that are not simple fractions are rounded to multiples of ``1 / WEIGHT_DENOMINATOR``."""

MAX_DENOMINATOR = 1 << 31
"""Largest exact denominator ``D``: keeps ``Q_i * (m mod D)`` within int64."""

_SIMPLE = 1 << 20  # denominators tried for an exact fraction per weight


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


CONSTANT, BY_SAMPLES, BY_TOKENS = "constant", "by_samples", "by_tokens"
"""Kinds of :class:`WeightSchedule` (with ``thresholds.BY_EPOCH``); ``by_tokens`` is for mixtures weighted in tokens."""


class WeightSchedule(Stepwise):
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
        return cls(CONSTANT, (0,), (as_weight_array("weights", weights),))

    @classmethod
    def by_samples(cls, points: Mapping[int, Any]) -> WeightSchedule:
        """``{samples consumed (all ranks, whole run): weights}``, e.g. ``{0: [0.9, 0.1], 10**6: [0.5, 0.5]}``."""
        return cls(BY_SAMPLES, *_read_points(points, "samples"))

    @classmethod
    def by_tokens(cls, points: Mapping[int, Any]) -> WeightSchedule:
        """``{tokens consumed (all ranks, whole run): weights}``, for :class:`~shardwise.PackedMixtureSampler`."""
        return cls(BY_TOKENS, *_read_points(points, "tokens"))

    @classmethod
    def by_epoch(cls, points: Mapping[int, Any]) -> WeightSchedule:
        """``{first epoch: weights}``, e.g. ``{0: [0.9, 0.1], 3: [0.5, 0.5]}``."""
        return cls(BY_EPOCH, *_read_points(points, "epoch"))

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
        return self.level_at(epoch, samples)

    def at(self, epoch: int, samples: int) -> list[float]:
        """The weights in effect at ``epoch`` with ``samples`` consumed (as given, not normalised)."""
        return [float(x) for x in self._weights[self.index_at(epoch, samples)]]

    def check_sources(self, count: int) -> None:
        """Raise unless every weight vector has one weight per source."""
        for threshold, weights in zip(self._thresholds, self._weights, strict=True):  # each checked when built
            check_weight_count("weights" if self._kind == CONSTANT else f"weights[{threshold}]", len(weights), count)

    def fingerprint(self) -> str:
        """A digest of the kind, the thresholds and the weights."""
        parts = [np.asarray(self._thresholds, dtype=np.int64), *self._weights]
        return f"{self._kind}:" + digest(np.concatenate([p.astype(np.float64) for p in parts]))

    def __repr__(self) -> str:
        if self._kind == CONSTANT:
            return f"WeightSchedule.constant({self._weights[0].tolist()!r})"
        points = {t: w.tolist() for t, w in zip(self._thresholds, self._weights, strict=True)}
        return f"WeightSchedule.{self._kind}({points!r})"


def _read_points(points: object, unit: str) -> tuple[tuple[int, ...], tuple[np.ndarray, ...]]:
    """Validate ``{threshold: weights}`` (see :func:`~shardwise._core.thresholds.read_thresholds`)."""
    thresholds, vectors = read_thresholds("weights", points, unit, "weights", as_weight_array)
    lengths = {len(v) for v in vectors}
    if len(lengths) > 1:
        raise ValueError(
            f"weights schedule entries should all have one weight per source, but got lengths {sorted(lengths)}"
        )
    return thresholds, vectors


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


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(WeightSchedule, temperature_weights)
