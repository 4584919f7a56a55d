"""``WeightedSampler``: distributed weighted sampling where the draw at plan position ``p`` is a pure function.

The method, all in integer arithmetic so that a plan is bit-identical on every platform:

1. **Quantise.** Weights are scaled by a power of two (exact in floating point) so that the
   largest becomes an integer just below ``2**(62 - bits(n))``, then floored to int64; a positive
   weight that would floor to 0 is kept at 1, so the support never shrinks. The total ``Q`` is
   below ``2**62``. A weight's relative precision is ``2**-(62 - bits(n))`` of the largest weight
   (``2**-35`` for ``n = 1e8``).
2. **Table.** The inclusive cumulative sum ``cdf`` (int64) plus a *guide table* (Chen & Asau):
   ``guide[k]`` is the item holding value ``k << shift``, with about ``n`` buckets, so the item
   holding a value ``u`` lies in ``[guide[u >> shift], guide[(u >> shift) + 1]]``, a range of about
   two items on average; a vectorised bisection finishes in a few steps. 12 bytes per weight
   (16 beyond 2**31 weights, where the guide needs int64), built in blocks of 1M weights once
   per weights and node into the shared index cache (``shardwise.index``), which every rank and
   DataLoader worker memory-maps read-only: no rank holds a private copy.
3. **Uniform.** ``u`` at position ``p`` is exactly uniform on ``[0, Q)``: a counter-based hash of
   ``(key, p)`` (two splitmix64 rounds keyed by ``derive_seed(seed, epoch, ...)``) reduced by
   Lemire's multiply-high with rejection, retries keyed by the attempt number.

So ``index(p) = item holding u(seed, epoch, p)``: O(1) expected per draw, vectorised, no
state, and any position can be drawn without drawing the ones before it (O(1) resume).

Sampling without replacement is *successive sampling*, the distribution of
``torch.multinomial(..., replacement=False)``: the plan is the sequence of first occurrences in
the with-replacement stream. That order depends on every draw before it (no position-addressable
exact algorithm with bounded memory is known), so the epoch's whole plan is computed, but once
per node and epoch: one process builds it into the index cache (kind ``"weighted-distinct-v1"``,
under the cache's lock; the others wait) and every rank and DataLoader worker maps it read-only.
While building, whenever the items already drawn hold half of the remaining weight, the table is
rebuilt without them (at most 62 rebuilds, since each halves an integer total below ``2**62``)
so skipping repeats stays cheap.

Cost at 1e9 weights. With replacement: the shared table is 12 GB on disk and in the page cache
(16 GB beyond 2**31 weights), built once per node (two streaming passes over the weights,
private memory O(1M weights)); per rank, a chunk of 65,536 draws at a time, nothing O(n); first
draw in milliseconds once the table exists. Without replacement, per node: the table, plus the
epoch's plan file, 8 bytes per ``num_samples`` (8 GB for 1e9 draws), two epochs kept at most (the
process that builds epoch ``e`` removes this sampler's plans of other epochs but ``e - 1``);
transiently, in the one process that builds the plan, a bit per weight (125 MB at 1e9) and, once
the drawn weight passes half, a rebuilt private table (12 bytes per weight, 16 beyond 2**31; up to
about 28 bytes per weight at the moment of a rebuild) for the rest of that build. Per rank, O(1)
private memory, as with replacement; the first batch of an epoch waits for that epoch's build
(seconds at 1e7 weights, minutes at 1e9); every other process of the node opens the plan in
milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data.distributed import DistributedSampler

from .._core.errors import check_bool, check_int
from .._core.seeds import derive_words
from .._core.state import Fingerprint
from .._core.world import World
from ..index import read_checked
from ..index.tables import Allocate, shared_arrays
from ..index.weights import WeightsInput, distinct_draws
from .base import PlanSampler
from .keywords import CachedKeywords
from .passes import UnitSource

if TYPE_CHECKING:
    from typing_extensions import Unpack
from .inverses import weighted_positions_of

WITH_REPLACEMENT = "weighted-draws"

DISTINCT_PLAN = "weighted-distinct-v1"
"""Cache kind of one epoch's plan without replacement (``num_samples`` distinct int64 indices)."""


class WeightedSampler(PlanSampler[int], DistributedSampler[int]):
    """Distributed weighted sampling: ``torch.utils.data.WeightedRandomSampler`` for many ranks and many weights.

    Each epoch's global plan is ``num_samples`` indices drawn with probability proportional to
    ``weights``; the draw at plan position ``p`` is a pure function of ``(seed, epoch, p)``, the
    same on every rank, so rank ``r`` of ``W`` draws only its own positions ``r, r + W, ...``
    (no rank draws all ``num_samples``), and resume is O(1). Works for any number of weights
    (``torch.multinomial`` stops at ``2**24``): building the table is O(n) with 12 bytes per
    weight, each draw O(1) expected. The method is described in ``shardwise.samplers.weighted``.

    Being a ``DistributedSampler`` subclass, frameworks keep it in place and call its
    ``set_epoch``. Unlike ``DistributedSampler.num_samples`` (per rank), ``num_samples`` here is
    the number of draws per epoch over all ranks, as in ``WeightedRandomSampler``; ``len()`` is
    the per-rank count.

    Cost at 1e9 weights: a 12 GB table (cumulative weights + guide) shared by every process of
    the node through the index cache, built once; per rank O(1) private memory. Without
    replacement, each epoch's plan too is a file of the node's cache (8 bytes per
    ``num_samples``, two epochs kept), built by one process (which transiently holds a bit per
    weight and, past half the weight, a rebuilt table) and mapped by every rank: still O(1) per
    rank (see the module docstring).

    Args:
        weights: 1-D non-negative finite weights (any real dtype, list, array or CPU tensor), not
            all zero. Only ratios matter; they are quantised to integers (relative precision
            ``2**-(62 - bits(len(weights)))`` of the largest weight; a positive weight never
            becomes 0).
        num_samples: draws per epoch, all ranks together.
        replacement: draw with replacement (default). ``False`` draws ``num_samples`` distinct
            indices by successive sampling (as ``torch.multinomial(replacement=False)``); each
            epoch's plan is then built once per node into the index cache, by one process in
            O(len(weights)) time with a transient O(len(weights)) private memory, and mapped by
            every rank and worker (O(1) private memory each).
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: cut the last partial step (at most ``W - 1`` draws) instead of padding it by
            repeating draws from the start of the plan.
        cache_dir: where the weight table (and, with ``replacement=False``, each epoch's plan)
            is shared (see ``shardwise.index.build_or_open``): ``None`` for the default per-user
            cache (``SHARDWISE_CACHE_DIR`` overrides it), a path, or ``False`` to build them in
            this process's memory (with a warning; every rank then builds each epoch's plan).
            Below 65,536 weights they are always built in memory.
        cache_timeout: seconds to wait for another process of the node building the same index
            (default 600); then ``IndexCacheTimeout``, never a hang.

    Raises:
        ValueError: NaN, infinite, negative or all-zero weights, non-1-D or empty weights,
            negative ``num_samples``, or ``replacement=False`` with ``num_samples`` above the
            number of positive weights.
        TypeError: non-numeric weights, a non-integer (or bool) ``num_samples``.

    Example:
        >>> sampler = WeightedSampler([0.0, 1.0, 3.0], num_samples=8, num_replicas=2, rank=0)
        >>> len(sampler)
        4
        >>> set(sampler) <= {1, 2}
        True
    """

    _FIRST_CHUNK = 1 << 10  # each draw reads a random page of the table: 65,536 of them cost ~80 ms at 1e9 weights

    def __init__(
        self,
        weights: Any,
        *,
        num_samples: int,
        replacement: bool = True,
        **options: Unpack[CachedKeywords],
    ) -> None:
        keywords = self._read_keywords(options)
        # resolved and checked once; its table is built (or opened) below, after the other checks
        weights = WeightsInput.of(weights, cache_dir=keywords.cache_dir, timeout=keywords.cache_timeout)
        self.num_samples = check_int("num_samples", num_samples, minimum=0)
        self.replacement = check_bool("replacement", replacement)
        self.drop_last = keywords.drop_last
        self._cache_dir, self._cache_timeout = keywords.cache_dir, keywords.cache_timeout
        self.shuffle = True  # DistributedSampler's attribute: frameworks read it to tell training loaders
        # The table (cumulative weights + guide) is built once per weights and node, then mapped.
        self._table = weights.table()
        self._digest = weights.digest
        if not self.replacement and self.num_samples > weights.positive:
            raise ValueError(
                f"num_samples should be at most the {weights.positive} positive weights with replacement=False, but "
                f"got num_samples={self.num_samples}; pass replacement=True to draw more"
            )
        self._cached: tuple[int, int, np.ndarray] | None = None
        self._init_plan(keywords)

    @property
    def num_weights(self) -> int:
        """How many weights (indices ``0 .. num_weights - 1`` can be drawn)."""
        return len(self._table)

    def _plan_size(self, epoch: int) -> int:
        return self.num_samples

    def _distinct(self, seed: int, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[:2] != (seed, epoch):
            self._cached = (seed, epoch, self._open_distinct(seed, epoch))
        return self._cached[2]

    def _open_distinct(self, seed: int, epoch: int) -> np.ndarray:
        """The epoch's plan without replacement: built once per node into the index cache, then mapped.

        The process that builds epoch ``e`` removes this sampler's plans of other epochs but
        ``e - 1`` (a rank or worker one epoch behind may still open it; one that already mapped a
        removed plan keeps reading it).
        """
        table, count = self._table, self.num_samples
        if count == 0:
            return np.empty(0, dtype=np.int64)

        def build(allocate: Allocate) -> None:
            distinct_draws(table, count, seed, epoch, allocate("plan", count, np.int64))

        sampler = f"weights={self._digest} num_samples={count} seed={seed}"
        kept = {str(epoch), str(epoch - 1)}

        def replaces(key: str) -> bool:
            head, _, other = key.rpartition(" epoch=")
            return head == sampler and other not in kept

        plan = shared_arrays(
            DISTINCT_PLAN,
            f"{sampler} epoch={epoch}",
            build,
            size=len(table),
            cache_dir=self._cache_dir,
            timeout=self._cache_timeout,
            replaces=replaces,
        )
        return plan["plan"]

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        if not self.replacement:
            plan = self._distinct(seed, epoch)
            return lambda positions: read_checked(plan, plan[positions]).tolist()
        keys = derive_words(seed, epoch, WITH_REPLACEMENT, count=2)
        table = self._table
        return lambda positions: table.draw(positions, keys).tolist()

    def _id_count(self) -> int:
        return self.num_weights

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every position drawing ``index`` (0, 1 or several): the epoch searched, O(n) (``inverses``)."""
        keys = derive_words(self.seed, epoch, WITH_REPLACEMENT, count=2) if self.replacement else None
        seed = self.seed
        return weighted_positions_of(self._table, keys, self.num_samples, lambda: self._distinct(seed, epoch), index)

    def _fingerprint(self) -> Fingerprint:
        return {
            "num_weights": len(self._table),
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            "weights_digest": self._digest,
        }

    def _config(self) -> dict[str, Any]:
        return {"num_samples": self.num_samples, "replacement": self.replacement, "drop_last": self.drop_last}

    def _data_repr(self) -> str:
        return f"weights={len(self._table)}"

    def __getstate__(self) -> dict[str, Any]:
        # The table pickles by reference (WeightTable.__reduce__). The plan is not sent at all: the
        # receiving process opens it from the cache by its key, O(1), which also holds when a later
        # epoch's builder has removed the file meanwhile (it is then rebuilt), where a reference
        # to the file would not.
        state = super().__getstate__()
        state["_cached"] = None
        return state
