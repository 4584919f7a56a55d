"""The plan of a mixture, epoch by epoch: its stop rule, its sizes and the index at each position.

:class:`MixturePlan` ties the weights (:mod:`~shardwise._core.weights`) to the block arithmetic
(:mod:`~shardwise._core.mixture_blocks`, which states the exactness bound) for one mixture of
sources: where each epoch ends (:class:`MixtureStop`), where its weights change, and the global
index at any plan position, in O(1) from the position with no table and no replay.
"""

from __future__ import annotations

import enum

import numpy as np

from .adaptive import known_prefix
from .errors import check_int
from .mixture_blocks import (
    MAX_BLOCK,
    Draws,
    Layout,
    LayoutBuffer,
    counts_before,
    draw_indices,
    locate,
    make_layout,
    slot_keys_for,
    source_keys,
)
from .offsets import offsets_from_counts
from .public import public
from .weights import BY_SAMPLES, Weights, WeightSchedule, exact_weights


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


class PendingWeightsError(RuntimeError):
    """Plan positions were asked for whose weights an adaptive ledger does not hold yet."""


class GrowingRows:
    """int64 rows appended one at a time, in an array that doubles when full: amortised O(width) an append.

    An adaptive ledger appends a weight change per update (2.4e5 in a 1e9-sample epoch with an
    update every 4096): kept as Python objects (a tuple of ints, a ``Weights``, an int in a list)
    they took ~300 bytes each, as rows 8 bytes a number.
    """

    __slots__ = ("_array", "_count")

    def __init__(self, rows: np.ndarray) -> None:
        self._count = len(rows)
        self._array = np.zeros((max(8, 2 * self._count), *rows.shape[1:]), dtype=np.int64)
        self._array[: self._count] = rows

    def __len__(self) -> int:
        return self._count

    @property
    def rows(self) -> np.ndarray:
        """The rows so far (a view, valid until the next append)."""
        return self._array[: self._count]

    def append(self, row: object) -> None:
        if self._count == len(self._array):
            grown = np.zeros((2 * len(self._array), *self._array.shape[1:]), dtype=np.int64)
            grown[: self._count] = self._array[: self._count]
            self._array = grown
        self._array[self._count] = row
        self._count += 1


class WeightEntries:
    """A plan's exact weight vectors, one row ``a_0 .. a_(S-1), D`` each (:class:`GrowingRows`)."""

    __slots__ = ("_rows",)

    def __init__(self, entries: list[Weights]) -> None:
        self._rows = GrowingRows(np.asarray([[*w.a, w.denominator] for w in entries], dtype=np.int64))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, entry: int) -> Weights:
        row = self._rows.rows[entry].tolist()
        return Weights(tuple(row[:-1]), row[-1])

    def append(self, weights: Weights) -> None:
        self._rows.append([*weights.a, weights.denominator])


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

    Example:
        >>> plan = MixturePlan(np.array([6, 2]), WeightSchedule.constant([3, 1]), stop=MixtureStop.ALL_EXHAUSTED,
        ...                    num_samples=None, primary=None, block=None, shuffle=False)
        >>> plan.block, plan.plan_size(0), plan.locate(0, 0, np.arange(8)).sources.tolist()
        (4, 8, [0, 1, 0, 0, 0, 1, 0, 0])
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
        self.offsets = offsets_from_counts(sizes)[:-1]  # where each source starts in the concatenation
        self.schedule = schedule
        schedule.check_sources(len(sizes))
        entries = [Weights(*exact_weights(w)) for w in schedule.weights]
        self.entries = WeightEntries(entries)
        self.stop, self.num_samples, self.primary, self.shuffle = stop, num_samples, primary, shuffle
        self.interleave = interleave or not shuffle
        need = max(w.smallest_block() for w in entries)
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
            for entry in entries[-1:] if schedule.kind == BY_SAMPLES else entries:
                if entry.a[primary] == 0:
                    raise ValueError(
                        f"primary={primary} has weight 0 in a weights entry, so stop='primary' would never end the "
                        f"epoch; give source {primary} a positive weight"
                    )
        self._starts: list[int] = [0]
        self._by_samples = schedule.kind == BY_SAMPLES
        self._thresholds = GrowingRows(np.asarray(schedule.thresholds if self._by_samples else [0], dtype=np.int64))
        self.known_until: int | None = None
        """Run positions at or past this one have no weights yet (an adaptive ledger); ``None``: all known."""
        self._layout: tuple[int, Layout] | None = None
        self._buffer: LayoutBuffer | None = None  # the cached layout's rows, once an update grew it
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
        if not self._by_samples:
            stretches = [(0, self.entries[self.schedule.index_at(epoch, 0)])]
        else:
            start = self.epoch_start(epoch)
            thresholds = self._thresholds.rows
            first_entry = int(np.searchsorted(thresholds, start, side="right")) - 1
            stretches = [(0, self.entries[first_entry])]
            end = start + self.num_samples if self.num_samples is not None else None
            stop = len(thresholds) if end is None else int(np.searchsorted(thresholds, end, side="left"))
            for at in range(first_entry + 1, stop):
                first = -(-(int(thresholds[at]) - start) // self.block)
                if first == stretches[-1][0]:
                    stretches[-1] = (first, self.entries[at])
                else:
                    stretches.append((first, self.entries[at]))
        layout = make_layout(self.block, stretches)
        self._layout, self._buffer = (epoch, layout), None
        return layout

    def renewed(self, block: int) -> MixturePlan:
        """A plan of the same sources, schedule and stop rule with ``block``, before any update ``extend`` added.

        What a resume replays a saved adaptive ledger onto (``Feedback.plan_of``): O(sources x changes).
        """
        return MixturePlan(self.sizes, self.schedule, stop=self.stop, num_samples=self.num_samples,
                           primary=self.primary, block=block, shuffle=self.shuffle,
                           interleave=self.interleave)  # fmt: skip

    def reveal_until(self, known_until: int) -> None:
        """Run positions below ``known_until`` are known (an adaptive ledger's reach): units past it are refused."""
        self.known_until = known_until

    def extend(self, threshold: int, weights: Weights, known_until: int) -> None:
        """Append a weight change at run position ``threshold`` (an adaptive ledger's update): amortised O(S).

        ``threshold`` lies past every earlier change, with a ``num_samples`` stop; the cached layout of
        the epoch holding it grows by one stretch instead of being laid out again.
        """
        if self.stop is not MixtureStop.NUM_SAMPLES or self.num_samples is None:
            raise ValueError("weights can only be appended to a mixture with stop='num_samples'")
        need = weights.smallest_block()
        if need > self.block:
            raise ValueError(
                f"weights {weights.shares()} need a block of {need} positions, but the mixture's block is {self.block}"
            )
        last = int(self._thresholds.rows[-1])
        if threshold <= last:
            raise ValueError(f"a weight change at {threshold} should come after the last one, at {last}")
        self._by_samples = True
        self._thresholds.append(threshold)
        self.entries.append(weights)
        self.known_until = known_until
        if self._layout is None:
            return
        epoch, layout = self._layout
        start = self.epoch_start(epoch)
        if not start < threshold < start + self.num_samples:
            return  # another epoch's change: that epoch is laid out when it is asked for
        first = -(-(threshold - start) // self.block)
        if first * self.block >= self.num_samples:
            return
        if self._buffer is None:
            self._buffer = LayoutBuffer(layout)
        self._layout = (epoch, self._buffer.append(first, weights))

    def known_prefix(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The leading ``positions`` whose weights are known (a pass stops there until the next update).

        Raises:
            PendingWeightsError: not even the first one is known.
        """
        if self.known_until is None:
            return positions
        return known_prefix(positions, self.known_until - self.epoch_start(epoch), lambda p: self.check_known(epoch, p))

    def check_known(self, epoch: int, positions: np.ndarray) -> None:
        """Raise :class:`PendingWeightsError` if a position's weights are not in the ledger yet."""
        if self.known_until is None or not len(positions):
            return
        last = self.epoch_start(epoch) + int(positions.max())
        if last >= self.known_until:
            raise PendingWeightsError(
                f"plan position {last - self.epoch_start(epoch)} of epoch {epoch} (run position {last}) uses weights "
                f"that no update has set yet: the ledger holds them up to run position {self.known_until}. Report the "
                "update that is due (sampler.adaptive.update() when sampler.adaptive.update_due(), on every rank) "
                "before the loader needs samples past it; a DataLoader's workers prefetch num_workers * "
                "prefetch_factor batches ahead of the loop: give AdaptiveWeights(lag=...) intervals that cover them "
                "(or a larger interval)"
            )

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

    def epoch_keys(self, seed: int, epoch: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(slot keys, source keys)`` of ``epoch``'s shuffles (``None, None`` without shuffling), cached."""
        if not self.shuffle:
            return None, None
        if self._keys is None or self._keys[:2] != (seed, epoch):
            self._keys = (seed, epoch, slot_keys_for(seed, epoch), source_keys(seed, epoch, self.num_sources))
        return self._keys[2], self._keys[3]

    def locate(self, seed: int, epoch: int, positions: np.ndarray) -> Draws:
        """Source and draw number at each position of ``epoch``'s plan."""
        self.check_known(epoch, positions)
        slot_keys, _ = self.epoch_keys(seed, epoch)
        return locate(self.layout(epoch), positions, slot_keys, self.interleave)

    def indices(self, seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The global (concatenated) index at each position of ``epoch``'s plan."""
        self.check_known(epoch, positions)
        slot_keys, keys = self.epoch_keys(seed, epoch)
        found = locate(self.layout(epoch), positions, slot_keys, self.interleave)
        return draw_indices(found, self.sizes, self.offsets, keys)

    def counts(self, seed: int, epoch: int, position: int) -> list[int]:
        """Draws of each source in ``epoch`` before ``position`` (O(S) + O(block))."""
        slot_keys, _ = self.epoch_keys(seed, epoch)
        return counts_before(self.layout(epoch), position, slot_keys, self.interleave)

    def weights_at(self, epoch: int, position: int) -> list[float]:
        """The exact weights (shares summing to 1) in effect at ``position`` of ``epoch``."""
        layout = self.layout(epoch)
        s = int(layout.stretch_of(np.asarray([position // self.block]))[0])
        prefix = layout.prefix[s]
        return [float(x) for x in np.diff(prefix) / float(layout.denominator[s])]


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(MixtureStop, PendingWeightsError)
