"""``MixtureSampler``: a mixture of datasets with exact proportions, weight schedules and O(1) elastic resume.

The arithmetic (blocks, exact counts, keyed orders, stop rules) lives in
:mod:`shardwise._core.mixture`; this module is the torch shell.

With adaptive weights the plan is known only as far as the ledger: what the sampler's hooks then
answer is in :mod:`shardwise.samplers.mixture_reveal` (NOTE [ Skipped ids the plan reveals late ] there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data.distributed import DistributedSampler

from .._core.adaptive_policies import AdaptiveWeights, adaptive_block, as_initial
from .._core.arrays import as_size_array
from .._core.errors import check_bool, check_choice, check_int
from .._core.mixture import MixturePlan, MixtureStop
from .._core.offsets import runs_of
from .._core.plan import Even
from .._core.provenance import mixture_positions_of
from .._core.state import Fingerprint
from .._core.weights import BY_TOKENS, WeightSchedule, as_weight_schedule
from .._core.world import World
from .adaptive import AdaptiveMixture, bound_adaptive, weights_in_force
from .base import PlanSampler
from .feedback import ADAPTIVE, Feedback
from .identity import with_sources
from .keywords import MixtureKeywords
from .mixture_reveal import check_epoch_known, follow_ledger, ids_extent, known_prefix, positions_of_ids, size_pending
from .passes import UnitSource

if TYPE_CHECKING:
    from typing_extensions import Unpack


def source_sizes(sizes: object) -> np.ndarray:
    """Sizes from a ``ConcatDataset`` (or ``shardwise.Mixture``), or a sequence of ints."""
    cumulative = getattr(sizes, "cumulative_sizes", None)
    if cumulative is not None:
        return as_size_array("sizes", np.diff(np.asarray([0, *cumulative], dtype=np.int64)), what="dataset")
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__len__"):
        raise TypeError(
            f"sizes should be a sequence of source sizes or a ConcatDataset, but got sizes={sizes!r} "
            f"({type(sizes).__name__})"
        )
    return as_size_array("sizes", sizes)


class MixtureSampler(PlanSampler[int], DistributedSampler[int]):
    """Draw from several datasets at once with exact proportions, over a ``ConcatDataset`` of them.

    Index ``offset_i + k`` is sample ``k`` of source ``i`` (``ConcatDataset`` order), so
    ``DataLoader(shardwise.Mixture(datasets), sampler=MixtureSampler(...))`` is the whole setup.

    - **Exact proportions.** The plan is cut into blocks of ``block`` positions; after ``b`` whole
      blocks of constant weights, source ``i`` has been drawn ``w_i * b * block`` times to within
      one sample (rounded up or down), so any window of whole blocks is within 2 samples of its
      target at any length, never drifting. The order within each block is shuffled; a window
      that cuts blocks deviates by at most a block's share more (see ``shardwise._core.mixture_blocks``).
    - **Exact batches.** With ``block`` equal to the global batch size (``world_size x`` the
      per-rank batch), and ``ScheduledBatchSampler(sampler, batch_size=per_rank)`` to cut batches,
      every global step holds exactly ``w_i x block`` samples of source ``i`` when these are
      integers (e.g. weights ``[0.5, 0.25, 0.25]`` and block 64), and within 2 of it otherwise.
    - **Each source cycles on its own.** Draw ``k`` of source ``i`` is element ``k mod n_i`` of a
      keyed permutation of the source for cycle ``k // n_i``: a small source is reshuffled each
      time it is used up; a large one is not repeated before it is used up. Each epoch starts every
      source afresh (a new permutation, as ``DistributedSampler`` reshuffles each epoch).
    - **MixtureStop rules.** ``stop="num_samples"`` (the default when ``num_samples`` is given): the epoch
      is ``num_samples`` draws. ``"first_exhausted"``: until the first source has been drawn as many
      times as it has samples; ``"all_exhausted"`` (default otherwise): until every source with a
      positive weight has; ``"primary"``: until source ``primary`` has. These three end at the end
      of the block where that happens, so the exhausted source's every sample is in the epoch.
    - **Weights that change.** ``weights`` may be a :class:`WeightSchedule` by samples consumed
      (over the run, all ranks together) or by epoch; a change takes effect at the first block
      boundary at or after its threshold. :func:`temperature_weights` gives ``w_i ~ n_i ** alpha``.
    - **Adaptive weights.** ``weights=AdaptiveWeights(policy, interval=...)`` moves the weights
      during the run from what the loop reports (``sampler.adaptive``: ``record`` each step,
      ``update`` when ``update_due``): one all_reduce an update, every update appended to a ledger
      in the state, so the plan stays one function of the ledger: identical on every rank, resumable at any
      world size, answered by ``which``/``when`` (docs/mixture.md, "Adaptive weights").
    - **Resume.** The position maps to every source's draw count by arithmetic, without replay:
      ``load_state_dict`` is O(1) at any world size. ``describe()`` and ``state_dict()["mixture"]``
      (informational; not needed to resume) give per-source draws and completed cycles.

    Cost: per rank O(sources x weight changes) integers and no table, whatever the number of
    samples. At 1e9 planned samples over 5 sources a rank holds a few hundred bytes of plan plus
    the temporaries of its 64Ki-position chunk: 7.3 MB of RssAnon measured (7.0 MB at 1e7), where
    a greedy blending index takes ~8.4 GB; resuming at 50% of that plan at another world size
    takes about 1.3 ms to the next batch (BENCHMARKS.md). An ``"*_exhausted"``/``"primary"``
    epoch's length is found by bisection, O(sources x changes x log n); the describe/state
    counts cost O(block) for a cut block. Adaptive weights are weight changes too: per update
    O(sources) plan work (about 0.1 ms, flat in the number of updates) and one collective, and
    about 170 bytes a rank (the ledger's row, the plan's weight change and layout row, numpy rows
    grown geometrically: 40 MB of RssAnon measured after 2.4e5 updates, 1e9 samples with an update
    every 4096), whatever n; the saved state holds ~15 bytes an update (3.7 MB there, 0.15 MB after
    1e4 updates; ``bench/bench_adaptive.py``).

    Args:
        sizes: the sources' sizes, or the ``ConcatDataset`` / :class:`shardwise.Mixture` itself.
        weights: one non-negative weight per source (only ratios matter), a :class:`WeightSchedule`,
            or :class:`AdaptiveWeights` (then ``stop="num_samples"``).
        num_samples: draws per epoch over all ranks (with ``stop="num_samples"``).
        stop: ``"num_samples"``, ``"first_exhausted"``, ``"all_exhausted"`` or ``"primary"``.
        primary: the source that ends the epoch with ``stop="primary"``.
        block: positions per block; default: the smallest block holding every positive weight at
            least once (``ceil(1 / smallest weight)`` for normalised weights).
        interleave: order each block by a low-discrepancy interleave (rotated at random per block)
            instead of shuffling it: every window of the plan, not only whole blocks, stays within a
            few samples of its target, while the samples drawn from each source stay shuffled.
        shuffle: shuffle within blocks and within sources, differently each epoch; ``False`` gives a
            fixed, evenly interleaved order in which each source is read block by block in order.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: cut the last partial global step (at most ``W - 1`` draws) instead of padding it
            by repeating draws from the plan's start.
        even: deprecated alias of ``drop_last`` (``"drop"`` is ``drop_last=True``, ``"pad"`` is
            ``drop_last=False``); warns, and passing both is an error.

    Raises:
        ValueError: negative, NaN, infinite or all-zero weights; as many weights as sources not
            matched; an empty source; a schedule out of order; a block too small for the weights;
            a stop rule that contradicts ``num_samples``/``primary``; both ``drop_last`` and ``even``.
        TypeError: a bool or float where an int is meant, non-numeric weights.

    Example:
        >>> sampler = MixtureSampler([1000, 50, 10], [0.5, 0.3, 0.2], num_samples=100, num_replicas=1, rank=0)
        >>> indices = list(sampler)
        >>> [sum(lo <= i < hi for i in indices) for lo, hi in [(0, 1000), (1000, 1050), (1050, 1060)]]
        [50, 30, 20]
    """

    _CHUNK = 1 << 16
    _FIRST_CHUNK = 1 << 8  # a resumed batch of 256 costs one small chunk: resume in ~1-2 ms

    _plan: MixturePlan

    def __init__(
        self,
        sizes: Any,
        weights: Any,
        *,
        num_samples: int | None = None,
        stop: str | MixtureStop | None = None,
        primary: int | None = None,
        block: int | None = None,
        interleave: bool = False,
        **options: Unpack[MixtureKeywords],
    ) -> None:
        keywords = self._read_keywords(options)
        self.sizes = source_sizes(sizes)
        names = getattr(sizes, "names", None)  # a shardwise.Mixture names its sources
        self.source_names: list[str] = [str(n) for n in names] if names else [str(i) for i in range(len(self.sizes))]
        # NOTE [ What the data fingerprint checks ] (samplers/identity.py): names given by a Mixture, sources' own.
        self._identity = with_sources({"names": self.source_names} if names else {}, getattr(sizes, "datasets", ()))
        config = weights if isinstance(weights, AdaptiveWeights) else None
        self._adaptive_config = config
        initial = None if config is None else as_initial(config.initial, len(self.sizes))
        self.weights: WeightSchedule = as_weight_schedule(weights if initial is None else initial)
        if self.weights.kind == BY_TOKENS:
            raise ValueError(
                "weights=WeightSchedule.by_tokens(...) counts tokens, but MixtureSampler's weights are shares of "
                "samples; use WeightSchedule.by_samples, or shardwise.PackedMixtureSampler for weights in tokens"
            )
        self.shuffle = keywords.shuffle
        self.interleave = check_bool("interleave", interleave) or not self.shuffle
        if num_samples is not None:
            num_samples = check_int("num_samples", num_samples, minimum=0)
        if stop is None:
            stop = MixtureStop.NUM_SAMPLES if num_samples is not None else MixtureStop.ALL_EXHAUSTED
        self.stop = check_choice("stop", stop, MixtureStop)
        if self.stop is MixtureStop.NUM_SAMPLES and num_samples is None:
            raise ValueError("num_samples should be given with stop='num_samples': how many draws make an epoch")
        if self.stop is not MixtureStop.NUM_SAMPLES and num_samples is not None:
            raise ValueError(
                f"num_samples={num_samples} contradicts stop={self.stop.value!r}, which sets the epoch's length; "
                "pass one of them"
            )
        if primary is not None:
            primary = check_int("primary", primary, minimum=0, maximum=len(self.sizes) - 1)
            if self.stop is not MixtureStop.PRIMARY:
                raise ValueError(f"primary={primary} has no effect with stop={self.stop.value!r}; pass stop='primary'")
        self.num_samples: int | None = num_samples  # type: ignore[assignment]  # DistributedSampler's is an int; draws per epoch over all ranks (None: set by the stop rule)
        self.primary = primary
        self.drop_last = keywords.drop_last
        self._feedback: Feedback | None = None
        if config is not None and initial is not None:
            if self.stop is not MixtureStop.NUM_SAMPLES:
                raise ValueError(
                    f"weights=AdaptiveWeights(...) needs stop='num_samples' (and num_samples=...), but got "
                    f"stop={self.stop.value!r}: where an exhaustion stop ends an epoch depends on weights not yet known"
                )
            block = adaptive_block(config.policy, self.num_sources, block, initial)
            self._feedback = Feedback(config, initial, block, int(self.num_samples or 0))
        self._plan = MixturePlan(self.sizes, self.weights, stop=self.stop, num_samples=self.num_samples,
                                 primary=self.primary, block=block, shuffle=self.shuffle,
                                 interleave=self.interleave)  # fmt: skip
        if self._feedback is not None:
            self._plan.reveal_until(self._feedback.ledger.known_until)
        self._init_plan(keywords)

    @property
    def adaptive(self) -> AdaptiveMixture | None:
        """The adaptive weights (``record``, ``update``, the ledger), or ``None`` for fixed weights or a schedule.

        Built on each access, bound to this sampler (NOTE [ Adaptive weights read their sampler
        through a link ] in ``samplers.adaptive``); ``adaptive.config`` is the ``AdaptiveWeights`` given.
        """
        return bound_adaptive(AdaptiveMixture, self._feedback, self, trained=self._trained,
                              fingerprint=self._full_fingerprint, updated=self._follow_ledger)  # fmt: skip

    def _trained(self) -> tuple[int, int]:
        """``(epoch, consumed)`` the loop has trained through: the adaptive weights' clock."""
        self._sync()
        return self._progress.epoch, self._progress.consumed

    def _core_plan(self) -> MixturePlan:
        """``sampler.plan.core``: the global plan (numpy only): blocks, weights in force, every position's source."""
        return self._plan

    def weights_at(self, epoch: int, position: int) -> list[float]:
        """The weights in force at plan ``position`` of ``epoch`` (exact shares summing to 1).

        Raises:
            PendingWeightsError: adaptive weights no update has set yet (the position lies at or past
                ``adaptive.ledger.known_until``), as ``which`` and the sampler's own pass raise.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        return weights_in_force(self._plan, epoch, position, self._plan_size(epoch))

    @property
    def block(self) -> int:
        """Positions per block: the window over which proportions are exact."""
        return self._plan.block

    @property
    def num_sources(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> list[int]:
        """Where each source starts in the concatenated index space."""
        return [int(x) for x in self._plan.offsets]

    def source_counts(self, epoch: int, consumed: int) -> list[int]:
        """Draws of each source in ``epoch``'s plan before position ``consumed``, by arithmetic."""
        total = self._plan.plan_size(check_int("epoch", epoch, minimum=0))
        return self._plan.counts(self.seed, epoch, min(check_int("consumed", consumed, minimum=0), total))

    def sources_at(self, epoch: int, positions: Any) -> np.ndarray:
        """The source of each plan position of ``epoch`` (int64), by arithmetic: O(len) and no table."""
        epoch = check_int("epoch", epoch, minimum=0)
        array = np.asarray(positions, dtype=np.int64).reshape(-1)
        found: np.ndarray = self._plan.locate(self.seed, epoch, array).sources
        return found

    def sources_of(self, indices: Any) -> np.ndarray:
        """The source of each global index (int64; indices in ``[0, sum(sizes))``).

        Raises:
            TypeError: ``indices`` are not integers.
            IndexError: an index is negative or ``>= sum(sizes)``.
        """
        return runs_of(self.sizes, indices, noun="samples")

    def _known_positions(self) -> Callable[[np.ndarray], np.ndarray] | None:
        if self._feedback is None:
            return None
        # The pass waits for the ledger's weights instead of drawing with stale ones
        # (PendingWeightsError when not even the first position is known yet).
        plan, epoch = self._plan, self._progress.epoch  # the live pass's
        self._follow_ledger()
        world = self.world
        to_step_end = world.world_size - 1 - world.rank  # this rank's unit to the last of its global step

        def known(positions: np.ndarray) -> np.ndarray:
            pending = bool(to_step_end) and self._even is Even.DROP and self._size_pending(epoch)
            return known_prefix(plan, epoch, positions, self._uncompacted, to_step_end, pending)

        return known

    def _size_pending(self, epoch: int) -> bool:
        """Whether updates can still shrink ``epoch``'s size: it skips ids, and its weights are not all known."""
        return size_pending(self._plan, epoch, bool(self._skip_ids.applying(epoch).size))

    def _follow_ledger(self) -> None:
        """Give the live pass the length the ledger now gives its epoch (NOTE [ Skipped ids the plan reveals late ])."""
        live = self._pass
        if live is not None and self._feedback is not None and self._skip_ids:
            epoch = self._progress.epoch
            follow_ledger(live, self._plan_size(epoch), self._even, self._size_pending(epoch))

    # -- PlanSampler hooks ---------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        return self._plan.plan_size(epoch)

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        return lambda positions: self._plan.indices(seed, epoch, positions).tolist()  # the plan grows with updates

    def _id_count(self) -> int:
        """Ids of the concatenated sources (``offsets``), as ``when`` and ``skip_ids`` take them."""
        return int(self.sizes.sum())

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every position of ``epoch``'s plan drawing global ``index``: O(log n) a draw (provenance)."""
        index = check_int("index", index, minimum=0, maximum=int(self.sizes.sum()) - 1)
        check_epoch_known(self._plan, epoch, self._plan_size(epoch), index)  # an adaptive ledger: all, or no answer
        return mixture_positions_of(self._plan, self.seed, epoch, index)

    def _ids_extent(self, epoch: int) -> tuple[object, int] | None:
        """With adaptive weights: the plan and how far into ``epoch`` its weights are known (``skip_ids``)."""
        return ids_extent(self._plan, epoch)

    def _ids_between(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The global index at each (known) plan position of ``epoch``: what an update reveals, read forward."""
        found: np.ndarray = self._plan.indices(self.seed, epoch, positions)
        return found

    def _positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """Every known position drawing one of ``ids`` (``skip_ids``): O(log n) a draw, one per cycle of its source."""
        return positions_of_ids(self._plan, self.seed, epoch, ids, int(self.sizes.sum()))

    def _fingerprint(self) -> Fingerprint:
        return {
            "sizes": self.sizes.tolist(),
            "weights": (self._adaptive_config or self.weights).fingerprint(),
            "stop": self.stop.value,
            "num_samples": self.num_samples,
            "primary": self.primary,
            "block": self.block,
            "shuffle": self.shuffle,
            "interleave": self.interleave,
            **self._identity,
        }

    def _config(self) -> dict[str, Any]:
        schedule = self.weights  # plain values, so that describe() can be logged as JSON
        weights = schedule.weights[0].tolist() if schedule.kind == "constant" else repr(schedule)
        if self._adaptive_config is not None:
            weights = repr(self._adaptive_config)
        return {"weights": weights, "stop": self.stop.value, "num_samples": self.num_samples,
                "block": self.block, "shuffle": self.shuffle, "interleave": self.interleave}  # fmt: skip

    def _data_repr(self) -> str:
        return f"sizes={self.sizes.tolist()}"

    # -- per-source progress -------------------------------------------------------------------
    def _sources_at(self, epoch: int, consumed: int) -> dict[str, Any]:
        consumed = min(consumed, self._plan_size(epoch))
        counts = self.source_counts(epoch, consumed)
        return {
            "epoch": epoch,
            "weights": [round(w, 12) for w in self._plan.weights_at(epoch, consumed)],
            "consumed": counts,
            "cycles": [count // int(size) for count, size in zip(counts, self.sizes.tolist(), strict=True)],
        }

    def describe(self) -> dict[str, Any]:
        """The shell's description plus, per source, the weight in effect, draws and completed cycles."""
        description = super().describe()
        progress = self._progress  # synced by describe()
        sources = self._sources_at(progress.upcoming_epoch(), 0 if progress.completed else progress.consumed)
        description["plan_size"] = self._plan_size(sources["epoch"])
        description["sources"] = [
            {"size": int(size), "weight": weight, "consumed": count, "cycles": cycles}
            for size, weight, count, cycles in zip(
                self.sizes.tolist(), sources["weights"], sources["consumed"], sources["cycles"], strict=True
            )
        ]
        return description

    _EXACT_STATE_COUNTS = 4096
    """Up to this many positions into a block, ``state_dict`` counts them exactly (~0.5 ms at most)."""

    def state_dict(self) -> dict[str, Any]:
        """The shell's O(1) state plus ``"mixture"``: per-source draws and cycles (informational).

        ``state["mixture"] = {"position", "consumed", "cycles"}`` gives the draws of each source in
        the epoch's plan before ``position``: the state's own position, or, when that lies more than
        4096 positions into a large block, the block's start (exact counts there would cost
        O(block) on every call, and loaders such as torchdata's snapshot the state every step).
        Loading ignores it: the position alone determines every count.
        """
        state = super().state_dict()  # syncs the position
        epoch = self._progress.epoch
        position = min(self._progress.consumed, self._plan_size(epoch))
        if position % self.block > self._EXACT_STATE_COUNTS:
            position -= position % self.block
        sources = self._sources_at(epoch, position)
        state["mixture"] = {"position": position, "consumed": sources["consumed"], "cycles": sources["cycles"]}
        if self._feedback is not None:
            state[ADAPTIVE] = self._feedback.ledger.to_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The shell's resume; an adaptive mixture also takes the saved ledger (``state["adaptive"]``).

        The updates after the saved position are recomputed from what the loop reports after the
        resume (NOTE [ Resuming an adaptive mixture ] in docs/mixture.md); what this rank had
        recorded towards the next update is dropped.
        """
        feedback = self._feedback
        if feedback is None:
            super().load_state_dict(state_dict)
            return
        ledger = feedback.saved_ledger(state_dict, type(self).__name__)
        super().load_state_dict(state_dict)  # checks the fingerprint (policy, interval)
        self._plan = feedback.plan_of(ledger, self._plan.renewed)
