"""``BucketBatchSampler``: length-aware batches under a token budget or of a fixed size, distributed.

Each epoch's global plan is built in four vectorised steps (``_batching``):

1. shuffle every sample (keyed by ``(seed, epoch)``);
2. sort by length within windows of ``sort_window`` consecutive samples of that shuffle;
3. cut each window into batches: a fixed ``batch_size``, or, longest first, as many samples as
   the batch's longest allows under ``max_tokens`` padded tokens (``len(batch) * max(length) <=
   max_tokens``); with ``shuffle``, the first batch of a window takes a random share of what
   fits and about one batch in eight one sample less, so that the longest samples (whose
   sorted order is the same every epoch) are not cut alike every epoch;
4. sort the batches by cost and shuffle them in groups of ``balance_group`` consecutive batches,
   so that neighbouring batches in the plan, hence the W batches of one global step, have
   similar cost whatever W is, while the order still changes from epoch to epoch.

The plan does not depend on the world size, so it is dealt out by position and resumed
elastically like every shardwise sampler.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ._arrays import check_non_negative_integers, one_dimensional
from ._base import PlanSampler, UnitSource
from ._batching import BatchPlan, bucket_plan, shuffled
from ._errors import check_bool, check_choice, check_int
from ._plan import Even
from ._schedule import BatchSizeSchedule, EpochSizes
from ._seeds import derive_seed
from ._state import Fingerprint
from ._world import World

logger = logging.getLogger("shardwise")

SHUFFLE, BUCKET = "bucket-shuffle", "bucket"


class Oversized(str, enum.Enum):
    """What ``BucketBatchSampler`` does with a sample longer than ``max_tokens``."""

    ERROR = "error"
    """Refuse at construction, naming the first such sample (the default)."""
    SINGLE = "single"
    """Give each such sample a batch of its own (that batch exceeds the budget)."""
    SKIP = "skip"
    """Leave such samples out of every epoch; their indices are in ``sampler.skipped``."""


def as_lengths(values: object) -> np.ndarray:
    """``values`` as a compact 1-D array of non-negative integer lengths, or raise naming ``lengths``.

    The dtype is the narrowest of uint16, uint32, int64 that holds every length (a copy: later
    changes to the caller's array cannot change a plan behind the sampler's back).
    """
    if isinstance(values, (str, bytes)):
        raise TypeError(f"lengths should be a 1-D sequence of integers, but got lengths={values!r}")
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as error:  # ragged nested sequences
        raise TypeError(f"lengths should be a 1-D sequence of integers, but it could not be read: {error}") from None
    array = one_dimensional("lengths", array, sequence_of="integers", one="length")
    _, high = check_non_negative_integers("lengths", array, holds="integers (token counts)", noun="integers")
    dtype = np.uint16 if high < 2**16 else np.uint32 if high < 2**32 else np.int64
    return np.array(array, dtype=dtype)


def lengths_digest(lengths: np.ndarray) -> str:
    """A short, stable digest of the lengths (dtype, shape, bytes), for the state fingerprint."""
    hasher = hashlib.blake2b(f"{lengths.dtype.str}{lengths.shape}".encode(), digest_size=8)
    hasher.update(np.ascontiguousarray(lengths).tobytes())
    return hasher.hexdigest()


class BucketBatchSampler(PlanSampler[list[int]], Sampler[list[int]]):
    """Batches of similar-length samples, under a padded-token budget or of a fixed size, distributed.

    Pass exactly one of ``max_tokens`` (each batch keeps ``len(batch) * max(length) <=
    max_tokens``, the padded size of the batch) or ``batch_size`` (samples per batch). Every
    epoch shuffles, sorts by length within windows, cuts batches and orders them so that
    neighbouring batches cost about the same: the W batches of one global step are balanced
    across ranks for every W dividing ``balance_group``. Each sample is in exactly one batch
    of an epoch's plan; ranks get equal numbers of batches by the usual rule (``drop_last``).

    Args:
        lengths: the length (e.g. token count) of every sample, a 1-D integer sequence or array;
            kept as a compact numpy array. A length of 0 counts as 1 in the budget.
        max_tokens: padded-token budget per batch.
        batch_size: samples per batch (the one short batch goes to a random place in the
            last sort window, or is dropped with ``drop_last``).
        batch_size_multiple: with ``max_tokens``, batch sizes are rounded down to a multiple of
            this (e.g. 8 for tensor cores), except when fewer fit, for the last batch of a sort
            window, and (with ``shuffle``) for the first batch of a window, whose random size
            shifts the window's cut from epoch to epoch.
        sort_window: samples sorted together; ``None`` (default) sorts the whole epoch: least
            padding. Smaller windows mix lengths more randomly at the cost of padding. With
            ``batch_size`` it is rounded up to a multiple of ``batch_size``.
        balance_group: consecutive batches of similar cost shuffled as one unit. Use a multiple
            of your world size: the W batches of a step then always come from one group.
            Larger groups shuffle the batch order more coarsely.
        oversized: a sample longer than ``max_tokens``: ``"error"`` (default), ``"single"``
            (its own batch), or ``"skip"`` (left out and listed in ``skipped``).
        shuffle: shuffle samples and batch groups, differently every epoch.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: drop the short batch (``batch_size``) and the last partial global step,
            instead of padding that step by wrapping to the start of the plan.

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
        shuffle: bool = True,
        seed: int | None = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        self._lengths = as_lengths(lengths)
        if (max_tokens is None) == (batch_size is None):
            raise ValueError(
                "pass exactly one of max_tokens (a padded-token budget) and batch_size (samples per batch), "
                f"but got max_tokens={max_tokens!r}, batch_size={batch_size!r}"
            )
        # Either may be a per-epoch BatchSizeSchedule; the attributes hold epoch 0's value.
        self._schedules = EpochSizes("BucketBatchSampler", self._lengths.size, max_tokens=max_tokens,
                                     batch_size=batch_size)  # fmt: skip
        max_tokens = self._schedules.initial("max_tokens", max_tokens)  # type: ignore[assignment]
        batch_size = self._schedules.initial("batch_size", batch_size)  # type: ignore[assignment]
        self.max_tokens = None if max_tokens is None else check_int("max_tokens", max_tokens, minimum=1)
        self._batch_size = None if batch_size is None else check_int("batch_size", batch_size, minimum=1)
        self.batch_size_multiple = check_int("batch_size_multiple", batch_size_multiple, minimum=1)
        self.sort_window = None if sort_window is None else check_int("sort_window", sort_window, minimum=1)
        self.balance_group = check_int("balance_group", balance_group, minimum=1)
        self.oversized = check_choice("oversized", oversized, Oversized)
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
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
        self._pool: np.ndarray | None = None  # indices in the plan when some are skipped
        if self.max_tokens is not None:
            # the smallest budget of any epoch: one set of samples is planned in every epoch
            self._check_oversized(
                min(self._schedules.at("max_tokens", e, self.max_tokens) for e in self._schedules.epochs())
            )
        self._digest = lengths_digest(self._lengths)
        self._cache: tuple[int, int, BatchPlan] | None = None
        self._init_plan(seed=seed, num_replicas=num_replicas, rank=rank, even=Even.DROP if drop_last else Even.PAD)

    def _check_oversized(self, budget: int) -> None:
        too_long = np.flatnonzero(self._lengths > budget)
        if not too_long.size:
            return
        first = int(too_long[0])
        if self.oversized is Oversized.ERROR:
            raise ValueError(
                f"lengths[{first}]={int(self._lengths[first])} is longer than max_tokens={budget} "
                f"({too_long.size} sample{'s are' if too_long.size > 1 else ' is'}); pass oversized='single' to give "
                "each its own batch, oversized='skip' to leave them out, or a larger max_tokens"
            )
        if self.oversized is Oversized.SKIP:
            if too_long.size == self._lengths.size:
                raise ValueError(
                    f"every sample is longer than max_tokens={budget}, so oversized='skip' would leave nothing"
                )
            self.skipped = too_long.astype(np.int64)
            self._pool = np.flatnonzero(self._lengths <= budget).astype(np.int64)
            logger.warning(
                "BucketBatchSampler: skipping %d of %d samples longer than max_tokens=%d (first: lengths[%d]=%d); "
                "their indices are in sampler.skipped",
                too_long.size, self._lengths.size, budget, first, int(self._lengths[first]),
            )  # fmt: skip

    # -- what frameworks and users read --------------------------------------------------------
    @property
    def batch_size(self) -> int | None:
        """Samples per batch, or ``None`` with ``max_tokens`` (the size varies from batch to batch)."""
        return self._schedules.at("batch_size", self.epoch, self._batch_size)

    @property
    def lengths(self) -> np.ndarray:
        """The sample lengths (a read-only view)."""
        view: np.ndarray = self._lengths.view()
        view.flags.writeable = False
        return view

    # -- the plan ------------------------------------------------------------------------------
    def _plan(self, epoch: int, seed: int) -> BatchPlan:
        """The epoch's global plan, built once and kept until another epoch is asked for."""
        cached = self._cache
        if cached is not None and cached[0] == epoch and cached[1] == seed:
            return cached[2]
        plan = self._build(epoch, seed)
        self._cache = (epoch, seed, plan)
        return plan

    def _build(self, epoch: int, seed: int) -> BatchPlan:
        count = self._lengths.size if self._pool is None else self._pool.size
        order = shuffled(count, derive_seed(seed, epoch, SHUFFLE) if self.shuffle else None)
        if self._pool is not None:
            order = self._pool[order]
        return bucket_plan(
            order,
            self._lengths,
            batch_size=self._schedules.at("batch_size", epoch, self._batch_size),
            max_tokens=self._schedules.at("max_tokens", epoch, self.max_tokens),
            multiple=self.batch_size_multiple,
            window=self.sort_window,
            group=self.balance_group,
            key=derive_seed(seed, epoch, BUCKET) if self.shuffle else None,
            drop_short=self.drop_last,
            oversized_alone=self.oversized is Oversized.SINGLE,
        )

    # -- PlanSampler hooks ---------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        return len(self._plan(epoch, self.seed))

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        return self._plan(epoch, seed).batches

    def _fingerprint(self) -> Fingerprint:
        return {
            "num_samples": int(self._lengths.size),
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
            sort_window=self.sort_window, balance_group=self.balance_group, shuffle=self.shuffle,
            drop_last=self.drop_last,
        )  # fmt: skip
        return config

    def _data_repr(self) -> str:
        return f"lengths=<{self._lengths.size} samples, {int(self._lengths.min())}..{int(self._lengths.max())}>"

    def __getstate__(self) -> dict[str, Any]:
        # The cached plan is rebuilt on demand; pickling (workers, ddp_spawn) carries only config.
        state = super().__getstate__()
        state["_cache"] = None
        return state
