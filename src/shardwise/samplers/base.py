"""``PlanSampler``: the one shell every shardwise sampler is, around the plan its subclass describes.

A sampler subclass says three things (its hooks, below): how many units its global plan has in an
epoch (``_plan_size``), how to turn plan positions into units (``_open_pass``), and what identifies
its configuration (``_fingerprint``); a sampler that inverts its plan also says where a sample is
(``_plan_positions_of``, ``_positions_of_ids``). This class holds everything else, in one place:
the arguments as given, the world and the seed (resolved lazily), the position (a ``Progress``
record and the live pass), and the skip ledgers. It deals the plan out by position, keeps every
rank's length equal and advances the epoch. What it computes is plain functions over those values:
``samplers.state`` (the state and back), ``samplers.skipping`` (the ledgers, honoured around the
hooks), ``_core.provenance`` (which positions a step covers), ``samplers.passes`` (a rank's live
pass). ``sampler.plan`` (``samplers.plan_view``) is what other modules read of the plan.

Position tracking costs nothing per unit: the units of a pass are handed out through
``itertools.chain`` over one list iterator per chunk, and the position is read back from the
current list iterator's ``__length_hint__`` only when someone asks (``state_dict``, ``set_epoch``,
the next ``__iter__``). A Python generator would cost a frame switch per index.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from .._core.errors import check_int
from .._core.plan import Even, consumed_after, rank_count
from .._core.provenance import (
    ProvenanceUnsupported,
    dealt_position_steps,
    dealt_step_positions,
    dealt_step_span,
    scan_units,
)
from .._core.seeds import check_seed, log_resolved_seed, resolve_seed
from .._core.skips import IdSkips, SkipLedger
from .._core.state import Fingerprint, Progress
from .._core.world import World, check_world_args
from . import callers, skipping, state
from .delivery import find_driver
from .frameworks import PlanMeta, lightning_pending_epoch, refuse_resharding
from .keywords import Keywords, read_keywords
from .passes import LivePass, UnitSource
from .plan_view import PlanView
from .world import current_world

T = TypeVar("T")


class PlanSampler(Generic[T], metaclass=PlanMeta):
    """The behaviour docs/design.md requires of every sampler; see the module docstring.

    Subclasses call :meth:`_init_plan` from ``__init__`` and implement ``_plan_size``, ``_open_pass``
    and ``_fingerprint`` (the other hooks have defaults).
    """

    _CHUNK: ClassVar[int] = 1 << 16
    """Units generated per chunk: bounds memory per rank, amortises numpy call overhead."""

    _FIRST_CHUNK: ClassVar[int] = 0
    """Units in a pass's first chunk (0: ``_CHUNK``); later chunks double up to ``_CHUNK``: a cheap first batch."""

    _SCAN_CHUNK: ClassVar[int] = 1 << 16
    """Plan positions read at a time by :meth:`_scan_positions_of` (O(chunk) memory)."""

    _KEYWORD_DEFAULTS: ClassVar[dict[str, Any]] = {}
    """Defaults of the shared keywords that differ from ``keywords.DEFAULTS`` (each with its reason)."""
    _keyword_kind: ClassVar[type | None]  # set by PlanMeta from ``__init__``'s ``**options: Unpack[...]``

    _seed_arg: int | None
    _resolved_seed: int | None
    _seed_source: str
    _num_replicas_arg: int | None
    _rank_arg: int | None
    _even: Even
    _progress: Progress
    _pass: LivePass | None
    _skips: SkipLedger
    _skip_ids: IdSkips

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The skip ledger (NOTE in shardwise._core.skips) is honoured around the two plan hooks, once
        # for every sampler: a subclass's own hooks see plain plan positions.
        super().__init_subclass__(**kwargs)
        if "_plan_size" in cls.__dict__:
            cls._plan_size = skipping.compacted_size(cls.__dict__["_plan_size"])  # type: ignore[method-assign,assignment]
        if "_open_pass" in cls.__dict__:
            cls._open_pass = skipping.compacted_source(cls.__dict__["_open_pass"])  # type: ignore[method-assign]

    # -- hooks: the plan a subclass describes ----------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        """Units in the global plan of ``epoch``."""
        raise NotImplementedError

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        """The unit source for one pass over ``epoch`` starting at plan position ``start``."""
        raise NotImplementedError

    def _fingerprint(self) -> Fingerprint:
        """Plain values identifying the plan; the kind is added here."""
        raise NotImplementedError

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Plan positions of ``epoch`` whose unit holds sample ``index`` (O(1) where a sampler inverts its plan)."""
        raise ProvenanceUnsupported(
            f"{type(self).__name__} cannot yet say where a sample is trained (its plan is not inverted); "
            "use shardwise.which(sampler, epoch=..., step=...) for the forward question, which every sampler answers"
        )

    def _positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """Every plan position of ``epoch`` holding one of ``ids`` (flat int64), for :meth:`skip_ids`."""
        raise ProvenanceUnsupported(
            f"{type(self).__name__} cannot skip sample ids: skip_ids needs a plan whose unit is one sample and "
            "that inverts in O(log n) (ShardedSampler, MixtureSampler, LocalitySampler, ScheduledBatchSampler "
            "over them or a length); skip plan positions instead (shardwise.skip_steps, sampler.skip_positions)"
        )

    def _id_count(self) -> int | None:
        """How many sample ids the plan draws from (``sampler.plan.id_count``); ``None``: unknown."""
        return None

    def _wrap_period(self) -> int | None:
        """The period padding wraps within (NOTE [ Padding wrap ] in ``_core.plan``); ``None``: ``p % total``."""
        return None

    def _known_positions(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """For one pass: the leading positions of a chunk whose units can be computed yet (``None``: all).

        A sampler whose plan is written at run time (adaptive mixture weights) cuts each chunk there, and
        raises when not even the first position is known.
        """
        return None

    def _ids_extent(self, epoch: int) -> tuple[object, int] | None:
        """How much of ``epoch``'s plan :meth:`_positions_of_ids` sees: ``None``, all of it at any time.

        A plan written at run time (an adaptive mixture) answers ``(plan, stop)``: its positions below
        ``stop`` are final and the others unseen; those revealed as ``stop`` grows are read forward with
        :meth:`_ids_between` (NOTE [ Skipped ids the plan reveals late ] in ``samplers.mixture_reveal``).
        """
        return None

    def _ids_between(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The sample id at each plan position (not compacted) of ``epoch``, where ``_ids_extent`` is given."""
        raise NotImplementedError(f"{type(self).__name__} gives an _ids_extent, so it reads its ids forward")

    def _core_plan(self) -> object:
        """The sampler's pure plan object where it has one (``sampler.plan.core``); ``None`` by default."""
        return None

    def _on_epoch(self, epoch: int) -> None:
        """Called whenever the epoch is set or advances (wrappers forward it to what they wrap)."""

    def _check_iterable(self) -> None:
        """Raise at ``iter()``, not at the first unit, for a configuration that cannot be iterated now."""

    def _config(self) -> dict[str, Any]:
        """Configuration shown by ``__repr__`` and ``describe`` (after the data argument)."""
        return {}

    def _data_repr(self) -> str:
        return ""

    # -- construction ------------------------------------------------------------------------
    def _read_keywords(self, options: Mapping[str, Any]) -> Keywords:
        """The shared keywords of this construction (``**options``), checked once, here (see ``.keywords``)."""
        kind = type(self)._keyword_kind
        if kind is None:
            raise TypeError(f"{type(self).__name__}.__init__ should take **options: Unpack[...] (see .keywords)")
        return read_keywords(type(self).__name__, kind, options, self._KEYWORD_DEFAULTS)

    def _init_plan(self, keywords: Keywords) -> None:
        self._seed_arg = keywords.seed
        self._resolved_seed = self._seed_arg
        self._seed_source = keywords.seed_source  # "default" when no seed was passed (0, as torch's)
        self._num_replicas_arg, self._rank_arg = keywords.num_replicas, keywords.rank
        self._even = keywords.even
        self._progress = Progress()
        self._pass = None
        self._skips = SkipLedger()
        self._skip_ids = IdSkips()

    # -- world and seed, resolved lazily ---------------------------------------------------------
    @property
    def world(self) -> World:
        """Rank and world size as resolved now (explicit arguments, torch.distributed, launcher)."""
        return current_world(self._num_replicas_arg, self._rank_arg)

    @property
    def num_replicas(self) -> int:
        """World size, resolved lazily (a sampler is often built before the process group)."""
        return self.world.world_size

    @num_replicas.setter
    def num_replicas(self, value: int) -> None:
        # Assigning DistributedSampler.num_replicas pins the world size, like the constructor argument.
        self._num_replicas_arg, self._rank_arg = check_world_args(value, self._rank_arg)

    @property
    def rank(self) -> int:
        """Global rank, resolved lazily; never the local rank."""
        return self.world.rank

    @rank.setter
    def rank(self, value: int) -> None:
        self._num_replicas_arg, self._rank_arg = check_world_args(self._num_replicas_arg, value)

    @property
    def seed(self) -> int:
        """The seed in use; ``seed=None`` is resolved once, alike on every rank (see ``resolve_seed``)."""
        if self._resolved_seed is None:
            self._resolved_seed, self._seed_source = resolve_seed(None, world_size=self.world.world_size)
            log_resolved_seed(type(self).__name__, self._resolved_seed, self._seed_source)
        return self._resolved_seed

    @seed.setter
    def seed(self, value: int | None) -> None:
        self._sync()
        if self._pass is not None or self._progress.consumed:
            raise RuntimeError("seed cannot change in the middle of an epoch; set it before iterating")
        self._seed_arg = self._resolved_seed = check_seed(value)
        self._seed_source = "argument"

    def _adopt_seed(self, seed: int) -> None:  # a validated state's seed (this sampler was built with seed=None)
        self._resolved_seed, self._seed_source = seed, "resumed state"

    @property
    def even(self) -> Even:
        """How ranks are given equal lengths: ``Even.PAD`` or ``Even.DROP``."""
        return self._even

    def _refuse_mid_epoch(self, name: str) -> None:
        """Raise before ``name`` changes while an epoch is under way (the pass and the state follow one plan)."""
        self._sync()
        if self._pass is not None or (self._progress.consumed and not self._progress.completed):
            raise RuntimeError(
                f"{name} cannot change in the middle of an epoch; set it before iterating or between epochs"
            )

    # -- epochs and passes -----------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the one the next ``__iter__`` will iterate."""
        self._sync()
        return self._progress.upcoming_epoch()

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        # Some code assigns DistributedSampler.epoch directly; treat it as set_epoch.
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next pass iterates; call it before each epoch, as with torch.

        Setting the epoch that is already in progress keeps the position (a framework calls
        ``set_epoch`` right after ``load_state_dict`` on resume); any other epoch starts at 0.
        Without any call the epoch advances by itself after each complete pass. Setting the
        epoch of a pass whose iterator is live keeps tracking it (Lightning calls ``set_epoch``
        after creating the epoch's iterator), so ``state_dict`` still follows that iterator.
        """
        self._sync()
        live = self._pass
        if live is not None and check_int("epoch", epoch, minimum=0) == self._progress.epoch:
            self._progress.requested = epoch  # decides a loaded epoch end that a loader restores later
            return
        if live is not None and live.driver is not None and live.driver.prefetched_only(live.local_done()):
            warnings.warn(
                f"{type(self).__name__}.set_epoch({epoch}) came after a DataLoader's {live.driver.workers} workers "
                f"had already drawn {live.local_done()} units of epoch {self._progress.epoch} from it (Lightning "
                "creates the first iterator of a run before it sets the epoch): the loop will receive those. Set "
                "the epoch before the loader is iterated (in LightningModule.train_dataloader(): "
                "sampler.set_epoch(self.current_epoch))",
                stacklevel=2,
            )
        self._pass = None
        self._progress.set_epoch(epoch)
        self._on_epoch(self._progress.epoch)

    def __len__(self) -> int:
        """Units this rank yields in a full pass of the upcoming epoch, equal on every rank.

        After a mid-epoch ``load_state_dict`` the resumed pass yields only the remaining units;
        ``len`` still describes the whole epoch, as frameworks counting steps expect.
        """
        self._sync()
        return self._pass_units(self._progress.upcoming_epoch(), 0, self.world.world_size)

    def __iter__(self) -> Iterator[T]:
        refuse_resharding(self)  # here, not in _begin_pass: it inspects the frames that called __iter__
        self._check_iterable()
        live = self._pass
        if live is not None and live.driver is not None:  # a loader restarting its iterator: the pass is over
            live.driver.restarting(1)  # 1: what called __iter__
        return itertools.chain.from_iterable(self._pass_chunks())

    def _pass_chunks(self) -> Iterator[Iterator[T]]:
        # The pass begins at the first unit pulled, not at __iter__: a DataLoader builds iterators
        # it never pulls (torch's multi-process iterator calls iter() twice; torchdata builds one
        # to restore a finished state and discards it), and those must not move the position.
        # The frame that pulls the first unit tells which DataLoader iterator drives the pass (``callers``).
        # A loader iterator that had delivered batches before it pulled from us was restored from a
        # state (torchdata): it continues that state, even one saved just after an epoch's last batch.
        driver = find_driver(self, 1)  # 1: what pulled this generator
        restored = driver is not None and driver.base > 0
        if driver is not None and driver.workers > 0:
            # A restored iterator continues the loaded epoch unless Lightning runs another one on it
            # (NOTE [ A step checkpoint at an epoch's last batch ] in .frameworks).
            pending = lightning_pending_epoch(1)
            current = self._progress.epoch if restored else self._progress.upcoming_epoch()
            if pending is not None and pending != current:
                self.set_epoch(pending)
        live, chunks = self._start_pass(restored=restored)
        live.driver = driver
        for chunk in chunks:
            live.check()  # load_state_dict stopped this pass (it cut the chunk being handed out)
            yield chunk
        live.check()

    def _start_pass(self, *, restored: bool) -> tuple[LivePass, Iterator[Iterator[T]]]:
        """Begin the next pass: the live pass record and its units, chunk by chunk."""
        world, seed, epoch, start, total = self._begin_pass(restored=restored)
        count = rank_count(total, start, world.world_size, self._even)
        live = LivePass(start, count, total, world.world_size, self._even)
        self._pass = live
        source = self._open_pass(epoch, seed, world, start)
        first = min(self._FIRST_CHUNK or self._CHUNK, self._CHUNK)
        return live, live.chunks(source, world.rank, first, self._CHUNK, self._wrap_period(), self._known_positions())

    def _begin_pass(self, *, restored: bool = False) -> tuple[World, int, int, int, int]:
        """Open the next pass: ``(world, seed, epoch, start, total)``, advancing a completed epoch.

        ``restored``: the loader iterator pulling this pass was restored from a state (it had
        delivered batches before the pass began), so the pass continues the loaded position,
        even at the end of an epoch, rather than starting the next epoch.
        """
        self._sync()
        self._abandon_pass()
        world = self.world
        seed = self.seed
        progress = self._progress
        advancing = progress.completed and not (restored and progress.resumed)
        epoch, start = progress.begin(keep_end=restored)
        if advancing:
            self._on_epoch(epoch)
        return world, seed, epoch, start, self._plan_size(epoch)

    def _abandon_pass(self) -> None:
        """Leave a pass that was broken off (synced, not complete) before another begins or a copy is made.

        NOTE [ A new pass starts its epoch ] (``_core.state``): the next pass starts at the epoch's
        start, unless the loop received nothing from the abandoned one (a loader's workers only
        prefetched it, or a framework built and dropped an iterator): that pass moved nothing, so
        the next one begins where it began, which keeps a loaded position waiting.
        """
        live = self._pass
        if live is None:
            return
        self._pass = None
        if live.trained() == 0:
            self._progress.loaded = True  # consumed is live.start (synced): where the dropped pass began

    def _sync(self) -> None:
        """Fold the live pass's trained position into the progress record.

        Trained, not handed out: a DataLoader's workers run ahead of the loop (see ``delivery``),
        so ``state_dict`` after a loop that stopped early resumes after what the loop received. A
        new pass still starts its epoch (NOTE [ A new pass starts its epoch ] in ``_core.state``).
        """
        live = self._pass
        if live is None:
            return
        done = live.trained()
        self._progress.consumed = live.consumed_after(done)
        if done >= live.count:
            self._progress.completed = True
            self._pass = None

    # -- state (samplers.state) ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The global, world-size-independent position: ``{version, epoch, consumed, seed, fingerprint}``.

        ``consumed`` counts what the training loop received, not what the DataLoader's workers
        prefetched: called after ``k`` trained batches, the resumed run starts at batch ``k + 1``,
        with any ``num_workers`` and ``prefetch_factor`` (see ``shardwise.samplers.delivery``).
        Every rank returns the same dict at a step boundary, so saving rank 0's is enough.

        Warns when a DataLoader with workers draws from this sampler through a batch sampler that
        wraps it, which hides how many prefetched units were trained. A state taken by torchdata's
        snapshot also says the world size its replayed steps cover (``load_state_dict``).
        """
        world_size = None
        if callers.torchdata_snapshotting(1):  # 1: who called state_dict
            # torchdata snapshots at hand-out and pairs the snapshot with the delivering step.
            epoch, consumed = state.handed_out(self._progress, self._pass)
            world_size = self._pass.world_size if self._pass is not None else self.world.world_size
        else:
            self._sync()
            state.warn_if_lossy(type(self).__name__, self._pass)
            epoch, consumed = self._progress.epoch, self._progress.consumed
        return state.save(epoch, consumed, seed=self.seed, fingerprint=self._full_fingerprint(), skips=self._skips,
                          skip_ids=self._skip_ids, snapshot_world_size=world_size)  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()`` output, in O(1), at any world size.

        The next pass (the next ``iter()`` that is pulled) continues from the loaded position.

        .. warning::
            An iterator of this sampler that is running when the state is loaded does not carry
            on from its old position: it raises ``RuntimeError`` at its next unit. Load the state
            before iterating (frameworks do), then iterate again.

        A snapshot that torchdata's ``StatefulDataLoader`` took some steps before it saved (workers,
        ``snapshot_every_n_steps`` above 1) loads only at its world size: torchdata replays the steps.

        Raises:
            StateMismatchError: the state belongs to another configuration (names the field), or is
                such a snapshot loading at another world size.
            MalformedStateError: the dict is not a shardwise state of a known version.
        """
        saved = state.snapshot_world_size(state_dict)
        if saved is not None and saved != self.world.world_size:
            state.refuse_replay(saved, self.world.world_size, callers.torchdata_replayed_steps(1))
        # seed=None resumes with the seed the saved run resolved to, adopted only once the state is valid.
        adopt = self._seed_arg is None
        loaded = state.read(state_dict, seed=None if adopt else self.seed, fingerprint=self._full_fingerprint())
        if adopt:
            self._adopt_seed(loaded.seed)
        self._skips, self._skip_ids = loaded.skips, loaded.skip_ids  # before the size below, which they shrink
        self._sync()
        if self._pass is not None:  # a running pass: its iterator must not carry on from the old position
            self._pass.stop(state.stopped_message(type(self).__name__))
        self._pass = None
        self._progress.load(loaded.epoch, loaded.consumed, self._plan_size(loaded.epoch))
        self._on_epoch(loaded.epoch)

    def __getstate__(self) -> dict[str, Any]:
        # A live pass holds iterators; pickling (ddp_spawn, workers) carries only the position.
        self._sync()
        return state.pickled(self.__dict__, self._progress, self._pass)

    def _full_fingerprint(self) -> Fingerprint:
        return {"kind": type(self).__name__, **self._fingerprint()}

    # -- skips (samplers.skipping; the ledgers: _core.skips) ---------------------------------------
    @property
    def skip_ledger(self) -> list[list[int]]:
        """The skip ledger: ``[[epoch, first, stop], ...]`` ranges of plan positions never trained."""
        return self._skips.to_state()

    def skip_positions(self, epoch: int, first: int, stop: int) -> None:
        """Never train positions ``[first, stop)`` of ``epoch``'s global plan, at any world size, across restarts.

        The positions are absolute in the epoch's plan (the plan every rank shares). They are removed
        from the plan before it is dealt, so every rank still gets the same number of units and
        everything else trains exactly once; the ledger goes into ``state_dict()`` (O(ranges)).
        :func:`shardwise.skip_steps` turns steps (as :func:`shardwise.which` numbers them) into positions.

        Raises:
            RuntimeError: a pass is being iterated (add skips before iterating, e.g. after ``load_state_dict``).
            ValueError: the range starts before what this sampler has already trained.
        """
        first = check_int("first", first, minimum=0)
        stop = check_int("stop", stop, minimum=first)
        epoch = check_int("epoch", epoch, minimum=0)
        skipping.check_stop(epoch, stop, self._raw_plan_size(epoch))
        self.skip_ranges(epoch, [[first, stop]])

    def skip_ranges(self, epoch: int, ranges: Any) -> None:
        """:meth:`skip_positions` for many ``[first, stop)`` rows at once, in O(k log k) (``(k, 2)`` ints)."""
        self._sync()
        skipping.refuse_during_pass(type(self).__name__, "skip_positions", self._pass)
        epoch = check_int("epoch", epoch, minimum=0)
        rows = skipping.checked_rows(epoch, ranges, self._raw_plan_size(epoch))
        skipping.refuse_trained(epoch, rows, self._progress.epoch, self._plan_done(self._progress.epoch))
        self._skips = self._skips.add_many(epoch, rows)

    @property
    def skipped_ids(self) -> list[list[int]]:
        """Skipped sample ids: ``[[epoch, position, first, stop], ...]``, ids ``[first, stop)`` from plan
        ``position`` of ``epoch`` and in every later epoch."""
        return self._skip_ids.to_state()

    def skip_ids(self, first: int, stop: int, *, epoch: int | None = None) -> None:
        """Never train sample ids ``[first, stop)`` again: from now on, at any world size, across restarts.

        The range goes into ``state_dict()`` (``state["skip_ids"]``, four ints). In every epoch from
        ``epoch`` (default: the epoch this sampler trains next) the plan positions that hold those ids
        are found (``when``'s inverse, O(log n) an id; O(k log k) per epoch for ``k`` ids, cached) and
        removed before dealing, like :meth:`skip_positions`: everything else trains as often as
        before and every rank keeps the same number of steps. In an epoch under way, what was
        already trained stays trained. Supported where the plan inverts cheaply and a unit is one
        sample: ``ShardedSampler``, ``MixtureSampler`` (ids in the concatenated space),
        ``LocalitySampler`` and ``ScheduledBatchSampler`` over them or over a dataset length.

        .. warning::
            With adaptive weights (``MixtureSampler(weights=AdaptiveWeights(...))``) the positions of
            an id are known only as far as the weight ledger: each update removes those it reveals,
            so an epoch that skips ids ends earlier than ``len(sampler)`` said at its start (the same
            on every rank and after any resume; warned here). NOTE [ Skipped ids the plan reveals
            late ] in ``samplers.mixture_reveal``.

        Raises:
            ProvenanceUnsupported: this sampler cannot skip ids (named, with what to use instead).
            RuntimeError: a pass is being iterated (add skips before iterating, e.g. after ``load_state_dict``).
            ValueError: an id out of range, an empty range, or an epoch already trained.
        """
        first = check_int("first", first, minimum=0)
        stop = check_int("stop", stop, minimum=first + 1)
        skipping.check_id_stop(type(self).__name__, stop, self._id_count())
        self.skip_id_ranges([[first, stop]], epoch=epoch)

    def skip_id_ranges(self, ranges: Any, *, epoch: int | None = None) -> None:
        """:meth:`skip_ids` for many ``[first, stop)`` rows at once (``(k, 2)`` ints): one translation, O(k)."""
        self._sync()
        skipping.refuse_during_pass(type(self).__name__, "skip_ids", self._pass)
        rows = skipping.checked_id_rows(ranges)
        upcoming = self._progress.upcoming_epoch()
        epoch = upcoming if epoch is None else check_int("epoch", epoch, minimum=upcoming)
        skipping.check_ids_drawn(type(self).__name__, rows, self._id_count())
        bounds = np.asarray([rows[:, 0].min(), rows[:, 1].max() - 1], dtype=np.int64)
        self._positions_of_ids(epoch, bounds)  # supported here, and the ids in range
        position = self._plan_done(epoch) if epoch == self._progress.epoch else 0
        self._skip_ids = self._skip_ids.add_many(epoch, position, rows)
        if self._ids_extent(epoch) is not None:
            skipping.warn_revealed_late(type(self).__name__)

    def _raw_plan_size(self, epoch: int) -> int:
        """``epoch``'s plan size with its skipped positions: what builds the plan (``_plan_size`` is what is dealt)."""
        size: int = type(self)._plan_size.__wrapped__(self, epoch)  # type: ignore[attr-defined]
        return size

    def _plan_done(self, epoch: int) -> int:
        """The plan position (not compacted) up to which ``epoch`` has been trained."""
        progress = self._progress
        total = self._raw_plan_size(epoch)
        if progress.completed or progress.consumed >= self._plan_size(epoch):
            return int(total)
        return int(self._uncompacted(epoch, np.asarray([progress.consumed]))[0])

    def _uncompacted(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The plan positions of compacted ``positions`` of ``epoch`` (the skipped positions and ids left in)."""
        ledger = skipping.ledger_for(self, epoch) or self._skips
        return ledger.to_plan(epoch, positions, self._raw_plan_size(epoch))

    # -- the plan, as other modules read it (samplers.plan_view) -------------------------------------
    @property
    def plan(self) -> PlanView:
        """What other modules read of this sampler's plan (``samplers.plan_view``); a query moves no position."""
        return PlanView(
            owner=type(self).__name__, size=self._plan_size, source=self._open_pass, units=self._plan_units,
            on_epoch=self._on_epoch, fingerprint=self._full_fingerprint, positions_of=self._plan_positions_of,
            positions_of_ids=self._positions_of_ids, trained_positions_of=self._trained_positions_of,
            step_positions=self._step_positions, position_steps=self._position_steps, step_span=self._step_span,
            pass_units=self._pass_units, consumed_after=self._consumed_after,
            uncompacted=self._uncompacted, adopt_seed=self._adopt_seed, core=self._core_plan,
            id_count=self._id_count, wrap_period=self._wrap_period, explicit_seed=self._seed_arg,
            deals_by_rank=self._num_replicas_arg != 1, even=self._even,
        )  # fmt: skip

    def _pass_units(self, epoch: int, start: int, world_size: int) -> int:
        """Units each rank yields in a pass over ``epoch`` from ``start``: the plan dealt unit by unit."""
        return rank_count(self._plan_size(epoch), start, world_size, self._even)

    def _consumed_after(self, epoch: int, start: int, world_size: int, units: int) -> int:
        """The global position once every rank has gone ``units`` into a pass over ``epoch`` from ``start``."""
        return consumed_after(self._plan_size(epoch), start, world_size, self._even, units)

    def _step_positions(self, epoch: int, start: int, world: World, step: int, per_step: int,
                        drop_last: bool = False) -> np.ndarray:  # fmt: skip
        """Plan positions rank ``world.rank`` trains at its step ``step`` of a pass over ``epoch`` from ``start``."""
        return dealt_step_positions(self._plan_size(epoch), start, world.world_size, world.rank, step, per_step,
                                    self._even, self._wrap_period(), drop_last=drop_last)  # fmt: skip

    def _position_steps(self, epoch: int, start: int, world_size: int, position: int, per_step: int,
                        drop_last: bool = False) -> list[tuple[int, int]]:  # fmt: skip
        """``(rank, step)`` of every time plan ``position`` is trained in a pass over ``epoch`` from ``start``."""
        return dealt_position_steps(self._plan_size(epoch), start, world_size, position, per_step, self._even,
                                    self._wrap_period(), drop_last=drop_last)  # fmt: skip

    def _step_span(self, epoch: int, start: int, world_size: int, step: int, per_step: int,
                   drop_last: bool = False) -> tuple[int, int]:  # fmt: skip
        """The compacted plan positions ``[first, stop)`` that global step ``step`` of a pass from ``start`` covers."""
        return dealt_step_span(self._plan_size(epoch), start, world_size, step, per_step, self._even,
                               drop_last=drop_last)  # fmt: skip

    def _plan_units(self, epoch: int, positions: np.ndarray, world_size: int) -> list[Any]:
        """The units at ``positions`` of ``epoch``'s global plan; a query: the position does not move.

        A wrapper forwards the epoch to what it wraps for the query, then restores the upcoming one.
        """
        upcoming = self._progress.upcoming_epoch()
        self._on_epoch(epoch)
        try:
            return self._open_pass(epoch, self.seed, World(0, world_size, "query"), 0)(positions)
        finally:
            self._on_epoch(upcoming)

    def _trained_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Compacted plan positions (see ``_core.skips``) of ``epoch`` that train sample ``index``."""
        ledger = skipping.ledger_for(self, epoch) or self._skips
        found = [ledger.from_plan(epoch, p) for p in self._plan_positions_of(epoch, index).tolist()]
        return np.asarray([p for p in found if p is not None], dtype=np.int64)

    def _scan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """Every plan position of ``epoch`` whose unit holds ``index``, by reading the whole plan.

        The fallback of samplers without a better inverse: O(n) time per epoch (chunk by chunk,
        O(chunk) memory), measured in BENCHMARKS.md; a query, the position does not move.
        """
        index = check_int("index", index, minimum=0)
        total = self._raw_plan_size(epoch)
        hook = type(self)._open_pass
        raw_open = getattr(hook, "__wrapped__", hook)  # plain plan positions, not compacted by the ledger
        upcoming = self._progress.upcoming_epoch()
        self._on_epoch(epoch)
        try:
            source = raw_open(self, epoch, self.seed, World(0, 1, "query"), 0)
            found = [scan_units(source, first, min(first + self._SCAN_CHUNK, total), index)
                     for first in range(0, total, self._SCAN_CHUNK)]  # fmt: skip
        finally:
            self._on_epoch(upcoming)
        return np.concatenate([np.empty(0, dtype=np.int64), *found])

    # -- description ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What this sampler is doing and with which seed: log it once per run to reproduce it."""
        world = self.world
        self._sync()
        return {
            "kind": type(self).__name__,
            "seed": self.seed,
            "seed_source": self._seed_source,
            "rank": world.rank,
            "world_size": world.world_size,
            "world_source": world.source,
            "epoch": self._progress.upcoming_epoch(),
            "consumed": 0 if self._progress.completed else self._progress.consumed,
            "even": self._even.value,
            **self._config(),
        }

    def __repr__(self) -> str:
        try:
            world = self.world
            where = f"rank={world.rank}, world_size={world.world_size}"
        except ValueError as error:  # an inconsistent launcher environment must not break repr
            where = f"world=<unresolved: {error}>"
        seed = self._resolved_seed if self._resolved_seed is not None else "None (resolved at first use)"
        parts = [self._data_repr()] if self._data_repr() else []
        parts += [f"{key}={value!r}" for key, value in self._config().items()]
        parts += [f"even={self._even.value!r}", f"seed={seed}", where]
        return f"{type(self).__name__}({', '.join(parts)})"
