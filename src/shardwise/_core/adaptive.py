"""Adaptive mixture weights: the weight ledger and the statistics a training loop reports.

Pure numpy; the policies are :mod:`~shardwise._core.adaptive_policies`, and
:class:`~shardwise.samplers.mixture.MixtureSampler` is the shell that reduces what the ranks
report and appends to the ledger.

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import MalformedStateError, check_int
from .public import public

SHARE_DENOMINATOR = 1 << 30
"""Ledger weights are integer shares of ``2**30``: exact, and what the block arithmetic works on."""

FIXED_POINT_BITS = 16
VALUE_LIMIT = float(1 << 20)


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
    ``drawn`` are the weights the reported interval was drawn with (NOTE [ The weights that drew an
    interval ]): what an importance weight divides by. ``None`` only where a caller built the
    statistics by hand without them.
    """

    update: int
    means: np.ndarray  # (S,) float64
    counts: np.ndarray  # (S,) int64
    drawn: np.ndarray | None = None  # (S,) float64, sums to 1

    @classmethod
    def from_sums(cls, update: int, sums: np.ndarray, counts: np.ndarray, drawn: np.ndarray | None = None
                  ) -> SourceStatistics:  # fmt: skip
        """From the int64 fixed-point sums and counts over all ranks (and the interval's ``drawn`` weights)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums.astype(np.float64) / float(1 << FIXED_POINT_BITS) / counts.astype(np.float64)
        return cls(update, np.where(counts > 0, means, np.nan), counts.astype(np.int64), drawn)


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

    @property
    def latest(self) -> np.ndarray:
        """The weights of the last entry: the last update's decision, O(S).

        Not the weights in force: with ``lag >= 1`` they take effect ``lag`` intervals after the
        update that chose them (:meth:`drawn` gives the weights an interval was drawn with).
        """
        result: np.ndarray = self._shares[self._updates] / float(SHARE_DENOMINATOR)
        return result

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

    def drawn(self, first: int, stop: int, epoch_size: int, block: int) -> np.ndarray:
        """The weights run positions ``[first, stop)`` were drawn with: each one's, averaged (float64, sums to 1).

        NOTE [ The weights that drew an interval ]
        A weight change takes effect at the first block boundary at or after its run position,
        and blocks start at each epoch's start (``epoch_size`` positions an epoch), so run position
        ``p`` of the epoch starting at ``s`` draws with the entry in force at the start of its
        block, ``s + (p - s) // block * block``. An interval is drawn with one entry when it lies
        in one stretch of constant weights (an ``interval`` that is a multiple of ``block``, in an
        epoch of whole blocks); else with several, and this is each source's expected share of its
        positions. O(entries the interval crosses), from the ledger alone.
        """
        if not 0 <= first < stop:
            raise ValueError(f"run positions [{first}, {stop}) should be a non-empty range")
        total = np.zeros(self.num_sources, dtype=np.float64)
        period = epoch_size if epoch_size > 0 else stop  # no epochs of positive size: one stretch of blocks
        position = first
        while position < stop:
            start = position - position % period
            entry = self.entry_at(start + (position - start) // block * block)
            end = min(stop, start + period)
            if entry < self._updates:  # the next entry, from the first block that starts at or after it
                change = self.start_of(entry + 1)
                end = min(end, start + -(-(change - start) // block) * block)
            total += (end - position) * self._shares[entry].astype(np.float64)
            position = end
        result: np.ndarray = total / (float(stop - first) * SHARE_DENOMINATOR)
        return result

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


def known_prefix(positions: np.ndarray, known: int, refuse: Callable[[np.ndarray], None]) -> np.ndarray:
    """The leading ``positions`` below ``known`` (where the ledger's weights end): a pass stops there till an update.

    ``refuse(first)`` is called, and must raise, when not even the first position is known (the
    plan's ``PendingWeightsError``, naming the fix). Positions need not ascend (padding wraps).
    """
    beyond = np.flatnonzero(positions >= known)
    if not beyond.size:
        return positions
    if not beyond[0]:
        refuse(positions[:1])
    kept: np.ndarray = positions[: int(beyond[0])]
    return kept


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(SourceStatistics, WeightLedger)
