"""``ClassBalancedBatchSampler``: P classes x K samples per batch, for metric learning, distributed.

What an epoch is. With ``N`` samples in the usable classes, ``P = classes_per_batch`` and
``K = samples_per_class``, an epoch's global plan has ``B = max(1, N // (P * K))`` batches, so the
epoch draws about ``N`` samples. The ``B * P`` class slots of the epoch are shared out in
proportion to class sizes (class ``c`` with ``n_c`` samples gets ``n_c / K`` slots, rounded up
or down at random so that it is exact on average, in integer arithmetic), never more than ``B``
(a class appears at most once per batch); the share a very large class cannot take goes to the
others in proportion. Within a class, its slots take ``K`` samples at a time from a keyed shuffle
of its samples; when a class needs more slots than one shuffle holds (``n_c // K``) the next
slots come from a fresh shuffle. So:

- a class with at least ``K`` samples never repeats a sample within a batch, and each of its
  samples is seen at most once per epoch unless the class got more than ``n_c // K`` slots;
- a class with fewer than ``K`` samples (``small_classes="replace"``) repeats its samples within
  its batch group, each about ``K / n_c`` times per group.

Layout. The class slots, grouped by class in a keyed class order, form ``P`` columns of ``B``
slots; batch ``r`` takes one cell of each column through keyed bijections chained column to
column, constrained only so that a class straddling two columns never meets itself (see
``shardwise._core.classes``). So a batch holds ``P`` distinct classes, a class meets random
classes, and the batch at any plan position is computed from that position alone: O(P log C)
per batch, O(1) resume, nothing per epoch beyond O(C) quotas. A batch lists its ``P`` groups of
``K`` indices one after the other, each group sharing a label. (Earlier releases materialised the
epoch as a table mixed by row swaps: same quotas and guarantees, another order.)

Cost at 1e9 samples. The one O(n) structure, every sample index grouped by class (4 bytes per
sample below 2**32 samples, so 4 GB at 1e9), is built once per labels by a counting sort in two
local passes (NOTE [ Class index in two passes ] in ``shardwise._core.class_buckets``: private
memory O(classes) plus about 60 MiB of buffers, compiled with numba when the ``fast`` extra is
installed) and read in place; labels are used as given (a memmap is never copied). Per rank and
epoch: O(C) quotas and class order (C classes), and one chunk of 512 batches at a time; no O(n)
array of its own.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from .._core.arrays import digest
from .._core.classes import EpochLayout, class_quotas, member_keys, member_ranks
from .._core.epoch_sizes import EpochSizes
from .._core.errors import check_choice, check_int
from .._core.schedule import BatchSizeSchedule
from .._core.state import Fingerprint
from .._core.world import World
from ..index import read_checked
from ..index.labels import LabelsInput
from ..index.tables import by_reference
from .base import PlanSampler
from .keywords import CachedKeywords
from .passes import UnitSource

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ClassBalancedBatchSampler", "SmallClasses", "class_quotas"]


class SmallClasses(str, enum.Enum):
    """What to do with a class that has fewer than ``samples_per_class`` samples."""

    REPLACE = "replace"
    """Use it, repeating its samples to fill its ``K`` places (sampling with replacement)."""
    EXCLUDE = "exclude"
    """Leave it out of every batch."""
    ERROR = "error"
    """Refuse the labels at construction."""


class ClassBalancedBatchSampler(PlanSampler[list[int]], Sampler[list[int]]):
    """Batches of ``classes_per_batch`` classes x ``samples_per_class`` samples (P x K), distributed.

    For metric learning losses (triplet, contrastive, ...), which need several samples of the
    same class in a batch. Each batch holds ``P`` distinct classes, ``K`` samples each, as ``P``
    consecutive groups of ``K`` indices. An epoch is ``max(1, N // (P * K))`` batches, so each
    sample is seen about once per epoch; classes take part in proportion to their size (see the
    module docstring of ``shardwise.samplers.class_balanced`` for the exact rule).

    The batches form one global plan, the same on every rank and independent of the world size;
    rank ``r`` of ``W`` takes whole batches ``r, r + W, ...``, and every rank yields the same number.

    Cost at 1e9 samples: the class index (every sample grouped by class, 4 GB) is built once per
    labels and node by a counting sort in two local passes and memory-mapped by every rank and worker; per
    rank, O(classes) per epoch and one chunk of 512 batches, never an O(n) array of its own.

    Args:
        labels: 1-D integer or string class label of every sample of the dataset.
        classes_per_batch: ``P``, distinct classes per batch.
        samples_per_class: ``K``, samples per class in a batch.
        small_classes: what to do with a class with fewer than ``K`` samples: ``"replace"``
            (default: repeat its samples), ``"exclude"`` (leave it out) or ``"error"``.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: cut the last partial global step (at most ``W - 1`` batches) instead of padding
            it by repeating batches from the start of the plan.
        cache_dir: where the class index is shared (see ``shardwise.index.build_or_open``):
            ``None`` for the default per-user cache (``SHARDWISE_CACHE_DIR`` overrides it), a
            path, or ``False`` to build it in this process's memory (with a warning). Labels
            below 65,536 entries are always indexed in memory.
        cache_timeout: seconds to wait for another process of the node building the same index
            (default 600); then ``IndexCacheTimeout``, never a hang.

    Attributes:
        batch_size: ``P * K``, what frameworks read.
        num_batches: batches in one epoch's global plan (all ranks together).

    Raises:
        ValueError: empty or non-1-D labels, non-positive ``P``/``K``, fewer than ``P`` usable
            classes, or a class smaller than ``K`` with ``small_classes="error"``.
        TypeError: labels that are neither integers nor strings, non-integer ``P``/``K``.

    Example:
        >>> labels = [0, 0, 1, 1, 2, 2, 3, 3]
        >>> sampler = ClassBalancedBatchSampler(labels, classes_per_batch=2, samples_per_class=2,
        ...                                     num_replicas=1, rank=0)
        >>> len(sampler), sampler.batch_size
        (2, 4)
        >>> sorted(i for batch in sampler for i in batch)
        [0, 1, 2, 3, 4, 5, 6, 7]
    """

    _CHUNK = 512  # batches computed per step: amortises the per-column work (about 12 MiB at 32 x 8)
    _FIRST_CHUNK = 4  # a cheap first batch; later chunks double up to _CHUNK

    def __init__(
        self,
        labels: Any,
        *,
        classes_per_batch: int | BatchSizeSchedule,
        samples_per_class: int,
        small_classes: SmallClasses | str = SmallClasses.REPLACE,
        **options: Unpack[CachedKeywords],
    ) -> None:
        keywords = self._read_keywords(options)
        # resolved and checked once; its class index is built (or opened) below, after the other checks
        self._input = LabelsInput.of(labels, cache_dir=keywords.cache_dir, timeout=keywords.cache_timeout)
        # classes_per_batch may be a per-epoch BatchSizeSchedule; the attribute holds epoch 0's value.
        self._schedules = EpochSizes("ClassBalancedBatchSampler", self._input.size, classes_per_batch=classes_per_batch)
        classes_per_batch = self._schedules.initial("classes_per_batch", classes_per_batch)  # type: ignore[assignment]
        self.classes_per_batch = check_int("classes_per_batch", classes_per_batch, minimum=1)
        self.samples_per_class = check_int("samples_per_class", samples_per_class, minimum=1)
        self.small_classes = check_choice("small_classes", small_classes, SmallClasses)
        self.drop_last = keywords.drop_last
        classes, sizes = self._input.classes, self._input.counts
        small = sizes < self.samples_per_class
        if small.any() and self.small_classes is SmallClasses.ERROR:
            first = int(np.argmax(small))
            raise ValueError(
                f"labels should have at least samples_per_class={self.samples_per_class} samples in every class "
                f"with small_classes='error', but {int(small.sum())} classes have fewer (e.g. class "
                f"{classes[first].item()!r} with {int(sizes[first])}); pass small_classes='replace' to repeat their "
                "samples or small_classes='exclude' to leave them out"
            )
        usable = ~small if self.small_classes is SmallClasses.EXCLUDE else np.ones(len(sizes), dtype=bool)
        if int(usable.sum()) < self.classes_per_batch:
            which = (
                "classes"
                if self.small_classes is not SmallClasses.EXCLUDE
                else (f"classes with at least samples_per_class={self.samples_per_class} samples")
            )
            raise ValueError(
                f"classes_per_batch should be at most the number of usable {which} in labels "
                f"({int(usable.sum())}), but got classes_per_batch={self.classes_per_batch}"
            )
        for epoch in self._schedules.epochs():
            wanted = self._schedules.at("classes_per_batch", epoch, self.classes_per_batch)
            if int(usable.sum()) < wanted:
                raise ValueError(
                    f"classes_per_batch should be at most the number of usable classes in labels "
                    f"({int(usable.sum())}), but its schedule gives {wanted} at epoch {epoch}"
                )
        # the index's members: every sample index grouped by class (all classes, label order); the
        # usable classes are read through their starts, so the index depends on the labels alone.
        starts = np.cumsum(sizes) - sizes
        self._sizes = sizes[usable].astype(np.int64)
        self._class_starts = starts[usable].astype(np.int64)
        self._usable = int(self._sizes.sum())  # N: samples in the usable classes
        self.classes = classes[usable]
        self._cached: tuple[int, int, EpochLayout] | None = None
        self._digest: str | None = None
        self._init_plan(keywords)

    @property
    def labels(self) -> np.ndarray:
        """The class label of every sample, as given (a memory map stays one)."""
        return self._input.values

    @property
    def batch_size(self) -> int:
        """Indices per batch: ``classes_per_batch * samples_per_class``."""
        classes, samples = self._batch_shape(self.epoch)
        return classes * samples

    @property
    def num_batches(self) -> int:
        """Batches in the upcoming epoch's global plan, all ranks together."""
        return self._plan_size(self.epoch)

    def _batch_shape(self, epoch: int) -> tuple[int, int]:
        """``(classes_per_batch, samples_per_class)`` of ``epoch``: the one place that reads them."""
        return self._schedules.at("classes_per_batch", epoch, self.classes_per_batch), self.samples_per_class

    def _layout(self, seed: int, epoch: int) -> EpochLayout:
        """The layout of ``epoch`` (O(classes), cached for the epoch in progress)."""
        if self._cached is None or self._cached[:2] != (seed, epoch):
            classes, _ = self._batch_shape(epoch)
            layout = EpochLayout(
                self._sizes, classes_per_batch=classes, num_batches=self._raw_plan_size(epoch), seed=seed, epoch=epoch
            )
            self._cached = (seed, epoch, layout)
        return self._cached[2]

    def batches_at(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """The batches at plan ``positions`` of ``epoch``: ``(m, P * K)`` int64 sample indices."""
        seed = self.seed
        classes, samples = self._batch_shape(epoch)
        layout = self._layout(seed, epoch)
        cls, use = layout.cells(np.asarray(positions, dtype=np.int64))
        ranks = member_ranks(cls, use, self._sizes, samples, member_keys(seed, epoch))
        members = self._input.members
        picks: np.ndarray = read_checked(members, members[self._class_starts[cls][:, :, None] + ranks])
        return picks.reshape(len(cls), classes * samples).astype(np.int64)

    def epoch_plan(self, epoch: int) -> np.ndarray:
        """The whole global plan of ``epoch``: ``(num_batches, P * K)`` int64 (O(n): for inspection only)."""
        return self.batches_at(np.arange(self._raw_plan_size(epoch), dtype=np.int64), epoch)

    def _plan_size(self, epoch: int) -> int:
        classes, samples = self._batch_shape(epoch)
        return max(1, self._usable // (classes * samples))

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        self._layout(seed, epoch)  # built once per pass, before the first batch
        return lambda positions: self.batches_at(positions, epoch).tolist()

    def _id_count(self) -> int:
        return len(self._input)

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every plan position whose batch holds ``index`` (provenance): a scan of the epoch's plan.

        O(n) time per epoch, O(64k batches) memory (slots are dealt by quotas over every class; no inverse kept).
        See BENCHMARKS.md for the measured cost.
        """
        return self._scan_positions_of(epoch, index)

    def _fingerprint(self) -> Fingerprint:
        if self._digest is None:
            self._digest = self._input.digest + digest(self._sizes)
        return {
            "num_labels": len(self._input),
            "classes_per_batch": self.classes_per_batch,
            "samples_per_class": self.samples_per_class,
            "small_classes": self.small_classes.value,
            "labels_digest": self._digest,
            **self._schedules.fingerprint(),
        }

    def _config(self) -> dict[str, Any]:
        return {
            "classes_per_batch": self.classes_per_batch,
            "samples_per_class": self.samples_per_class,
            "small_classes": self.small_classes.value,
            "drop_last": self.drop_last,
        }

    def _data_repr(self) -> str:
        return f"labels={len(self._input)}, classes={len(self.classes)}"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_cached"] = None  # rebuilt on demand (O(classes))
        return by_reference(state)  # memory-mapped class starts travel as file names (the labels: LabelsInput's own)
