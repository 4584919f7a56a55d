"""``PackedMixtureSampler``: a mixture of sources weighted in tokens, packed into full rows, distributed.

The arithmetic (token quotas, the sources' token streams, rows) lives in
:mod:`shardwise._core.token_mixture`; this module is the torch shell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from .._core.arrays import check_non_negative_integers, digest
from .._core.errors import check_choice, check_int
from .._core.packing import PackedIndex
from .._core.state import Fingerprint
from .._core.thresholds import BY_EPOCH
from .._core.token_mixture import TokenMixturePlan, TokenStop
from .._core.token_mixture.streams import chunk_count, chunk_tokens
from .._core.weights import BY_TOKENS, CONSTANT, WeightSchedule, as_weight_schedule
from .._core.world import World
from ..index import build_or_open, read_checked
from ..index.cache import CacheDir
from ..index.lengths import LengthsInput
from .base import PlanSampler
from .keywords import ShuffledCachedKeywords
from .packed_build import SHARED_FROM
from .passes import UnitSource

if TYPE_CHECKING:
    from typing_extensions import Unpack

PLAN_VERSION = 1
"""The plan's version in the state fingerprint: a release that changes the plan bumps it."""


CHUNKS_KIND = "token-mixture-chunks"
"""The shared index of a source's chunk totals (and its lengths' range), one entry per lengths input."""


def source_lengths(lengths: object) -> tuple[list[str], list[LengthsInput]]:
    """Source names and one resolved lengths input per source."""
    names = [str(name) for name in lengths] if isinstance(lengths, Mapping) else None
    values_of = list(lengths.values()) if isinstance(lengths, Mapping) else lengths
    if isinstance(values_of, (str, bytes, np.ndarray)) or not isinstance(values_of, Sequence) or not values_of:
        raise TypeError(
            "lengths should be a non-empty sequence (or {name: lengths} mapping) with one lengths input per source "
            "(each a 1-D sequence of token counts, an array, a memory map or an HF column), but got "
            f"lengths={type(lengths).__name__}"
        )
    inputs = [LengthsInput.of(values) for values in values_of]
    return names or [str(i) for i in range(len(inputs))], inputs


def source_table(
    lengths: LengthsInput, *, shuffle: bool, cache_dir: CacheDir, timeout: float
) -> tuple[Any, np.ndarray]:
    """One source's lengths (checked) and chunk totals: from the node's shared index from ``SHARED_FROM`` on.

    The check and the totals read every length once per node: another rank maps two small files
    (its start does not grow with n); small sources are read privately, a compact copy.
    """
    chunks = chunk_count(lengths.size)
    if lengths.size < SHARED_FROM or not isinstance(lengths.values, np.ndarray):
        array = lengths.compact()  # checks every value
        return array, chunk_tokens(array, chunks, strided=shuffle)
    values = lengths.values

    def build(directory: Path) -> None:
        check_non_negative_integers("lengths", values, holds="integers (token counts)", noun="integers")
        np.save(directory / "totals.npy", chunk_tokens(values, chunks, strided=shuffle))

    key = f"{lengths.key}|{chunks}|{'strided' if shuffle else 'contiguous'}"
    arrays = build_or_open(CHUNKS_KIND, key, build, cache_dir=cache_dir, timeout=timeout)
    return values, np.asarray(read_checked(arrays["totals"], arrays["totals"][:]), dtype=np.int64)


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
    - **Each source cycles on its own**, through its documents in a keyed order per cycle and epoch
      (strided chunks of documents in a keyed order, each chunk's documents in a keyed order:
      :mod:`shardwise._core.token_mixture.streams`); a source runs out and starts again reshuffled.
    - **Epochs.** ``num_batches`` batches; without it ``stop="all_exhausted"`` (every source with a
      weight has given all its tokens at least once) or ``"first_exhausted"``.
    - **Weights that change.** A :class:`WeightSchedule` ``by_epoch`` or ``by_tokens`` (tokens
      consumed over the run, all ranks together; a change takes effect at the first batch at or
      after its threshold). ``by_tokens`` needs ``num_batches``.
    - **Resume.** The plan is a function of (lengths, weights, seed, epoch, position): the state is
      ``(epoch, consumed, seed, fingerprint)``, loaded at any world size in O(1), without replay.

    Cost at 1e9 documents: the lengths (mapped, not copied, when given as an array or memory map)
    and one pass over them at construction (their check and every source's chunk totals); a rank
    holds at most 65,536 chunk totals per source and the current cycle's chunk order (1 MB a
    source) and one chunk of ~15,000 documents: private memory does not grow with n. A batch costs
    two binary searches and one chunk's keyed order per source when its chunk changes.

    Args:
        lengths: one lengths input per source (anything ``LengthsInput.of`` takes: a sequence, an array
            or memory map, an HF column), or ``{name: lengths}`` (the names ``which`` reports).
        weights: one non-negative weight per source (only ratios matter), shares of tokens; or a
            :class:`WeightSchedule` (``constant``, ``by_epoch``, ``by_tokens``).
        max_len: tokens per row (the context length).
        rows_per_batch: rows per batch (a rank's batch of a step).
        num_batches: batches per epoch over all ranks (then ``stop="num_batches"``).
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

    def __init__(
        self,
        lengths: Sequence[Any] | Mapping[str, Any],
        weights: Any,
        *,
        max_len: int,
        rows_per_batch: int,
        num_batches: int | None = None,
        stop: TokenStop | str | None = None,
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
        self.source_names, inputs = source_lengths(lengths)
        self.weights = self._schedule(weights, len(inputs))
        self.shuffle, self.drop_last = keywords.shuffle, keywords.drop_last
        tables = [source_table(x, shuffle=self.shuffle, cache_dir=keywords.cache_dir, timeout=keywords.cache_timeout)
                  for x in inputs]  # fmt: skip
        self._plan = TokenMixturePlan([t[0] for t in tables], self.weights, totals=[t[1] for t in tables],
                                      max_len=self.max_len, rows_per_batch=self.rows_per_batch, stop=self.stop,
                                      num_batches=self.num_batches, shuffle=self.shuffle)  # fmt: skip
        self.sizes = self._plan.sizes
        self._lengths_digest = digest(np.concatenate([np.asarray(t, dtype=np.int64) for t in self._plan.totals]))
        self._init_plan(keywords)

    def _schedule(self, weights: Any, sources: int) -> WeightSchedule:
        if type(weights).__name__ == "AdaptiveWeights":
            raise TypeError(
                "weights=AdaptiveWeights(...) is not supported by PackedMixtureSampler yet: pass fixed weights or a "
                "WeightSchedule (by_epoch, by_tokens), or use MixtureSampler for adaptive weights in samples"
            )
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

    @property
    def plan(self) -> TokenMixturePlan:
        """The global plan (numpy only): epoch sizes, quotas, and every batch by position."""
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

    def _fingerprint(self) -> Fingerprint:
        return {
            "sizes": self.sizes.tolist(),
            "names": self.source_names,
            "lengths": self._lengths_digest,
            "weights": self.weights.fingerprint(),
            "max_len": self.max_len,
            "rows_per_batch": self.rows_per_batch,
            "stop": self.stop.value,
            "num_batches": self.num_batches,
            "shuffle": self.shuffle,
            "plan": PLAN_VERSION,
        }

    def _config(self) -> dict[str, Any]:
        schedule = self.weights
        weights = schedule.weights[0].tolist() if schedule.kind == CONSTANT else repr(schedule)
        return {"weights": weights, "max_len": self.max_len, "rows_per_batch": self.rows_per_batch,
                "stop": self.stop.value, "num_batches": self.num_batches, "shuffle": self.shuffle,
                "drop_last": self.drop_last}  # fmt: skip

    def _data_repr(self) -> str:
        return f"sizes={self.sizes.tolist()}, tokens={self.source_tokens}"
