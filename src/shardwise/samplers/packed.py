"""``PackedBatchSampler``: sequence packing into rows of ``max_len`` tokens, balanced, online, distributed.

Each unit of the global plan is a batch of **rows**; each row is a few documents (samples, or
pieces of long samples) whose lengths add up to at most ``max_len``. How an epoch's plan is made
(the arithmetic is in ``_core.packing``):

1. once, at construction: every item (a sample, or a piece of one) is grouped by length (a
   counting sort, O(n)), and the number of batches of every **stratum** is computed. A stratum
   takes a fixed share of every length class, so every stratum looks like the whole data set
   (the same mix of long and short documents) and its packing depends on the class sizes only;
2. each epoch: the strata are visited in a keyed random order, and each takes a keyed random
   choice of items of each length (a Feistel permutation per length class: O(1) memory);
3. each stratum is packed on its own when the plan reaches it: best-fit decreasing into rows,
   then the rows (with the emptiest rows the previous stratum handed on, beyond its multiple
   of ``rows_per_batch``) dealt back and forth into batches of equal cost (tokens, or the sum
   of squared document lengths with ``balance="attention"``), then batches, rows and documents
   shuffled.

So the number of batches of every epoch is known before the first batch, the same on every rank
and in every epoch; the first batch waits for one stratum, not for the epoch; a rank holds one
stratum at a time; and a position of the plan is found in O(strata), which makes resume O(1) in
the data size and elastic like every shardwise sampler (the plan does not depend on the world size).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from .._core.errors import check_choice, check_int
from .._core.packing import (
    PLAN_VERSION,
    Balance,
    PackedIndex,
    PieceIndex,
    StratumLayout,
    StratumPlan,
    TooLong,
    carried_slots,
    class_phases,
    class_shuffle_key,
    long_samples,
    order_stratum,
    piece_index,
    shuffle_within_classes,
    stratum_layouts,
    stratum_order_key,
    stratum_slots,
)
from .._core.permutation import Permutation
from .._core.seeds import derive_seed
from .._core.state import Fingerprint
from .._core.world import World
from ..index import group_keys, key_of, permute_within, read_checked
from ..index.cache import SHARED_FROM
from ..index.packing import lengths_array, lengths_range, read_layout, shared_index, shared_layouts
from .base import PlanSampler
from .keywords import ShuffledCachedKeywords
from .passes import UnitSource

if TYPE_CHECKING:
    from typing_extensions import Unpack
from .inverses import packed_positions_of

logger = logging.getLogger("shardwise")


class PackedBatchSampler(PlanSampler[list[int]], Sampler[list[int]]):
    """Batches of packed rows: documents concatenated into rows of at most ``max_len`` tokens, distributed.

    Give it every sample's length (token count). Each batch it yields is a list of
    :class:`PackedIndex` (plain ints to any dataset) that also carry their row in the batch and
    their token range; wrap the dataset in :class:`~shardwise.PackedDataset` and use
    :func:`~shardwise.pack_collate` to get ``input_ids``, ``position_ids``, ``cu_seqlens`` and
    the rest. Every sample is in exactly one batch of an epoch (``too_long="split"``: each of
    its pieces), rows never exceed ``max_len``, and ranks get equal numbers of batches.

    Pass exactly one of ``rows_per_batch`` (each batch is that many rows, except fewer than
    ``rows_per_batch`` batches an epoch (per stratum if ``window`` packs fewer than
    ``rows_per_batch`` rows) that hold one row less; ``drop_last=True`` makes
    every batch full by leaving those rows' documents out of this epoch) or ``tokens_per_batch``
    (each batch is as many rows as keep its real tokens within the budget: for padding-free
    varlen training).

    Long samples (``too_long``): ``"split"`` (default) cuts a sample of length ``L > max_len``
    into ``ceil(L / max_len)`` pieces, piece ``k`` holding tokens ``[k * max_len, min((k + 1) *
    max_len, L))``; the full pieces fill rows of their own, the rest is packed like any sample,
    and each piece is its own document for attention, positions and labels (no attention across
    pieces). ``"skip"`` leaves such samples out (``sampler.skipped``); ``"error"`` refuses them.

    Cost at 1e9 samples: the item index (sample ids grouped by length, 4 bytes a sample; with
    split samples the piece index, 8 bytes an item) and the strata layouts (4 bytes an item, 4 a
    row) live in the node's shared index cache, built once per node by one process and
    memory-mapped by every rank and worker: two chunked passes over the lengths for the index
    (O(chunk) private memory), then ~30,000 strata packed and dealt into batches, spread over
    the node's cores (``SHARDWISE_BUILD_WORKERS``; see docs/scale.md for measured times). A rank's
    private memory is one stratum (about 100 bytes an item of ``window``); another rank's start
    reads two numbers and maps the files (tens of ms), the first batch of an epoch costs one
    stratum (~20 ms), a rank's whole epoch about 1 ms of packing per stratum spread over the epoch.
    With the ``fast`` extra (numba) the whole build is compiled and runs on threads (about 1 ms a
    stratum instead of ~10), with the same files byte for byte (``SHARDWISE_NUMBA=0`` forces the
    pure-Python and numpy steps).

    Args:
        lengths: the length of every sample, a 1-D sequence of non-negative integers.
        max_len: tokens per row (the context length).
        rows_per_batch: rows per batch (fixed-shape batches ``(rows_per_batch, max_len)``).
        tokens_per_batch: real-token budget per batch (>= ``max_len``).
        too_long: ``"split"``, ``"skip"`` or ``"error"``: samples longer than ``max_len``.
        balance: ``"tokens"`` (default) makes the batches of a stratum (hence of every step)
            hold about the same number of tokens; ``"attention"`` the same sum of squared
            document lengths (per-document attention cost), while rows stay as full.
        window: items (documents or pieces) per stratum. Larger: rows packed a little tighter
            (each stratum's last row is partly empty), more memory per rank (about
            100 bytes an item) and a later first batch.
        balance_group: batches of a stratum sorted by cost are shuffled in groups of this many:
            use a multiple of the world size, so that the W batches of a step cost alike.
        shuffle: reshuffle strata, their documents, batches and rows every epoch.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: make every batch full (leave out the last stratum's emptiest rows beyond a
            multiple of ``rows_per_batch``, different documents every epoch) and drop the last
            partial global step instead of padding it.
        cache_dir: where the shared index lives (from 2**18 samples on; see
            :func:`shardwise.index.build_or_open`): ``None`` the default cache, ``False`` private.
        cache_timeout: seconds to wait for another process of the node building the index.

    Attributes:
        skipped: ``(k,)`` int64 samples left out by ``too_long="skip"`` (empty otherwise).

    Example:
        >>> sampler = PackedBatchSampler([5, 1, 3, 8, 2, 7, 4, 6], max_len=8, rows_per_batch=2, seed=0,
        ...                              num_replicas=1, rank=0)
        >>> batches = list(sampler)
        >>> sorted(int(i) for batch in batches for i in batch)
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> all(sum(i.stop - i.start for i in b if i.row == r) <= 8 for b in batches for r in range(2))
        True
    """

    _CHUNK = 64
    _FIRST_CHUNK = 1

    def __init__(
        self,
        lengths: Any,
        *,
        max_len: int,
        rows_per_batch: int | None = None,
        tokens_per_batch: int | None = None,
        too_long: TooLong | str = TooLong.SPLIT,
        balance: Balance | str = Balance.TOKENS,
        window: int = 1 << 15,
        balance_group: int = 64,
        **options: Unpack[ShuffledCachedKeywords],
    ) -> None:
        keywords = self._read_keywords(options)
        self._lengths = lengths_array(lengths)
        self.max_len = check_int("max_len", max_len, minimum=1)
        if (rows_per_batch is None) == (tokens_per_batch is None):
            raise ValueError(
                "pass exactly one of rows_per_batch (rows of max_len per batch) and tokens_per_batch (a real-token "
                f"budget per batch), but got rows_per_batch={rows_per_batch!r}, tokens_per_batch={tokens_per_batch!r}"
            )
        self.rows_per_batch = None if rows_per_batch is None else check_int("rows_per_batch", rows_per_batch, minimum=1)
        self.tokens_per_batch = (
            None if tokens_per_batch is None else check_int("tokens_per_batch", tokens_per_batch, minimum=1)
        )
        if self.tokens_per_batch is not None and self.tokens_per_batch < self.max_len:
            raise ValueError(
                f"tokens_per_batch should be at least max_len={self.max_len} (a full row must fit in a batch), "
                f"but got tokens_per_batch={tokens_per_batch!r}"
            )
        self.too_long = check_choice("too_long", too_long, TooLong)
        self.balance = check_choice("balance", balance, Balance)
        self.window = check_int("window", window, minimum=1)
        self.balance_group = check_int("balance_group", balance_group, minimum=1)
        self.shuffle, self.drop_last = keywords.shuffle, keywords.drop_last
        self._num_samples = int(self._lengths.size)
        self._shared = self._num_samples >= SHARED_FROM
        self._cache_dir, self._cache_timeout = keywords.cache_dir, keywords.cache_timeout
        self._key = key_of(self._lengths)
        self._split = False
        self._index_cache: PieceIndex | None = None
        if self._shared:
            self._low, self._high = lengths_range(self._lengths, self._key, self._cache_dir, self._cache_timeout)
            if self._high > self.max_len and (self.too_long is TooLong.ERROR or self._low > self.max_len):
                long_samples(self._lengths, self.max_len, self.too_long)  # raises, naming the first one
            self._split = self.too_long is TooLong.SPLIT and self._high > self.max_len
            self._index_cache = shared_index(self._lengths, self._key, self.max_len, self.too_long, self._split,
                                             self._cache_dir, self._cache_timeout)  # fmt: skip
        else:
            self._low, self._high = int(self._lengths.min()), int(self._lengths.max())
        self.skipped = self._index.skipped
        if self.skipped.size:
            first = int(self.skipped[0])
            logger.warning(
                "PackedBatchSampler: skipping %d of %d samples longer than max_len=%d (first: lengths[%d]=%d); "
                "their indices are in sampler.skipped",
                self.skipped.size, self._num_samples, self.max_len, first, int(self._lengths[first]),
            )  # fmt: skip
        self._counts = self._index.counts
        self._phases = class_phases(self._counts.size)
        self.num_strata = max(1, -(-self._index.num_items // self.window))
        self._layouts: list[StratumLayout] | None = None
        self._layout_arrays: dict[str, np.ndarray] | None = None
        self._shuffle: tuple[int, int, np.ndarray] | None = None  # (epoch, seed, order within classes)
        self._stratum_batches = self._batch_counts()
        self._total = int(self._stratum_batches.sum())
        if self._shared:
            self._lengths = np.empty(0, dtype=np.int64)  # not needed past construction: keep no O(n) copy
        self._layout: tuple[int, int, np.ndarray, np.ndarray] | None = None  # (epoch, seed, strata, starts)
        self._stratum: tuple[int, int, int, StratumPlan] | None = None  # (epoch, seed, slot, plan)
        self._init_plan(keywords)

    # -- the item index ------------------------------------------------------------------------
    @property
    def _index(self) -> PieceIndex:
        """The item index: built privately for small data, else opened from the node's shared cache."""
        if self._index_cache is None:
            if self._shared:
                self._index_cache = shared_index(None, self._key, self.max_len, self.too_long, self._split,
                                                  self._cache_dir, self._cache_timeout)  # fmt: skip
            else:
                self._index_cache = piece_index(self._lengths, self.max_len, self.too_long)
        return self._index_cache

    def _layout_config(self) -> str:
        return (f"{self._key}|{self.too_long.value}|{self.max_len}|{self.rows_per_batch}|{self.tokens_per_batch}|"
                f"{self.balance.value}|{self.window}|{self.drop_last}|plan={PLAN_VERSION}")  # fmt: skip

    def _batch_counts(self) -> np.ndarray:
        """Batches of every stratum, from the strata's layouts (epoch-independent, computed once).

        Small data keeps the layouts in private memory (a few MB at most); large data keeps them
        in the node's shared cache (built by one process per node, memory-mapped by all), so an
        epoch only fills the layouts with its items.
        """
        if not self._shared:
            self._layouts = list(stratum_layouts(
                self._counts, self.num_strata, self.max_len, rows_per_batch=self.rows_per_batch,
                tokens_per_batch=self.tokens_per_batch, balance=self.balance, drop_short=self.drop_last,
            ))  # fmt: skip
            return np.array([layout.num_batches for layout in self._layouts], dtype=np.int64)
        arrays = self._shared_layouts(build=True)
        return np.diff(np.asarray(arrays["batch_offsets"]))

    def _shared_layouts(self, *, build: bool) -> dict[str, np.ndarray]:
        cached = self._layout_arrays
        if cached is not None:
            return cached
        self._layout_arrays = shared_layouts(
            self._layout_config(), self._counts if build else None, self.num_strata, self.max_len,
            rows_per_batch=self.rows_per_batch, tokens_per_batch=self.tokens_per_batch, balance=self.balance,
            drop_short=self.drop_last, cache_dir=self._cache_dir, timeout=self._cache_timeout,
        )  # fmt: skip
        return self._layout_arrays

    def _stratum_layout(self, stratum: int) -> StratumLayout:
        if self._layouts is not None:
            return self._layouts[stratum]
        return read_layout(self._shared_layouts(build=False), stratum)

    @property
    def num_items(self) -> int:
        """Documents packed per epoch: samples, plus the extra pieces of split samples, less skipped ones."""
        return self._index.num_items

    # -- the plan ------------------------------------------------------------------------------
    def _class_order(self, epoch: int, seed: int) -> np.ndarray:
        cached = self._shuffle
        if cached is None or cached[:2] != (epoch, seed):
            cached = (epoch, seed, shuffle_within_classes(self._index.offsets, class_shuffle_key(seed, epoch)))
            self._shuffle = cached
        return cached[2]

    def _strata_layout(self, epoch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's stratum at each slot and the plan position where each slot starts."""
        cached = self._layout
        if cached is not None and cached[0] == epoch and cached[1] == seed:
            return cached[2], cached[3]
        slots = np.arange(self.num_strata, dtype=np.int64)
        strata = Permutation(self.num_strata, stratum_order_key(seed, epoch))(slots) if self.shuffle else slots
        starts = np.zeros(self.num_strata + 1, dtype=np.int64)
        np.cumsum(self._stratum_batches[strata], out=starts[1:])
        self._layout = (epoch, seed, strata, starts)
        return strata, starts

    def _stratum_plan(self, epoch: int, seed: int, slot: int, stratum: int) -> StratumPlan:
        cached = self._stratum
        if cached is not None and cached[:3] == (epoch, seed, slot):
            return cached[3]
        classes, ranks = stratum_slots(self._counts, self.num_strata, stratum, self._phases)
        layout = self._stratum_layout(stratum)
        if layout.carried:  # the rows the previous stratum handed on: its slots, filled with this epoch's items
            previous = stratum_slots(self._counts, self.num_strata, stratum - 1, self._phases)
            more = carried_slots(self._stratum_layout(stratum - 1), *previous, own_rows=layout.own_rows)
            classes, ranks = np.concatenate([classes, more[0]]), np.concatenate([ranks, more[1]])
            layout = StratumLayout(np.concatenate([layout.slot_rows, more[2]]), layout.batch_of_row,
                                   layout.batch_keys, layout.carried)  # fmt: skip
        items = self._index.offsets[classes] + ranks
        if self.shuffle and self._shared:  # O(1) memory: a keyed Feistel permutation per class
            keys = group_keys(class_shuffle_key(seed, epoch), classes)
            items = self._index.offsets[classes] + permute_within(ranks, self._counts[classes], keys)
        elif self.shuffle:  # small data: the whole shuffle materialised once per epoch, faster
            items = self._class_order(epoch, seed)[items]
        key = derive_seed(seed, epoch, "pack", stratum) if self.shuffle else None
        plan = order_stratum(items, classes, layout, group=self.balance_group, key=key)
        self._stratum = (epoch, seed, slot, plan)
        return plan

    def _batches(self, epoch: int, seed: int, positions: np.ndarray) -> list[list[int]]:
        strata, starts = self._strata_layout(epoch, seed)
        slots = np.searchsorted(starts, positions, side="right") - 1
        index = self._index
        out: list[list[int]] = []
        for position, slot in zip(positions.tolist(), slots.tolist(), strict=True):
            plan = self._stratum_plan(epoch, seed, slot, int(strata[slot]))
            b = position - int(starts[slot])
            first_row, last_row = int(plan.batch_offsets[b]), int(plan.batch_offsets[b + 1])
            lo, hi = int(plan.row_offsets[first_row]), int(plan.row_offsets[last_row])
            items = plan.items[lo:hi]
            samples = np.asarray(read_checked(index.sample, index.sample[items]), dtype=np.int64)
            item_starts = (
                np.zeros(items.size, dtype=np.int64)
                if index.start is None
                else np.asarray(read_checked(index.start, index.start[items]))
            )
            stops = item_starts + plan.lengths[lo:hi]
            rows = np.repeat(np.arange(last_row - first_row), np.diff(plan.row_offsets[first_row : last_row + 1]))
            spans = zip(samples.tolist(), rows.tolist(), item_starts.tolist(), stops.tolist(), strict=True)
            out.append([PackedIndex.trusted(s, r, a, z) for s, r, a, z in spans])
        return out

    # -- PlanSampler hooks ---------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        return self._total

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        return lambda positions: self._batches(epoch, seed, positions)

    def _id_count(self) -> int:
        return self._num_samples

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every position whose batch holds ``index``: each stratum searched, O(n) (``inverses``)."""
        seed = self.seed
        strata, starts = self._strata_layout(epoch, seed)

        def stratum_plan(slot: int, stratum: int) -> Any:
            return self._stratum_plan(epoch, seed, slot, stratum)

        return packed_positions_of(strata, starts, self._index.sample, stratum_plan, index)

    def _fingerprint(self) -> Fingerprint:
        return {
            "num_samples": self._num_samples,
            "lengths": self._key,
            "max_len": self.max_len,
            "rows_per_batch": self.rows_per_batch,
            "tokens_per_batch": self.tokens_per_batch,
            "too_long": self.too_long.value,
            "balance": self.balance.value,
            "window": self.window,
            "balance_group": self.balance_group,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "plan": PLAN_VERSION,
        }

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"max_len": self.max_len}
        if self.rows_per_batch is not None:
            config["rows_per_batch"] = self.rows_per_batch
        else:
            config["tokens_per_batch"] = self.tokens_per_batch
        config.update(too_long=self.too_long.value, balance=self.balance.value, window=self.window,
                      balance_group=self.balance_group, shuffle=self.shuffle, drop_last=self.drop_last)  # fmt: skip
        if self.skipped.size:
            config["skipped"] = int(self.skipped.size)
        return config

    def _data_repr(self) -> str:
        return f"lengths=<{self._num_samples} samples, {self._low}..{self._high}>"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_layout"] = state["_stratum"] = state["_shuffle"] = None
        if self._shared:  # reopened from the node's cache where it is unpickled
            state["_index_cache"] = state["_layout_arrays"] = None
        return state
