"""``TwoStreamBatchSampler``: semi-supervised batches of primary (labelled) + secondary (unlabelled) indices.

The global plan of epoch ``e`` is a sequence of batches. Batch ``j`` holds

- the primary indices at positions ``[j * pb, (j + 1) * pb)`` of one keyed shuffle of the primary
  indices (one pass over them per epoch, ``pb = primary_batch_size``), then
- the secondary indices at positions ``[j * sb, (j + 1) * sb)`` of an endless secondary stream
  (``sb = secondary_batch_size``): cycle ``c`` of the stream is a fresh keyed shuffle of the
  secondary indices, keyed by ``(seed, e, c)``; the stream restarts at the start of each epoch.
  (A keyed permutation per cycle; up to ``SMALL_STREAM`` secondary indices, the sort order of
  counter-based hashes, so the many cycles one chunk of a tiny set spans cost one sort.)

Every part is computed from its position in O(1) (a keyed permutation, never a materialised
shuffle of the data), so a batch is a pure function of ``(config, seed, epoch, j)`` and resume
is O(1). The index lists are never copied: a numpy array or ``np.memmap`` is read in place (a
memmap stays in the page cache, shared by every rank and worker of the node) and a ``range`` is
three integers. The construction-time overlap check is a bounded bitmap scan, never a hash-based
``intersect1d`` (see :func:`stream_overlap`). The batch sizes are read in one place,
:meth:`TwoStreamBatchSampler._batch_sizes` (per epoch), so that a batch-size schedule can
later vary them.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from torch.utils.data import Dataset, Sampler

from .._core.draws import counter_hash
from .._core.epoch_sizes import EpochSizes
from .._core.errors import check_int
from .._core.indices import Arange, IndexList, check_values, index_list, take
from .._core.permutation import Permutation
from .._core.schedule import BatchSizeSchedule
from .._core.seeds import derive_seed, derive_words
from .._core.state import Fingerprint
from .._core.world import World
from ..index.tables import Allocate, by_reference, shared_arrays
from .base import PlanSampler
from .keywords import CachedKeywords
from .passes import UnitSource
from .two_stream_checks import ListDigests, list_key, stream_overlap

if TYPE_CHECKING:
    from typing_extensions import Unpack

STREAM_CHECK = "two-stream-check-v1"
"""Cache kind of the checks of a pair of index lists (shared count and example, digests)."""
PRIMARY = "two-stream-primary"
SECONDARY = "two-stream-secondary"
_CYCLES_KEPT = 4  # secondary-cycle permutations cached per pass: a chunk rarely spans more
SMALL_STREAM = 4096
"""Up to this many secondary indices, the cycles a chunk spans are shuffled together in one sort."""


def small_cycle_indices(positions: np.ndarray, values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``stream_indices`` for a small secondary set, vectorised over every cycle the positions span.

    Cycle ``c`` orders the ``n`` values by the counter-based hash of ``(keys, c * n + j)``: the
    same shuffle whichever chunk asks for it, and one argsort for all the cycles of a chunk (a
    chunk of a tiny secondary set spans thousands of cycles).
    """
    n = len(values)
    flat = positions.reshape(-1)
    cycles, offsets = np.divmod(flat, n)
    needed, which = np.unique(cycles, return_inverse=True)
    # words, shuffles: (len(needed), n), one row per cycle.
    words = counter_hash((needed[:, None] * n + np.arange(n, dtype=np.int64)).reshape(-1), keys).reshape(-1, n)
    shuffles = np.argsort(words, axis=1, kind="stable")
    out: np.ndarray = values[shuffles[which.reshape(-1), offsets]]
    return out.reshape(positions.shape)


def stream_indices(positions: np.ndarray, values: IndexList, cycle_permutation: Any) -> np.ndarray:
    """The values at ``positions`` of an endless stream whose cycle ``c`` is ``cycle_permutation(c)``.

    Args:
        positions: int64 stream positions, any shape.
        values: the ``n`` values one cycle shuffles.
        cycle_permutation: ``c -> Permutation(n, key)`` for cycle ``c``.

    Returns:
        ``values[perm_c(p % n)]`` with ``c = p // n`` for every position ``p``, same shape.
    """
    n = len(values)
    flat = positions.reshape(-1)
    cycles, offsets = np.divmod(flat, n)
    out = np.empty_like(flat)
    order = np.argsort(cycles, kind="stable")
    sorted_cycles = cycles[order]
    cuts = np.flatnonzero(np.diff(sorted_cycles)) + 1
    for group in np.split(order, cuts):
        permutation = cycle_permutation(int(cycles[group[0]]))
        out[group] = take(values, permutation(offsets[group]))
    return out.reshape(positions.shape)


TAKES_INDEX_LISTS = (
    "TwoStreamBatchSampler takes two lists of indices into one dataset, not two datasets: e.g. over "
    "ConcatDataset([labelled, unlabelled]), primary_indices=range(len(labelled)), "
    "secondary_indices=range(len(labelled), len(labelled) + len(unlabelled))"
)


def _indices(name: str, values: object, *, allow_empty: bool = False) -> IndexList:
    """``index_list`` of ``values``; a dataset, or anything that is not integers, is refused saying what to pass."""
    if isinstance(values, Dataset) and not isinstance(values, (range, list, tuple, np.ndarray)):
        # Never turned into an array: that would read the whole dataset.
        raise TypeError(f"{name} should be a sequence of dataset indices, but got a {type(values).__name__} "
                        f"(a dataset); {TAKES_INDEX_LISTS}")  # fmt: skip
    try:
        return index_list(name, values, allow_empty=allow_empty)
    except (TypeError, ValueError) as error:
        if "empty" in str(error):  # an empty list is not a dataset mix-up
            raise
        raise type(error)(f"{error}; {TAKES_INDEX_LISTS}") from None


class TwoStreamBatchSampler(PlanSampler[list[int]], Sampler[list[int]]):
    """Distributed semi-supervised batches: a pass over primary indices, topped up from a secondary stream.

    One epoch is one shuffled pass over ``primary_indices``, ``primary_batch_size`` at a time;
    each batch is completed with ``secondary_batch_size`` indices from an endless stream over
    ``secondary_indices``, reshuffled on every cycle and continuing within the epoch (the
    mean-teacher ``TwoStreamBatchSampler``, made distributed). A batch is the primary part
    followed by the secondary part.

    The batches form one global plan, the same on every rank and independent of the world size;
    rank ``r`` of ``W`` takes batches ``r, r + W, ...``. So within an epoch the primary indices of
    different ranks are disjoint, and every rank yields the same number of batches.

    Cost at 1e9 indices: nothing per rank beyond one chunk of 128 batches; the lists are read in
    place (a memmap is never copied; a ``range`` is free). The first construction per node scans
    both lists once (value checks and an overlap bitmap of at most 32 MiB, O(n) time) and caches
    the result, so later starts read a few bytes.

    Args:
        primary_indices: 1-D non-negative integer indices, one pass per epoch (e.g. labelled).
        secondary_indices: 1-D non-negative integer indices, an endless stream (e.g. unlabelled);
            may be empty when ``secondary_batch_size=0``.
        primary_batch_size: primary indices per batch.
        secondary_batch_size: secondary indices per batch (0 for primary-only batches).
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: ``True`` (default, unlike the other samplers, as in the mean-teacher sampler: a
            short batch would change the primary/secondary ratio): leave out the short last primary
            group and cut the last partial global step, so every batch is full and no primary index repeats.
            ``False``: keep the short last primary group as a smaller batch (still with a full
            secondary part) and pad the last global step by repeating batches from the start of
            the plan (at most ``W - 1``), so every primary index is seen.
        cache_dir: where the result of the O(n) input checks is kept, so that later starts skip
            them (see ``shardwise.index.build_or_open``): ``None`` for the default per-user
            cache, a path, or ``False`` for none (with a warning).
        cache_timeout: seconds to wait for another process of the node building the same index
            (default 600); then ``IndexCacheTimeout``, never a hang.

    Attributes:
        batch_size: ``primary_batch_size + secondary_batch_size``, what frameworks read.

    Raises:
        ValueError: empty ``primary_indices``, negative indices, non-positive
            ``primary_batch_size``, an empty ``secondary_indices`` with ``secondary_batch_size > 0``,
            or ``drop_last=True`` with fewer primary indices than ``primary_batch_size``.
        TypeError: non-integer indices or sizes.

    Warns:
        UserWarning: when the primary and secondary indices overlap (allowed, but usually a bug).

    Example:
        >>> sampler = TwoStreamBatchSampler(range(8), range(100, 104), primary_batch_size=2,
        ...                                 secondary_batch_size=3, num_replicas=2, rank=0)
        >>> len(sampler), sampler.batch_size
        (2, 5)
        >>> [len(batch) for batch in sampler]
        [5, 5]
    """

    _CHUNK = 128
    # NOTE [ TwoStreamBatchSampler drops the short batch ]: drop_last defaults to True here, unlike every
    # other sampler, as in the mean-teacher sampler it replaces: a batch short of primary indices would
    # change the primary/secondary ratio the loss is weighted for, and existing runs rely on this
    # epoch length (docs/design.md, "Constructor keywords").
    _KEYWORD_DEFAULTS: ClassVar[dict[str, Any]] = {"drop_last": True}

    def __init__(
        self,
        primary_indices: Any,
        secondary_indices: Any,
        *,
        primary_batch_size: int | BatchSizeSchedule,
        secondary_batch_size: int | BatchSizeSchedule,
        **options: Unpack[CachedKeywords],
    ) -> None:
        keywords = self._read_keywords(options)
        # Used as they are (a memmap stays on disk, a range stays three integers): never copied.
        self.primary_indices: IndexList = _indices("primary_indices", primary_indices)
        self.secondary_indices: IndexList = _indices("secondary_indices", secondary_indices, allow_empty=True)
        # Either size may be a per-epoch BatchSizeSchedule; the attributes hold epoch 0's value.
        self._schedules = EpochSizes("TwoStreamBatchSampler", len(self.primary_indices),
                                     primary_batch_size=primary_batch_size,
                                     secondary_batch_size=secondary_batch_size)  # fmt: skip
        primary_batch_size = self._schedules.initial("primary_batch_size", primary_batch_size)  # type: ignore[assignment]
        secondary_batch_size = self._schedules.initial("secondary_batch_size", secondary_batch_size)  # type: ignore[assignment]
        self.primary_batch_size = check_int("primary_batch_size", primary_batch_size, minimum=1)
        self.secondary_batch_size = check_int("secondary_batch_size", secondary_batch_size, minimum=0)
        self.drop_last = keywords.drop_last
        if self.secondary_batch_size > 0 and self.secondary_indices.size == 0:
            raise ValueError(
                f"secondary_indices should hold at least one index when secondary_batch_size > 0, but got an "
                f"empty secondary_indices with secondary_batch_size={self.secondary_batch_size}"
            )
        if self.drop_last and len(self.primary_indices) < self.primary_batch_size:
            raise ValueError(
                f"primary_batch_size should be at most the {len(self.primary_indices)} primary indices with "
                f"drop_last=True (no batch would be formed), but got primary_batch_size={self.primary_batch_size}; "
                "pass drop_last=False to keep a short batch"
            )
        for epoch in self._schedules.epochs():
            whole = self._schedules.at("primary_batch_size", epoch, self.primary_batch_size)
            if self.drop_last and len(self.primary_indices) < whole:
                raise ValueError(
                    f"primary_batch_size should be at most the {len(self.primary_indices)} primary indices with "
                    f"drop_last=True, but its schedule gives {whole} at epoch {epoch} (no batch would be formed)"
                )
        primary_, secondary_ = self.primary_indices, self.secondary_indices

        def build(allocate: Allocate) -> None:
            with ListDigests(primary_, secondary_) as hashing:  # hashed on another core while the lists are checked
                allocate("overlap", 2, np.int64)[:] = stream_overlap(primary_, secondary_)
                both = bytes.fromhex(hashing.result())
            allocate("digests", len(both), np.uint8)[:] = np.frombuffer(both, dtype=np.uint8)

        # The O(n) checks (values in range, overlap) and digests run once per pair of lists and node.
        ranges = isinstance(primary_, Arange) and isinstance(secondary_, Arange)
        checked = shared_arrays(
            STREAM_CHECK,
            f"{list_key(primary_)}|{list_key(secondary_)}",
            build,
            size=0 if ranges else len(primary_) + len(secondary_),
            cache_dir=keywords.cache_dir,
            timeout=keywords.cache_timeout,
        )
        shared, example = (int(value) for value in checked["overlap"])
        digests = bytes(checked["digests"]).hex()
        self._digests = (digests[:16], digests[16:])
        if shared:
            warnings.warn(
                f"primary_indices and secondary_indices share {shared} indices (e.g. {example}): "
                "those samples are drawn from both streams",
                UserWarning,
                stacklevel=2,
            )
        self._init_plan(keywords)

    @property
    def batch_size(self) -> int:
        """Indices per full batch: ``primary_batch_size + secondary_batch_size``."""
        return sum(self._batch_sizes(self.epoch))

    # -- plan ----------------------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        size, (whole, _) = len(self.primary_indices), self._batch_sizes(epoch)
        return size // whole if self.drop_last else -(-size // whole)

    def _batch_sizes(self, epoch: int) -> tuple[int, int]:
        """``(primary_batch_size, secondary_batch_size)`` of ``epoch``: the one place that reads them."""
        return (
            self._schedules.at("primary_batch_size", epoch, self.primary_batch_size),
            self._schedules.at("secondary_batch_size", epoch, self.secondary_batch_size),
        )

    def _bounds(self, batches: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Where each batch position of ``epoch`` reads its primary part and its secondary part.

        Returns:
            starts, stops: ``(m,)`` int64 primary positions ``[start, stop)``, at most
                ``primary_batch_size`` apart (less for a short last group).
            stream_starts: ``(m,)`` int64 secondary stream position of each batch's first index.
            stream_size: secondary indices per batch.
        """
        whole, extra = self._batch_sizes(epoch)
        starts = batches * whole
        stops = np.minimum(starts + whole, len(self.primary_indices))
        return starts, stops, batches * extra, extra

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        primary = Permutation(len(self.primary_indices), derive_seed(seed, epoch, PRIMARY))
        cycles: dict[int, Permutation] = {}
        secondary_size = len(self.secondary_indices)
        small_keys = derive_words(seed, epoch, SECONDARY, count=2)
        small_values = take(self.secondary_indices, np.arange(min(secondary_size, SMALL_STREAM), dtype=np.int64))

        def cycle_permutation(cycle: int) -> Permutation:
            if cycle not in cycles:
                if len(cycles) >= _CYCLES_KEPT:
                    cycles.pop(next(iter(cycles)))
                cycles[cycle] = Permutation(secondary_size, derive_seed(seed, epoch, SECONDARY, cycle))
            return cycles[cycle]

        def batches(positions: np.ndarray) -> list[list[int]]:
            starts, stops, stream_starts, per_batch = self._bounds(positions, epoch)
            whole = int((stops - starts).max())
            # grid: (m, whole) primary positions; a short last group is masked below.
            grid = starts[:, None] + np.arange(whole, dtype=np.int64)
            full = grid < stops[:, None]
            first = take(self.primary_indices, primary(np.where(full, grid, 0)))
            if per_batch:
                stream = stream_starts[:, None] + np.arange(per_batch, dtype=np.int64)
                if secondary_size <= SMALL_STREAM:
                    second = small_cycle_indices(stream, small_values, small_keys)
                else:
                    second = stream_indices(stream, self.secondary_indices, cycle_permutation)
                rows: list[list[int]] = np.concatenate([first, second], axis=1).tolist()
            else:
                second = first[:, :0]
                rows = first.tolist()
            for row in np.flatnonzero(~full.all(axis=1)).tolist():
                rows[row] = first[row, full[row]].tolist() + second[row].tolist()
            return rows

        return batches

    def _id_count(self) -> int:
        """One more than the largest index either list holds (an O(n) scan, as :meth:`_plan_positions_of` is).

        The lists name dataset indices and this sampler does not know the dataset's size: an id up to
        the largest listed is a sample (one in neither list is never trained), a larger one is an error.
        """
        lists = (("primary_indices", self.primary_indices), ("secondary_indices", self.secondary_indices))
        return 1 + max(check_values(name, values)[1] for name, values in lists if len(values))

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every plan position whose batch holds ``index`` (provenance): a scan of the epoch's plan.

        O(n) time per epoch, O(64k batches) memory (its two streams are cycled and cut per batch, with no inverse kept).
        See BENCHMARKS.md for the measured cost.
        """
        return self._scan_positions_of(epoch, index)

    def _fingerprint(self) -> Fingerprint:
        return {
            "num_primary": len(self.primary_indices),
            "num_secondary": len(self.secondary_indices),
            "primary_batch_size": self.primary_batch_size,
            "secondary_batch_size": self.secondary_batch_size,
            "drop_last": self.drop_last,
            "primary_digest": self._digests[0],
            "secondary_digest": self._digests[1],
            **self._schedules.fingerprint(),
        }

    def _config(self) -> dict[str, Any]:
        return {
            "primary_batch_size": self.primary_batch_size,
            "secondary_batch_size": self.secondary_batch_size,
            "drop_last": self.drop_last,
        }

    def _data_repr(self) -> str:
        return f"primary={len(self.primary_indices)}, secondary={len(self.secondary_indices)}"

    def __getstate__(self) -> dict[str, Any]:
        return by_reference(super().__getstate__())  # memory-mapped lists travel as file names
