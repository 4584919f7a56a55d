"""Adaptive mixture weights: the weight ledger, the statistics a loop reports, and the policies.

Pure numpy; :class:`~shardwise.samplers.mixture.MixtureSampler` is the shell that reduces what
the ranks report and appends to the ledger.

NOTE [ An adaptive ledger is a weight schedule written at run time ]
The run is cut into intervals of ``interval`` plan positions (samples over all ranks together,
across epochs, as a ``WeightSchedule.by_samples`` counts them: never steps, whose size changes
with the world size). Update ``u = 1, 2, ...`` is due once the loop has trained through run
position ``u * interval``; its weights take effect ``lag`` intervals later (default 1), at
``(u + lag) * interval``, so that a DataLoader can prefetch up to ``lag`` intervals ahead of the loop
(``lag=0``: at once, for a loop without prefetching workers). The initial weights hold on
``[0, (1 + lag) * interval)``. The plan of any position is therefore fixed by the ledger entries
before it, and positions at or past ``(updates + 1 + lag) * interval`` are not known yet: the
sampler refuses to hand them out until the update for them is reported, so no rank ever draws with
weights another rank lacks.

NOTE [ Reported statistics are fixed-point ]
A loop reports per-sample values (losses) with their sources. Each value is rounded to a multiple
of ``2**-16`` and summed as int64, per rank and then over the ranks: integer sums do not depend on
the order of addition, so the reduced sums, and the weights computed from them in float64, are
the same bits at any world size, with any split of the samples between ranks. Values must lie in
``[-2**20, 2**20]``; an interval may hold up to ``2**26`` samples of a source.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .arrays import as_weight_array
from .errors import MalformedStateError, check_int

SHARE_DENOMINATOR = 1 << 30
"""Ledger weights are integer shares of ``2**30``: exact, and what the block arithmetic works on."""

FIXED_POINT_BITS = 16
VALUE_LIMIT = float(1 << 20)


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


# -- shares ------------------------------------------------------------------------------------------
def quantize_shares(weights: np.ndarray, min_share: int = 1) -> np.ndarray:
    """Float weights as int64 shares summing to ``2**30`` (largest remainder), deterministic.

    A zero weight stays zero; a positive one gets at least ``min_share`` (taken from the largest shares),
    so that every block of ``ceil(2**30 / min_share)`` positions holds it at least once.
    """
    total = float(weights.sum())
    scaled = weights / total * SHARE_DENOMINATOR
    shares = np.floor(scaled).astype(np.int64)
    order = np.argsort(-(scaled - shares), kind="stable")
    order = order[weights[order] > 0]
    shares[order[: SHARE_DENOMINATOR - int(shares.sum())]] += 1
    low = (weights > 0) & (shares < min_share)
    if low.any():
        lifted = int((min_share - shares[low]).sum())
        shares[low] = min_share
        while lifted:  # take the excess from the largest shares, one at a time
            top = int(np.argmax(shares))
            take = min(lifted, int(shares[top]) - min_share)
            if take <= 0:
                raise ValueError(f"{int((weights > 0).sum())} positive weights cannot each have 1/{min_share} or more")
            shares[top] -= take
            lifted -= take
    return shares


def min_share_for(block: int) -> int:
    """The least share a positive weight needs for a block of ``block`` positions to hold it once."""
    return -(-SHARE_DENOMINATOR // block)


# -- statistics ----------------------------------------------------------------------------------------
def fixed_point_sums(values: np.ndarray, sources: np.ndarray, num_sources: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-source ``(sums, counts)`` of ``values`` as int64, values in units of ``2**-16`` (NOTE above)."""
    quantized = np.rint(values * float(1 << FIXED_POINT_BITS)).astype(np.int64)
    sums = np.zeros(num_sources, dtype=np.int64)
    np.add.at(sums, sources, quantized)
    counts = np.bincount(sources, minlength=num_sources).astype(np.int64)
    return sums, counts


def check_values(values: object, sources: object, num_sources: int) -> tuple[np.ndarray, np.ndarray]:
    """``(values, sources)`` as float64 and int64 1-D arrays of one length, or raise naming the parameter."""
    value_array = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values)
    source_array = np.asarray(sources.detach().cpu() if hasattr(sources, "detach") else sources)
    value_array, source_array = value_array.reshape(-1), source_array.reshape(-1)
    if value_array.dtype.kind not in "iuf" or value_array.dtype == np.bool_:
        raise TypeError(
            f"values should be real numbers (a loss per sample), but got values of dtype {value_array.dtype}"
        )
    if source_array.size and (source_array.dtype.kind not in "iu" or source_array.dtype == np.bool_):
        raise TypeError(f"sources should be integer source numbers, but got sources of dtype {source_array.dtype}")
    if value_array.shape != source_array.shape:
        raise ValueError(
            f"values and sources should have one entry per sample, but got {value_array.size} values and "
            f"{source_array.size} sources"
        )
    floats = value_array.astype(np.float64)
    bad = ~np.isfinite(floats) | (np.abs(floats) > VALUE_LIMIT)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"values should be finite and within [-2**20, 2**20], but got values[{at}]={floats[at].item()!r}; "
            "leave a diverged batch out of the report"
        )
    integers = source_array.astype(np.int64)
    if integers.size and (int(integers.min()) < 0 or int(integers.max()) >= num_sources):
        at = int(np.flatnonzero((integers < 0) | (integers >= num_sources))[0])
        raise ValueError(
            f"sources should be source numbers in [0, {num_sources - 1}], but got sources[{at}]={int(integers[at])}"
        )
    return floats, integers


@dataclass(frozen=True)
class SourceStatistics:
    """What the ranks reported for one update, reduced: per source, the mean value and the sample count.

    ``means[i]`` is NaN when source ``i`` had no sample in the interval (``counts[i] == 0``).
    """

    update: int
    means: np.ndarray  # (S,) float64
    counts: np.ndarray  # (S,) int64

    @classmethod
    def from_sums(cls, update: int, sums: np.ndarray, counts: np.ndarray) -> SourceStatistics:
        """From the int64 fixed-point sums and counts over all ranks."""
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums.astype(np.float64) / float(1 << FIXED_POINT_BITS) / counts.astype(np.float64)
        return cls(update, np.where(counts > 0, means, np.nan), counts.astype(np.int64))


# -- the ledger ----------------------------------------------------------------------------------------
class WeightLedger:
    """Every weight vector a run has used, by update: O(updates x sources) integers, the same on every rank.

    Entry 0 is the initial weights; entry ``u`` is what update ``u`` decided, in force from run
    position ``(u + lag) * interval`` (NOTE [ An adaptive ledger is a weight schedule written at run
    time ]). ``state`` is the policy's own vector after the latest update (e.g. EXP3's reward
    estimates), so that the next update is a pure function of the ledger and the statistics.
    """

    __slots__ = ("_shares", "_updates", "interval", "lag", "state")

    def __init__(self, interval: int, initial: np.ndarray, state: np.ndarray, lag: int = 1) -> None:
        self.interval, self.lag = interval, lag
        self._shares = np.zeros((8, len(initial)), dtype=np.int64)
        self._shares[0] = initial
        self._updates = 0
        self.state = state

    @property
    def updates(self) -> int:
        """Updates recorded (entries after the initial weights)."""
        return self._updates

    @property
    def num_sources(self) -> int:
        return int(self._shares.shape[1])

    @property
    def shares(self) -> np.ndarray:
        """``(updates + 1, S)`` int64 shares of ``2**30`` (a read-only view)."""
        view = self._shares[: self._updates + 1]
        view.flags.writeable = False
        return view

    @property
    def weights(self) -> np.ndarray:
        """``(updates + 1, S)`` float64 weights (exact: shares over ``2**30``)."""
        return self.shares / float(SHARE_DENOMINATOR)

    def start_of(self, entry: int) -> int:
        """The run position from which ``entry`` is in force."""
        return 0 if entry == 0 else (entry + self.lag) * self.interval

    @property
    def due_at(self) -> int:
        """The run position the loop must have trained through before the next update."""
        return (self._updates + 1) * self.interval

    @property
    def known_until(self) -> int:
        """Run positions below this one have known weights; the next update's take effect here."""
        return (self._updates + 1 + self.lag) * self.interval

    def entry_at(self, position: int) -> int:
        """The entry in force at run ``position`` (before any block rounding)."""
        return max(0, min(self._updates, position // self.interval - self.lag))

    def append(self, shares: np.ndarray, state: np.ndarray) -> None:
        """Record the next update (amortised O(S): the table doubles when full)."""
        if self._updates + 1 == len(self._shares):
            grown = np.zeros((2 * len(self._shares), self.num_sources), dtype=np.int64)
            grown[: len(self._shares)] = self._shares
            self._shares = grown
        self._updates += 1
        self._shares[self._updates] = shares
        self.state = state

    def to_state(self) -> dict[str, Any]:
        """Plain ints and floats (``torch.save`` weights-only and JSON alike): ~5 bytes a share when pickled."""
        return {
            "interval": self.interval,
            "updates": self._updates,
            "shares": self.shares.reshape(-1).tolist(),
            "state": [float(x) for x in self.state],
        }

    @classmethod
    def from_state(cls, saved: object, interval: int, num_sources: int, lag: int = 1) -> WeightLedger:
        """The ledger of ``to_state()`` output; raises :class:`MalformedStateError` naming what is wrong."""
        if not isinstance(saved, dict) or set(saved) != {"interval", "updates", "shares", "state"}:
            raise MalformedStateError(
                "state['adaptive'] should be a dict with keys interval, updates, shares, state (saved by an adaptive "
                f"MixtureSampler), but got {saved!r:.200}"
            )
        if saved["interval"] != interval:
            raise MalformedStateError(f"state['adaptive'] has interval={saved['interval']!r}, expected {interval}")
        try:
            updates = check_int("updates", saved["updates"], minimum=0)
            shares = np.asarray(saved["shares"], dtype=np.int64).reshape(updates + 1, num_sources)
            state = np.asarray(saved["state"], dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as error:
            raise MalformedStateError(f"state['adaptive'] is malformed: {error}") from None
        if (shares < 0).any() or (shares.sum(axis=1) != SHARE_DENOMINATOR).any():
            raise MalformedStateError("state['adaptive']['shares'] should be non-negative shares summing to 2**30")
        ledger = cls(interval, shares[0], state, lag)
        for row in shares[1:]:
            ledger.append(row, state)
        return ledger


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
    resumed run calls it again): ``ledger.weights[-1]`` are the weights in force now,
    ``ledger.state`` the vector it returned last time (``initial_state`` before the first update).
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
    ``R_i <- smoothing * R_i + (1 - smoothing) * loss_i / w_i`` (``w_i``: its weight during the
    interval), the exploration rate is ``eps_t = min(1 / S, sqrt(ln S / (S * t)))``, and the
    weights are ``(1 - S * e) * softmax(eps_(t-1) * R) + e`` with ``e = max(eps_t, floor)``.

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
        previous = ledger.weights[-1]
        rewards = ledger.state.copy()
        seen = (statistics.counts > 0) & (previous > 0)
        rewards[seen] = self.smoothing * rewards[seen] + (1 - self.smoothing) * statistics.means[seen] / previous[seen]
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
    per-sample losses (``sampler.record``) and calls ``sampler.update()`` when
    ``sampler.update_due()`` (docs/mixture.md, "Adaptive weights").

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
