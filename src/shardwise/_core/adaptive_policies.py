"""Adaptive mixture policies: the next weights as a pure function of the ledger and the reported statistics.

:class:`Exp3` (an ODM-style bandit with decaying exploration) and :class:`ExponentiatedGradient`
(DoReMi-style, a softmax-of-loss rule at ``smoothing=1``), the :class:`Policy` protocol a user's own
policy follows, and :class:`AdaptiveWeights`, the configuration a ``MixtureSampler`` takes. The
ledger and the statistics are :mod:`shardwise._core.adaptive`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .adaptive import SHARE_DENOMINATOR, SourceStatistics, WeightLedger, quantize_shares
from .arrays import as_weight_array
from .errors import check_int
from .public import public


def check_real(name: str, value: object, *, low: float, high: float, low_open: bool = False) -> float:
    """``value`` as a float in ``[low, high]`` (``(low, high]`` with ``low_open``), or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} should be a real number, but got {name}={value!r} ({type(value).__name__})")
    result = float(value)
    inside = (result > low if low_open else result >= low) and result <= high
    if not math.isfinite(result) or not inside:
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} should be a number in {bracket}{low:g}, {high:g}], but got {name}={value!r}")
    return result


# -- policies --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyStep:
    """What a policy returns: the next weights (any non-negative floats) and its new state vector."""

    weights: np.ndarray
    state: np.ndarray


@runtime_checkable
class Policy(Protocol):
    """An adaptive mixture policy: the next weights from the ledger so far and the reduced statistics.

    It must be a pure function of its arguments (every rank calls it with the same ones, and a
    resumed run calls it again). Two weight vectors differ when ``lag >= 1`` (the default):
    ``statistics.drawn`` are the weights the reported interval was drawn with (what an importance
    weight divides by), ``ledger.latest`` the last update's decision, which takes effect ``lag``
    intervals after it was made and so has drawn nothing the statistics report yet.
    ``ledger.state`` is the vector it returned last time (``initial_state`` before the first update).
    """

    def __call__(self, ledger: WeightLedger, statistics: SourceStatistics) -> PolicyStep | Any: ...


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    result: np.ndarray = shifted / shifted.sum()
    return result


def _with_floor(distribution: np.ndarray, floor: float) -> np.ndarray:
    result: np.ndarray = floor + (1.0 - floor * len(distribution)) * distribution
    return result


@dataclass(frozen=True)
class ExponentiatedGradient:
    """Exponentiated-gradient weights on the reported loss (DoReMi-style), smoothed, with a floor.

    ``log p <- (1 - smoothing) * log p + rate * loss`` for every source with samples in the
    interval, then ``w = floor + (1 - S * floor) * softmax(log p)``. ``smoothing=0`` is the plain
    exponentiated-gradient step (weights follow the cumulative loss); ``smoothing=1`` is
    ``softmax(rate * loss)`` of the latest interval (a softmax-of-loss rule with temperature
    ``1 / rate``). Report an excess loss (loss minus a reference model's) for DoReMi proper.

    Args:
        rate: step size ``eta`` (> 0).
        smoothing: in ``[0, 1]``: how much of the past the log-weights forget at each update.
        floor: every source keeps at least this weight, in ``[0, 1 / S)``.
    """

    rate: float = 1.0
    smoothing: float = 0.1
    floor: float = 0.05

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", check_real("rate", self.rate, low=0.0, high=1e6, low_open=True))
        object.__setattr__(self, "smoothing", check_real("smoothing", self.smoothing, low=0.0, high=1.0))
        object.__setattr__(self, "floor", check_real("floor", self.floor, low=0.0, high=1.0))

    def initial_state(self, weights: np.ndarray) -> np.ndarray:
        result: np.ndarray = np.log(np.maximum(weights, 1e-300))
        return result

    def __call__(self, ledger: WeightLedger, statistics: SourceStatistics) -> PolicyStep:
        logits = ledger.state.copy()
        seen = statistics.counts > 0
        logits[seen] = (1.0 - self.smoothing) * logits[seen] + self.rate * statistics.means[seen]
        logits -= logits.max()  # keeps the state bounded; softmax is shift-invariant
        return PolicyStep(_with_floor(_softmax(logits), self.floor), logits)

    def config(self) -> dict[str, Any]:
        return {"policy": "ExponentiatedGradient", "rate": self.rate, "smoothing": self.smoothing, "floor": self.floor}


@dataclass(frozen=True)
class Exp3:
    """An EXP3 bandit over the sources with decaying exploration, as Online Data Mixing (Albalak et al. 2023).

    The reward of a source is its reported mean loss (a source the model still learns from pays
    more). At update ``t`` the importance-weighted estimate of each source with samples is
    ``R_i <- smoothing * R_i + (1 - smoothing) * loss_i / w_i`` (``w_i``: its weight while the
    interval was drawn, ``statistics.drawn``; not ``ledger.latest``, the weights of the last
    update, which at ``lag >= 1`` drew none of it), the exploration rate is
    ``eps_t = min(1 / S, sqrt(ln S / (S * t)))``, and the weights are
    ``(1 - S * e) * softmax(eps_(t-1) * R) + e`` with ``e = max(eps_t, floor)``: uniform while
    ``eps_t = 1 / S`` (the first ``S ln S`` updates: 3 for 3 sources), then moving.

    Args:
        smoothing: in ``[0, 1)``: the moving average of the reward estimates.
        floor: exploration never drops below this weight per source, in ``[0, 1 / S)``.
    """

    smoothing: float = 0.9
    floor: float = 0.02

    def __post_init__(self) -> None:
        object.__setattr__(self, "smoothing", check_real("smoothing", self.smoothing, low=0.0, high=1.0))
        if self.smoothing == 1.0:
            raise ValueError("smoothing should be a number in [0, 1) (1 would never learn), but got smoothing=1.0")
        object.__setattr__(self, "floor", check_real("floor", self.floor, low=0.0, high=1.0))

    def initial_state(self, weights: np.ndarray) -> np.ndarray:
        return np.zeros(len(weights), dtype=np.float64)

    def __call__(self, ledger: WeightLedger, statistics: SourceStatistics) -> PolicyStep:
        sources = ledger.num_sources
        t = statistics.update
        if statistics.drawn is None:
            raise ValueError(
                "Exp3 importance-weights each loss by the weights that drew the interval, but got statistics without "
                "them (statistics.drawn=None); build them with SourceStatistics.from_sums(..., drawn=...), as "
                "MixtureSampler.update() does"
            )
        drawn = np.asarray(statistics.drawn, dtype=np.float64)
        rewards = ledger.state.copy()
        seen = (statistics.counts > 0) & (drawn > 0)
        rewards[seen] = self.smoothing * rewards[seen] + (1 - self.smoothing) * statistics.means[seen] / drawn[seen]
        bound = 1.0 / sources
        eps_before = bound if t <= 1 else min(bound, math.sqrt(math.log(sources) / (sources * (t - 1))))
        eps = min(bound, math.sqrt(math.log(sources) / (sources * t))) if sources > 1 else 0.0
        explore = max(eps, self.floor)
        return PolicyStep(_with_floor(_softmax(eps_before * rewards), explore), rewards)

    def config(self) -> dict[str, Any]:
        return {"policy": "Exp3", "smoothing": self.smoothing, "floor": self.floor}


def policy_config(policy: object) -> dict[str, Any]:
    """Plain values identifying a policy (for the fingerprint): its ``config()``, else its qualified name."""
    config = getattr(policy, "config", None)
    if callable(config):
        return dict(config())
    return {"policy": f"{getattr(policy, '__module__', '?')}.{getattr(policy, '__qualname__', type(policy).__name__)}"}


def policy_floor(policy: object) -> float:
    """The least weight the policy promises per source (0 for a user's policy)."""
    floor = getattr(policy, "floor", 0.0)
    return float(floor) if isinstance(floor, (int, float)) and not isinstance(floor, bool) else 0.0


def run_policy(policy: Callable[..., Any], ledger: WeightLedger, statistics: SourceStatistics) -> PolicyStep:
    """Call ``policy`` and check what it returned: one finite, non-negative weight per source, not all zero."""
    result = policy(ledger, statistics)
    if isinstance(result, PolicyStep):
        weights, state = result.weights, result.state
    else:
        weights, state = result, ledger.state
    name = getattr(policy, "__qualname__", type(policy).__name__)
    try:
        checked = as_weight_array(f"the weights policy {name} returned", weights, length=ledger.num_sources)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{error} (at update {statistics.update})") from None
    return PolicyStep(checked, np.asarray(state, dtype=np.float64).reshape(-1))


def initial_state(policy: object, weights: np.ndarray) -> np.ndarray:
    """The policy's state before its first update (``initial_state(weights)`` if it has one, else empty)."""
    make = getattr(policy, "initial_state", None)
    return np.asarray(make(weights), dtype=np.float64).reshape(-1) if callable(make) else np.zeros(0)


def adaptive_block(policy: object, num_sources: int, block: int | None, initial: np.ndarray) -> int:
    """The block of an adaptive mixture: at least ``1 / floor`` of its policy, so each source keeps its floor.

    Default: the least such block that also holds every initial weight once.
    """
    floor = policy_floor(policy)
    if floor * num_sources >= 1.0:
        raise ValueError(
            f"floor should be below 1 / {num_sources} for {num_sources} sources (each keeps at least that weight), "
            f"but the policy has floor={floor!r}"
        )
    need = max(1, math.ceil(1.0 / floor - 1e-9)) if floor > 0 else 1
    if block is None:
        shares = quantize_shares(initial)
        return max(need, *(-(-SHARE_DENOMINATOR // int(a)) for a in shares if a > 0))
    if check_int("block", block, minimum=1) < need:
        raise ValueError(
            f"block should be at least {need} for a policy with floor={floor!r} (every block holds each source at "
            f"its floor at least once), but got block={block}; pass block>={need} or raise the floor"
        )
    return block


def as_initial(weights: Sequence[float] | np.ndarray | None, num_sources: int) -> np.ndarray:
    """The initial weights (uniform when ``None``), checked, one per source."""
    if weights is None:
        return np.full(num_sources, 1.0 / num_sources)
    return as_weight_array("initial", weights, length=num_sources)


class AdaptiveWeights:
    """Mixture weights that a policy moves, every ``interval`` samples, from what the training loop reports.

    Pass it as ``MixtureSampler(..., weights=AdaptiveWeights(...))``; the loop then reports
    per-sample losses (``sampler.adaptive.record``) and calls ``sampler.adaptive.update()`` when
    ``sampler.adaptive.update_due()`` (docs/mixture.md, "Adaptive weights").

    Args:
        policy: :class:`Exp3`, :class:`ExponentiatedGradient`, or any pure callable
            ``(ledger, statistics) -> weights`` (or a :class:`PolicyStep`).
        interval: plan positions (samples over all ranks together) between updates: a multiple of
            the global batch (at every world size the run may resume at), so that updates fall on
            step boundaries.
        lag: intervals between an update and the weights it sets taking effect: the DataLoader
            may hand out up to ``lag * interval`` samples (all ranks) beyond the loop's position
            (``num_workers * prefetch_factor + 1`` batches of every rank); 0 without workers.
        initial: the weights until the first update takes effect (default: uniform).

    Example:
        >>> adaptive = AdaptiveWeights(Exp3(), interval=512)
        >>> adaptive.interval
        512
    """

    __slots__ = ("initial", "interval", "lag", "policy")

    def __init__(
        self, policy: Callable[..., Any], *, interval: int, lag: int = 1, initial: Sequence[float] | None = None
    ) -> None:
        if not callable(policy):
            raise TypeError(
                "policy should be Exp3(...), ExponentiatedGradient(...) or a callable (ledger, statistics) -> "
                f"weights, but got policy={policy!r}"
            )
        self.policy = policy
        self.interval = check_int("interval", interval, minimum=1)
        self.lag = check_int("lag", lag, minimum=0)
        self.initial = None if initial is None else as_weight_array("initial", initial)

    def fingerprint(self) -> dict[str, Any]:
        """The policy's configuration, the interval and the initial weights."""
        initial = None if self.initial is None else [float(x) for x in self.initial]
        return {**policy_config(self.policy), "interval": self.interval, "lag": self.lag, "initial": initial}

    def __repr__(self) -> str:
        initial = "" if self.initial is None else f", initial={self.initial.tolist()!r}"
        lag = "" if self.lag == 1 else f", lag={self.lag}"
        return f"AdaptiveWeights({self.policy!r}, interval={self.interval}{lag}{initial})"


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(AdaptiveWeights, Exp3, ExponentiatedGradient, PolicyStep)
