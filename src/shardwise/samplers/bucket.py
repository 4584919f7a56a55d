"""``BucketBatchSampler``: length-aware batches under a token budget or of a fixed size, distributed.

Each epoch's global plan:

1. order every sample by length (longest first under ``max_tokens``, shortest first with
   ``batch_size``), equal lengths in a keyed random order that changes every epoch;
2. cut that stream into batches: a fixed ``batch_size``, or, longest first, as many samples as
   the batch's longest allows under ``max_tokens`` padded tokens (``len(batch) * max(length) <=
   max_tokens``); with ``shuffle``, the first batch takes a random share of what fits and one
   batch in eight of every run of equal lengths (at a keyed phase) one sample less, so that the
   longest samples (whose sorted order is the same every epoch) are not cut alike every epoch;
3. sort the batches by cost and shuffle them in groups of ``balance_group`` consecutive batches,
   so that neighbouring batches in the plan, hence the W batches of one global step, have
   similar cost whatever W is, while the order still changes from epoch to epoch; within a group
   the batches come in a keyed tree order (``_core.tree_order``): each aligned power-of-two block
   of the group is a run of cost-neighbours (balanced steps), and which run comes first is a coin
   at every scale (no group ascends). With ``batch_size``, step 2 cuts the sorted stream with its
   samples shuffled among neighbours (windows of one batch at a keyed offset), so that a set
   of distinct lengths gets new batches every epoch. ``batch_order="ascending"`` keeps the plan
   before (plan 1: groups ascend; fixed-size batches over distinct lengths repeat every epoch).

Memory at any n (the default ``sort_window=None``): step 1 reads a **shared length index**
(``shardwise.index.length_index``: the sample indices sorted by length, 4 bytes a sample, built
once per input by a chunked counting sort and memory-mapped read-only by every rank and worker
of the node, or read from a ``RaggedArray`` store's own ``index/``); the within-length shuffle
is a keyed permutation per length, and steps 2-3 are arithmetic over the runs of equal length
(``_core.sorted_bucketing.SortedBucketPlan``). A rank therefore holds O(distinct lengths) integers and
one chunk of batches, never an O(n) array: at 1e9 samples, 4 GB of shared index per node (8 GB
above 2**32 samples) plus a few MB per rank. With a ``sort_window`` the plan is materialised per
epoch instead (8 bytes a sample per rank): use it only where that fits.

The plan does not depend on the world size, so it is dealt out by position and resumed
elastically like every shardwise sampler.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from .._core.batching import BatchPlan
from .._core.bucketing import bucket_plan
from .._core.epoch_sizes import EpochSizes
from .._core.errors import check_bool, check_choice, check_int
from .._core.offsets import span_positions
from .._core.ordering import shuffled
from .._core.schedule import BatchSizeSchedule
from .._core.seeds import derive_seed
from .._core.sorted_bucketing import SortedBucketPlan
from .._core.state import Fingerprint
from .._core.world import World
from ..index import GroupedIndex, read_checked
from ..index.lengths import LengthsInput
from .base import PlanSampler
from .bucket_options import PLAN_VERSION, SMALL, BatchOrder, Oversized
from .keywords import ShuffledCachedKeywords
from .passes import UnitSource

if TYPE_CHECKING:
    from typing_extensions import Unpack
from .inverses import bucket_positions_of

logger = logging.getLogger("shardwise")

SHUFFLE, BUCKET = "bucket-shuffle", "bucket"


class BucketBatchSampler(PlanSampler[list[int]], Sampler[list[int]]):
    """Batches of similar-length samples, under a padded-token budget or of a fixed size, distributed.

    Pass exactly one of ``max_tokens`` (each batch keeps ``len(batch) * max(length) <=
    max_tokens``, the padded size of the batch) or ``batch_size`` (samples per batch). Every
    epoch sorts by length (equal lengths in a new random order), cuts batches and orders them so
    that neighbouring batches cost about the same: the W batches of one global step are balanced
    across ranks for every W dividing ``balance_group``. Each sample is in exactly one batch
    of an epoch's plan; ranks get equal numbers of batches by the usual rule (``drop_last``).

    Cost at 1e9 samples (default ``sort_window=None``): one shared length index per node, 4 bytes
    a sample (built once by a chunked counting sort, then memory-mapped by every rank and worker;
    see ``docs/scale.md``), and per rank O(distinct lengths) integers plus one chunk of batches:
    a warm start and the first batch take milliseconds. A ``sort_window`` materialises the plan
    per epoch and rank instead (8 bytes a sample).

    Args:
        lengths: the length (e.g. token count) of every sample: a 1-D integer sequence, a numpy
            array or memory map (used as is, never copied), a ``RaggedArray`` (its lengths
            are read from its offsets; its ``index/`` directory, written by ``RaggedWriter``,
            holds the length index), a ``pyarrow`` array or HF ``dataset["column"]`` (row
            lengths from the Arrow offsets), or a :class:`~shardwise.index.lengths.LengthsInput`
            (what every other form is resolved into, once). A length of 0 counts as 1 in the budget.
        max_tokens: padded-token budget per batch.
        batch_size: samples per batch (the one short batch goes to a random place, or is
            dropped with ``drop_last``).
        batch_size_multiple: with ``max_tokens``, batch sizes are rounded down to a multiple of
            this (e.g. 8 for tensor cores), except when fewer fit, for the last batch (of a sort
            window), and (with ``shuffle``) for the first batch, whose random size shifts the
            cut from epoch to epoch.
        sort_window: samples sorted together; ``None`` (default) sorts the whole epoch: least
            padding, and the shared index keeps memory per rank constant. A window (samples of a
            shuffled epoch sorted in windows of this many) mixes lengths more randomly at the cost
            of padding and of an O(n) plan per rank. With ``batch_size`` it is rounded up to a
            multiple of ``batch_size``.
        balance_group: consecutive batches of similar cost shuffled as one unit. Use a multiple
            of your world size: the W batches of a step then always come from one group.
            Larger groups shuffle the batch order more coarsely. The steps of any power-of-two
            W dividing the group are runs of cost-neighbours.
        batch_order: ``"mixed"`` (default) or ``"ascending"`` (the plan before: within each group
            batches ascend in cost, and fixed-size batches over distinct lengths are the same every
            epoch and seed); see :class:`BatchOrder`. Without ``shuffle`` both are the cost order.
        longest_first: the costliest batch (by padded tokens) is the epoch's first, and at every
            power-of-two world size dividing ``balance_group`` the first step holds the costliest
            batches: running out of memory shows at step 1, as HF's ``group_by_length`` does
            (what ``ShardwiseTrainer`` passes). Needs ``batch_order="mixed"`` and ``shuffle``.
        oversized: a sample longer than ``max_tokens``: ``"error"`` (default), ``"single"``
            (its own batch), or ``"skip"`` (left out and listed in ``skipped``).
        shuffle: shuffle samples and batch groups, differently every epoch.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: drop the short batch (``batch_size``) and the last partial global step,
            instead of padding that step by wrapping to the start of the plan.
        cache_dir: where the shared length index lives (``shardwise.index.build_or_open``):
            ``None`` for the default (``$SHARDWISE_CACHE_DIR``, else the per-user cache; a
            ``RaggedArray``'s own ``index/``; in-memory arrays under 2**20 samples are indexed in
            memory),
            a directory, or ``False`` to build it in private memory (with a warning).
        cache_timeout: seconds to wait for another process building the same index.

    Attributes:
        batch_size: the fixed batch size, or ``None`` with ``max_tokens`` (sizes vary: give a
            DataLoader ``batch_sampler=sampler``, never ``batch_size``).
        skipped: ``(k,)`` int64 indices left out by ``oversized="skip"`` (empty otherwise).

    Example:
        >>> sampler = BucketBatchSampler([5, 1, 3, 8, 2, 7], max_tokens=16, seed=0, num_replicas=1, rank=0)
        >>> batches = list(sampler)
        >>> sorted(i for batch in batches for i in batch)
        [0, 1, 2, 3, 4, 5]
        >>> all(len(b) * max(sampler.lengths[b]) <= 16 for b in batches)
        True
    """

    _CHUNK = 128
    _FIRST_CHUNK = 8  # a cheap first batch: about 2,000 lookups at 65,536 tokens a batch

    def __init__(
        self,
        lengths: Any,
        *,
        max_tokens: int | BatchSizeSchedule | None = None,
        batch_size: int | BatchSizeSchedule | None = None,
        batch_size_multiple: int = 1,
        sort_window: int | None = None,
        balance_group: int = 64,
        oversized: Oversized | str = Oversized.ERROR,
        batch_order: BatchOrder | str = BatchOrder.MIXED,
        longest_first: bool = False,
        **options: Unpack[ShuffledCachedKeywords],
    ) -> None:
        keywords = self._read_keywords(options)
        if (max_tokens is None) == (batch_size is None):
            raise ValueError(
                "pass exactly one of max_tokens (a padded-token budget) and batch_size (samples per batch), "
                f"but got max_tokens={max_tokens!r}, batch_size={batch_size!r}"
            )
        self.sort_window = None if sort_window is None else check_int("sort_window", sort_window, minimum=1)
        self._input = LengthsInput.of(lengths)  # resolved and checked once; never the raw input again
        self._cache_dir, self._cache_timeout = keywords.cache_dir, keywords.cache_timeout
        self._lengths: np.ndarray | None = None  # the sort_window path's private copy
        self._index: GroupedIndex | None = None
        if self.sort_window is not None:
            self._lengths = self._input.compact()
            self._index = self._input.private_index()
        else:
            self._index = self._open_index()
        num_samples = len(self._index)
        # Either may be a per-epoch BatchSizeSchedule; the attributes hold epoch 0's value.
        self._schedules = EpochSizes("BucketBatchSampler", num_samples, max_tokens=max_tokens, batch_size=batch_size)
        max_tokens = self._schedules.initial("max_tokens", max_tokens)  # type: ignore[assignment]
        batch_size = self._schedules.initial("batch_size", batch_size)  # type: ignore[assignment]
        self.max_tokens = None if max_tokens is None else check_int("max_tokens", max_tokens, minimum=1)
        self._batch_size = None if batch_size is None else check_int("batch_size", batch_size, minimum=1)
        self.batch_size_multiple = check_int("batch_size_multiple", batch_size_multiple, minimum=1)
        self.balance_group = check_int("balance_group", balance_group, minimum=1)
        self.oversized = check_choice("oversized", oversized, Oversized)
        self.batch_order = check_choice("batch_order", batch_order, BatchOrder)
        self.longest_first = check_bool("longest_first", longest_first)
        if self.longest_first and self.batch_order is not BatchOrder.MIXED:
            raise ValueError(
                "longest_first puts the costliest batch first within the mixed order; pass "
                f"batch_order='mixed' with it, but got batch_order={self.batch_order.value!r}"
            )
        self.shuffle, self.drop_last = keywords.shuffle, keywords.drop_last
        if self._batch_size is not None:
            if self.batch_size_multiple != 1:
                raise ValueError(
                    "batch_size_multiple applies to max_tokens batches; with batch_size, pass a batch_size that "
                    f"is that multiple, but got batch_size={batch_size!r}, batch_size_multiple={batch_size_multiple!r}"
                )
            if self.oversized is not Oversized.ERROR:
                raise ValueError(
                    "oversized applies to max_tokens batches (no sample is too long for a fixed batch_size), "
                    f"but got batch_size={batch_size!r}, oversized={self.oversized.value!r}"
                )
        self.skipped = np.empty(0, dtype=np.int64)
        self._pool: np.ndarray | None = None  # sort_window path: indices in the plan when some are skipped
        self._longest_kept: int | None = None  # longest length planned (oversized="skip")
        if self.max_tokens is not None:
            # the smallest budget of any epoch: one set of samples is planned in every epoch
            self._check_oversized(
                min(self._schedules.at("max_tokens", e, self.max_tokens) for e in self._schedules.epochs())
            )
        self._digest = self._input.digest(self._index)
        self._cache: tuple[int, int, BatchPlan | SortedBucketPlan] | None = None
        self._init_plan(keywords)

    def _open_index(self) -> GroupedIndex:
        """The shared length index (opened, or built once per node), or a small one in memory."""
        lengths = self._input
        if self._cache_dir is None and not lengths.mapped and lengths.size < SMALL:
            return lengths.private_index()
        if lengths.size == 0:
            lengths.value_range()  # raises: no lengths
        return lengths.shared_index(cache_dir=self._cache_dir, timeout=self._cache_timeout)

    def _grouped(self) -> GroupedIndex:
        if self._index is None:  # dropped by pickling: reopen (a few ms from the cache)
            self._index = self._open_index()
        return self._index

    def _check_oversized(self, budget: int) -> None:
        index = self._grouped()
        offsets = index.offsets
        if offsets.size - 2 <= budget:  # the longest length fits
            return
        first_over = int(offsets[budget + 1])
        count = len(index) - first_over
        if count == 0:
            return
        over = np.asarray(read_checked(index.order, index.order[first_over:]), dtype=np.int64)
        first = int(over.min())
        if self.oversized is Oversized.ERROR:
            raise ValueError(
                f"lengths[{first}]={self._length_of(first)} is longer than max_tokens={budget} "
                f"({count} sample{'s are' if count > 1 else ' is'}); pass oversized='single' to give "
                "each its own batch, oversized='skip' to leave them out, or a larger max_tokens"
            )
        if self.oversized is Oversized.SKIP:
            if count == len(index):
                raise ValueError(
                    f"every sample is longer than max_tokens={budget}, so oversized='skip' would leave nothing"
                )
            self.skipped = np.sort(over)
            self._longest_kept = budget
            if self._lengths is not None:
                self._pool = np.flatnonzero(self._lengths <= budget).astype(np.int64)
            logger.warning(
                "BucketBatchSampler: skipping %d of %d samples longer than max_tokens=%d (first: lengths[%d]=%d); "
                "their indices are in sampler.skipped",
                count, len(index), budget, first, self._length_of(first),
            )  # fmt: skip

    def _length_of(self, i: int) -> int:
        return self._input.length_of(i)

    # -- what frameworks and users read --------------------------------------------------------
    @property
    def batch_size(self) -> int | None:
        """Samples per batch, or ``None`` with ``max_tokens`` (the size varies from batch to batch)."""
        return self._schedules.at("batch_size", self.epoch, self._batch_size)

    @property
    def lengths(self) -> np.ndarray:
        """The sample lengths, read-only: the array given (not a copy), or a store's ``lengths``."""
        if self._input.store is not None:
            lengths: np.ndarray = self._input.store.lengths
            return lengths
        view: np.ndarray = (self._lengths if self._lengths is not None else self._input.values).view()
        view.flags.writeable = False
        return view

    # -- the plan ------------------------------------------------------------------------------
    def _plan(self, epoch: int, seed: int) -> BatchPlan | SortedBucketPlan:
        """The epoch's global plan, built once and kept until another epoch is asked for."""
        cached = self._cache
        if cached is not None and cached[0] == epoch and cached[1] == seed:
            return cached[2]
        plan = self._build(epoch, seed)
        self._cache = (epoch, seed, plan)
        return plan

    def _build(self, epoch: int, seed: int) -> BatchPlan | SortedBucketPlan:
        batch_size = self._schedules.at("batch_size", epoch, self._batch_size)
        max_tokens = self._schedules.at("max_tokens", epoch, self.max_tokens)
        key = derive_seed(seed, epoch, BUCKET) if self.shuffle else None
        if self._lengths is None:
            sizes = self._grouped().sizes()
            values = np.flatnonzero(sizes)
            if self._longest_kept is not None:
                values = values[values <= self._longest_kept]
            if batch_size is None:
                values = values[::-1]  # longest first under a token budget
            return SortedBucketPlan(
                values, sizes[values], batch_size=batch_size, max_tokens=max_tokens,
                multiple=self.batch_size_multiple, group=self.balance_group, key=key, drop_short=self.drop_last,
                oversized_alone=self.oversized is Oversized.SINGLE, mixed=self._mixed,
                longest_first=self.longest_first,
            )  # fmt: skip
        count = self._lengths.size if self._pool is None else self._pool.size
        order = shuffled(count, derive_seed(seed, epoch, SHUFFLE) if self.shuffle else None)
        if self._pool is not None:
            order = self._pool[order]
        return bucket_plan(
            order,
            self._lengths,
            batch_size=batch_size,
            max_tokens=max_tokens,
            multiple=self.batch_size_multiple,
            window=self.sort_window,
            group=self.balance_group,
            key=key,
            drop_short=self.drop_last,
            oversized_alone=self.oversized is Oversized.SINGLE,
            mixed=self._mixed,
            longest_first=self.longest_first,
        )

    # -- PlanSampler hooks ---------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        return len(self._plan(epoch, self.seed))

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        plan = self._plan(epoch, seed)
        if isinstance(plan, BatchPlan):
            return plan.batches
        index = self._grouped()
        ties = derive_seed(seed, epoch, SHUFFLE) if self.shuffle else None

        def batches(positions: np.ndarray) -> list[list[int]]:
            starts, sizes = plan.spans(positions)
            runs, ranks = plan.locate(plan.members(span_positions(starts, sizes)))
            values = index.members(plan.run_lengths[runs], ranks, key=ties).tolist()
            out, first = [], 0
            for size in sizes.tolist():
                out.append(values[first : first + size])
                first += size
            return out

        return batches

    def _id_count(self) -> int:
        return len(self._grouped())

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """The position of the batch holding ``index``: O(log n) on the shared index (``inverses``)."""
        tie_seed = derive_seed(self.seed, epoch, SHUFFLE) if self.shuffle else None
        return bucket_positions_of(self._plan(epoch, self.seed), self._grouped(), self._length_of, index, tie_seed)

    @property
    def _mixed(self) -> bool:
        return self.batch_order is BatchOrder.MIXED

    def _fingerprint(self) -> Fingerprint:
        # plan 2 (mixed) only where it differs from plan 1: a state without it is refused naming
        # plan, one of the ascending order (or unshuffled) still loads
        plan: Fingerprint = {"plan": PLAN_VERSION} if self.shuffle and self._mixed else {}
        if self.longest_first:
            plan["longest_first"] = True
        return plan | {
            "num_samples": len(self._grouped()),
            "lengths": self._digest,
            "max_tokens": self.max_tokens,
            "batch_size": self._batch_size,
            "batch_size_multiple": self.batch_size_multiple,
            "sort_window": self.sort_window,
            "balance_group": self.balance_group,
            "oversized": self.oversized.value,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            **self._schedules.fingerprint(),
        }

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = (
            {"batch_size": self._batch_size}
            if self._batch_size is not None
            else {"max_tokens": self.max_tokens, "batch_size_multiple": self.batch_size_multiple,
                  "oversized": self.oversized.value}
        )  # fmt: skip
        if self.skipped.size:
            config["skipped"] = int(self.skipped.size)
        config.update(
            sort_window=self.sort_window, balance_group=self.balance_group, batch_order=self.batch_order.value,
            shuffle=self.shuffle, drop_last=self.drop_last,
        )  # fmt: skip
        if self.longest_first:
            config["longest_first"] = True
        return config

    def _data_repr(self) -> str:
        present = np.flatnonzero(self._grouped().sizes())
        return f"lengths=<{len(self._grouped())} samples, {int(present[0])}..{int(present[-1])}>"

    def __getstate__(self) -> dict[str, Any]:
        # The cached plan is rebuilt on demand and the index reopened; the lengths pickle as
        # LengthsInput does (a memory map by its location: ddp_spawn and workers map the same file).
        state = super().__getstate__()
        state["_cache"] = None
        if self._lengths is None:
            state["_index"] = None
        return state
