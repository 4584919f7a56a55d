"""``PackedMixtureSampler``: a mixture of sources weighted in tokens, packed into full rows, distributed.

The arithmetic (token quotas, the sources' token streams, rows) lives in
:mod:`shardwise._core.token_mixture`; this module is the torch shell.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from .._core.adaptive_policies import AdaptiveWeights, as_initial
from .._core.arrays import digest
from .._core.errors import check_choice, check_int
from .._core.offsets import runs_of
from .._core.packing import PackedIndex
from .._core.provenance import ProvenanceUnsupported
from .._core.state import Fingerprint
from .._core.thresholds import BY_EPOCH
from .._core.token_mixture import TokenMixturePlan, TokenStop
from .._core.weights import BY_TOKENS, CONSTANT, WeightSchedule, as_weight_schedule
from .._core.world import World
from ..index.token_chunks import chunk_table, mixture_lengths
from .adaptive import PackedAdaptiveMixture, bound_adaptive, weights_in_force
from .base import PlanSampler
from .feedback import ADAPTIVE, Feedback
from .keywords import ShuffledCachedKeywords
from .passes import UnitSource

if TYPE_CHECKING:
    from typing_extensions import Unpack

DEFAULT_GROUP = 16
"""Batches dealt together for equal attention cost unless ``balance_group`` says otherwise."""

PLAN_VERSION = 1
"""The plan's version in the state fingerprint: a release that changes the plan bumps it."""


class PackedMixtureSampler(PlanSampler[list[int]], Sampler[list[int]]):
    """Batches of full rows drawn from several sources, whose weights are shares of **tokens**.

    Give it each source's document lengths (token counts) and the weights; wrap the sources in
    :class:`shardwise.Mixture` (index ``offset_i + k`` is document ``k`` of source ``i``) and that in
    :class:`~shardwise.PackedDataset`, and collate with :func:`~shardwise.pack_collate`. Each batch
    is ``rows_per_batch`` rows of exactly ``max_len`` tokens, a list of :class:`PackedIndex` (a
    document, its row and its token range).

    - **Weights in tokens.** Batch ``j`` holds of source ``i`` exactly the tokens
      ``Q_i(j + 1) - Q_i(j)`` of its stream, where ``Q_i`` rounds ``w_i * j * rows_per_batch *
      max_len`` down (one source, the largest, takes the remainder): every batch is within one token
      of each weight (``S - 1`` for that source), so every window of whole batches is too, and a
      source whose share of a batch is at least one token is in every batch: small weights are never
      rounded away. Weights are shares of the tokens the model sees, not of documents (a source of
      long documents weighted 0.2 gives 20% of the tokens, not 20% of the documents).
    - **Full rows.** A batch's pieces are put in a keyed order, concatenated and cut every
      ``max_len`` tokens: 100% fill, rows mix sources, a document is cut where a row or its source's
      share of a batch ends, and each piece is its own document for attention and positions
      (pretraining's concatenate-and-chunk). Ranks get ``rows_per_batch`` full rows a step each:
      equal tokens on every rank.
    - **Balanced attention.** Within each group of ``balance_group`` consecutive batches, the
      sources' pieces are dealt longest first to the batch of least attention cost so far (the sum
      of squared piece lengths) that still has room for that source: every batch keeps its exact
      quotas, and the batches of a step cost about the same (:mod:`shardwise._core.token_mixture.balance`).
    - **Each source cycles on its own**, through its documents in a keyed order per cycle and epoch
      (strided chunks of documents in a keyed order, each chunk's documents in a keyed order:
      :mod:`shardwise._core.token_mixture.streams`); a source runs out and starts again reshuffled.
    - **Epochs.** ``num_batches`` batches; without it ``stop="all_exhausted"`` (every source with a
      weight has given all its tokens at least once) or ``"first_exhausted"``.
    - **Weights that change.** A :class:`WeightSchedule` ``by_epoch`` or ``by_tokens`` (tokens
      consumed over the run, all ranks together; a change takes effect at the first batch at or
      after its threshold). ``by_tokens`` needs ``num_batches``.
    - **Adaptive weights.** ``weights=AdaptiveWeights(policy, interval=...)`` (with ``num_batches``;
      ``interval`` in batches over all ranks) moves the weights from what the loop reports:
      ``sampler.adaptive.record_tokens(losses, batch.sample_ids)`` each step (each token's source
      read from its document id), ``update()`` when ``update_due()``: one all_reduce an update, every
      update in a ledger in the state, the same weights on every rank and after a resume at any world size.
    - **Resume.** The plan is a function of (lengths, weights, seed, epoch, position): the state is
      ``(epoch, consumed, seed, fingerprint)``, loaded at any world size in O(1), without replay.

    Cost at 1e9 documents: the lengths (mapped, not copied, when given as an array or memory map)
    and one pass over them per node (their check and every source's chunk totals, kept in the
    node's shared index: 6.7-7.1 s cold for 3 sources, 1.3-2.1x one read; another rank maps them in
    8-15 ms); a rank holds at most 65,536 chunk totals per source, the current cycle's chunk order
    (1 MB a source), one chunk of ~15,000 documents and one group of batches: +2 MiB of private
    memory measured at 1e9, as at 1e8. A batch costs two binary searches per source, a chunk's
    keyed order when a source moves to its next chunk, and a group's dealing once a group (a
    rank's first batch: 6-9 ms; bench/bench_packed_mixture.py ``--scale``).

    Args:
        lengths: one lengths input per source (anything ``LengthsInput.of`` takes: a sequence, an array
            or memory map, an HF column; or a ``ShardedSource`` built with ``length_column``: the
            lengths of its shards' index), or ``{name: lengths}`` (the names ``which`` reports).
        weights: one non-negative weight per source (only ratios matter), shares of tokens; a
            :class:`WeightSchedule` (``constant``, ``by_epoch``, ``by_tokens``); or
            :class:`AdaptiveWeights` (then ``num_batches``).
        max_len: tokens per row (the context length).
        rows_per_batch: rows per batch (a rank's batch of a step).
        num_batches: batches per epoch over all ranks (then ``stop="num_batches"``).
        balance_group: batches dealt together so that each costs about the same attention (the sum
            of its pieces' squared lengths), every batch keeping its exact token quotas; default 16
            (with adaptive weights the largest divisor of the interval and ``num_batches`` up to 16);
            1: none (nor with ``shuffle=False``, which reads each source in index order).
        stop: ``"num_batches"``, ``"all_exhausted"`` (default without ``num_batches``) or
            ``"first_exhausted"``.
        shuffle: keyed orders of documents and of pieces in rows, new every epoch; ``False``: each
            source in index order, sources' pieces in source order.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: cut the last partial global step instead of padding it by repeating batches from the
            plan's start.
        cache_dir: where the sources' chunk totals live (from 2**18 documents a source given as an array
            or memory map; see :func:`shardwise.index.build_or_open`): ``None`` the default cache,
            ``False`` private.
        cache_timeout: seconds to wait for another process of the node building them.

    Example:
        >>> sampler = PackedMixtureSampler([[300, 200, 500], [50] * 40], [0.5, 0.5], max_len=100,
        ...                                rows_per_batch=2, seed=0, num_replicas=1, rank=0)
        >>> batch = next(iter(sampler))
        >>> [sum(i.stop - i.start for i in batch if i.row == r) for r in range(2)]
        [100, 100]
        >>> sum(i.stop - i.start for i in batch if int(i) < 3)  # source 0: half the tokens
        100
    """

    _CHUNK = 64
    _FIRST_CHUNK = 1
    _plan: TokenMixturePlan

    def __init__(
        self,
        lengths: Sequence[Any] | Mapping[str, Any],
        weights: Any,
        *,
        max_len: int,
        rows_per_batch: int,
        num_batches: int | None = None,
        stop: TokenStop | str | None = None,
        balance_group: int | None = None,
        **options: Unpack[ShuffledCachedKeywords],
    ) -> None:
        keywords = self._read_keywords(options)
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.rows_per_batch = check_int("rows_per_batch", rows_per_batch, minimum=1)
        self.num_batches = None if num_batches is None else check_int("num_batches", num_batches, minimum=1)
        default = TokenStop.NUM_BATCHES if num_batches is not None else TokenStop.ALL_EXHAUSTED
        self.stop = default if stop is None else check_choice("stop", stop, TokenStop)
        if (self.stop is TokenStop.NUM_BATCHES) != (self.num_batches is not None):
            raise ValueError(
                f"num_batches goes with stop='num_batches' (and stop='num_batches' needs it), but got "
                f"num_batches={num_batches!r}, stop={self.stop.value!r}"
            )
        self.source_names, inputs = mixture_lengths(lengths)
        config = weights if isinstance(weights, AdaptiveWeights) else None
        self._adaptive_config = config
        initial = None if config is None else as_initial(config.initial, len(inputs))
        self.weights = self._schedule(weights if initial is None else initial, len(inputs))
        if config is not None and self.num_batches is None:
            raise ValueError(
                f"weights=AdaptiveWeights(...) needs num_batches (an epoch's length may not depend on weights not "
                f"yet known), but got stop={self.stop.value!r}; pass num_batches"
            )
        self.balance_group = self._balance_group(balance_group)
        self.shuffle, self.drop_last = keywords.shuffle, keywords.drop_last
        tables = [chunk_table(x, shuffle=self.shuffle, cache_dir=keywords.cache_dir, timeout=keywords.cache_timeout)
                  for x in inputs]  # fmt: skip
        lengths, totals = [t[0] for t in tables], [t[1] for t in tables]
        self._plan = TokenMixturePlan(lengths, self.weights, totals=totals, max_len=self.max_len,
                                      rows_per_batch=self.rows_per_batch, stop=self.stop, num_batches=self.num_batches,
                                      shuffle=self.shuffle, balance_group=self.balance_group)  # fmt: skip
        self.sizes = self._plan.sizes
        self._lengths_digest = digest(np.concatenate([np.asarray(t, dtype=np.int64) for t in self._plan.totals]))
        self._feedback: Feedback | None = None
        if config is not None and initial is not None and self.num_batches is not None:
            # NOTE [ Adaptive weights in tokens ]: weights change at any batch (block 1), and every positive
            # weight is drawn as asked (its tokens floor per batch, the sum exact): no least share to lift to.
            self._feedback = Feedback(config, initial, 1, self.num_batches, least_share=1, unit="batches")
            self._plan.reveal_until(self._feedback.ledger.known_until)
        self._init_plan(keywords)

    def _balance_group(self, given: int | None) -> int:
        """``balance_group`` as given, else 16; with adaptive weights a divisor of the interval and of num_batches.

        A group is dealt whole, so every one of its batches' weights must be known: groups may not
        straddle an update's boundary (an interval's end) nor an epoch's end.
        """
        interval = self._adaptive_config.interval if self._adaptive_config is not None else None
        if given is None:
            if interval is None or self.num_batches is None:
                return DEFAULT_GROUP
            return max(d for d in range(1, DEFAULT_GROUP + 1) if not interval % d and not self.num_batches % d)
        group = check_int("balance_group", given, minimum=1)
        if interval is not None and self.num_batches is not None and (self.num_batches % group or interval % group):
            raise ValueError(
                f"balance_group should divide num_batches and the AdaptiveWeights interval (a group of batches is "
                f"dealt whole, so all its weights must be known), but got balance_group={group}, num_batches="
                f"{self.num_batches}, interval={interval}; pass a divisor of both, or leave it out"
            )
        return group

    def _schedule(self, weights: Any, sources: int) -> WeightSchedule:
        schedule = as_weight_schedule(weights)
        if schedule.kind not in (CONSTANT, BY_EPOCH, BY_TOKENS):
            raise ValueError(
                "weights should be fixed weights or a WeightSchedule constant, by_epoch or by_tokens (tokens "
                f"consumed), but got a {schedule.kind} schedule; use WeightSchedule.by_tokens with thresholds in tokens"
            )
        if schedule.kind == BY_TOKENS and self.stop is not TokenStop.NUM_BATCHES:
            raise ValueError(
                "weights=WeightSchedule.by_tokens(...) needs num_batches (an epoch's length may not depend on weights "
                f"that change inside it), but got stop={self.stop.value!r}; pass num_batches"
            )
        schedule.check_sources(sources)
        return schedule

    def _core_plan(self) -> TokenMixturePlan:
        """``sampler.plan.core``: the global plan (numpy only): epoch sizes, quotas, and every batch by position."""
        return self._plan

    @property
    def offsets(self) -> list[int]:
        """Where each source starts in the concatenated index space (``shardwise.Mixture``'s order)."""
        return [int(x) for x in self._plan.offsets]

    @property
    def source_tokens(self) -> list[int]:
        """Every source's tokens (the sum of its lengths)."""
        return [int(x) for x in self._plan.source_tokens]

    def _batches(self, epoch: int, seed: int, positions: np.ndarray) -> list[list[int]]:
        out: list[list[int]] = []
        for position in positions.tolist():
            ids, rows, starts, stops = self._plan.batch(epoch, seed, position)
            spans = zip(ids.tolist(), rows.tolist(), starts.tolist(), stops.tolist(), strict=True)
            out.append([PackedIndex.trusted(i, r, a, z) for i, r, a, z in spans])
        return out

    # -- adaptive weights ----------------------------------------------------------------------
    def sources_of(self, indices: Any) -> np.ndarray:
        """The source of each global document id (int64; ids in ``[0, sum(sizes))``).

        Raises:
            TypeError: ``indices`` are not integers.
            IndexError: an id is negative or ``>= sum(sizes)``.
        """
        return runs_of(self.sizes, indices, noun="documents")

    @property
    def adaptive(self) -> PackedAdaptiveMixture | None:
        """The adaptive weights (``record_tokens``, ``update``, the ledger), or ``None`` for fixed weights.

        Built on each access, bound to this sampler (NOTE [ Adaptive weights read their sampler
        through a link ] in ``samplers.adaptive``); ``adaptive.config`` is the ``AdaptiveWeights`` given.
        """
        return bound_adaptive(PackedAdaptiveMixture, self._feedback, self, trained=self._trained,
                              fingerprint=self._full_fingerprint)  # fmt: skip

    def _trained(self) -> tuple[int, int]:
        """``(epoch, consumed)`` the loop has trained through: the adaptive weights' clock."""
        self._sync()
        return self._progress.epoch, self._progress.consumed

    def weights_at(self, epoch: int, position: int) -> list[float]:
        """The token weights in force at batch ``position`` of ``epoch`` (exact shares summing to 1).

        Raises:
            PendingWeightsError: adaptive weights no update has set yet (the batch lies at or past
                ``adaptive.ledger.known_until``).
        """
        epoch = check_int("epoch", epoch, minimum=0)
        return weights_in_force(self._plan, epoch, position, self._plan_size(epoch))

    def _known_positions(self) -> Callable[[np.ndarray], np.ndarray] | None:
        if self._feedback is None:
            return None
        plan, epoch = self._plan, self._progress.epoch  # the live pass's: it waits for the ledger's weights
        return lambda positions: plan.known_prefix(epoch, positions)

    def state_dict(self) -> dict[str, Any]:
        """The shell's O(1) state; an adaptive mixture adds its weight ledger (``state["adaptive"]``)."""
        state = super().state_dict()
        if self._feedback is not None:
            state[ADAPTIVE] = self._feedback.ledger.to_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The shell's resume; an adaptive mixture also takes the saved ledger and replays it into the plan."""
        feedback = self._feedback
        if feedback is None:
            super().load_state_dict(state_dict)
            return
        ledger = feedback.saved_ledger(state_dict, type(self).__name__)
        super().load_state_dict(state_dict)  # checks the fingerprint (policy, interval)
        self._plan = feedback.plan_of(ledger, self._plan.renewed)

    # -- PlanSampler hooks ---------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        return self._plan.epoch_size(epoch)

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        return lambda positions: self._batches(epoch, seed, positions)

    def _id_count(self) -> int:
        return int(self.sizes.sum())

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every batch of ``epoch`` holding a token of document ``index`` (provenance)."""
        index = check_int("index", index, minimum=0, maximum=int(self.sizes.sum()) - 1)
        return self._plan.positions_of(epoch, self.seed, index)

    def _positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """Every batch of ``epoch`` holding a piece of one of ``ids`` (``skip_ids``): O(a group's batches) an id.

        NOTE [ Skipping documents of a packed mixture ]: a batch is the plan's unit, so skipping a
        document skips the batches that hold its pieces (one or two a cycle of its source), with the
        other pieces of those batches: the document never trains, the others come back in their
        sources' next cycles and epochs. Leaving only the document out would move every later token
        of its source, and so change batches of the epoch already trained.
        """
        if self._feedback is not None:
            raise ProvenanceUnsupported(
                "PackedMixtureSampler cannot skip document ids with adaptive weights (the batches that hold them "
                "are known only as far as the ledger); skip plan positions instead (shardwise.skip_steps)"
            )
        total = int(self.sizes.sum())
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= total):
            raise ValueError(f"document ids should be in [0, {total - 1}], but got ids up to {int(ids.max())}")
        found = [self._plan.positions_of(epoch, self.seed, int(i)) for i in np.unique(ids).tolist()]
        return np.unique(np.concatenate([np.empty(0, dtype=np.int64), *found]))

    def _fingerprint(self) -> Fingerprint:
        return {
            "sizes": self.sizes.tolist(),
            "names": self.source_names,
            "lengths": self._lengths_digest,
            "weights": (self._adaptive_config or self.weights).fingerprint(),
            "max_len": self.max_len,
            "rows_per_batch": self.rows_per_batch,
            "stop": self.stop.value,
            "num_batches": self.num_batches,
            "balance_group": self.balance_group,
            "shuffle": self.shuffle,
            "plan": PLAN_VERSION,
        }

    def _config(self) -> dict[str, Any]:
        schedule = self.weights
        weights = schedule.weights[0].tolist() if schedule.kind == CONSTANT else repr(schedule)
        if self._adaptive_config is not None:
            weights = repr(self._adaptive_config)
        return {"weights": weights, "max_len": self.max_len, "rows_per_batch": self.rows_per_batch,
                "stop": self.stop.value, "num_batches": self.num_batches, "balance_group": self.balance_group,
                "shuffle": self.shuffle,
                "drop_last": self.drop_last}  # fmt: skip

    def _data_repr(self) -> str:
        return f"sizes={self.sizes.tolist()}, tokens={self.source_tokens}"
