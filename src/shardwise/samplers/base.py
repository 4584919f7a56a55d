"""The shell every shardwise sampler shares: epochs, passes, dealing, state, repr (over ``samplers.shell``).

A sampler subclass says three things: how many units its global plan has in an epoch
(``_plan_size``), how to turn plan positions into units (``_open_pass``), and what identifies its
configuration (``_fingerprint``). This class deals the plan out by position, keeps every rank's
length equal, tracks the position and advances the epoch; the functions of ``samplers.state``
turn the position into ``state_dict`` and back.

Position tracking costs nothing per unit: the units of a pass are handed out through
``itertools.chain`` over one list iterator per chunk, and the position is read back from the
current list iterator's ``__length_hint__`` only when someone asks (``state_dict``, ``set_epoch``,
the next ``__iter__``). A Python generator would cost a frame switch per index.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from .._core.errors import check_int
from .._core.plan import rank_count
from .._core.world import World
from . import callers, state
from .delivery import find_driver
from .frameworks import PlanMeta, install, lightning_pending_epoch, refuse_resharding
from .keywords import Keywords, read_keywords
from .passes import LivePass
from .queries import PlanQueries

T = TypeVar("T")


class PlanSampler(PlanQueries, Generic[T], metaclass=PlanMeta):
    """Mixin with the behaviour docs/design.md requires of every sampler; see the module docstring.

    Subclasses call :meth:`_init_plan` from ``__init__`` and implement the three hooks (``samplers.shell``).
    """

    _CHUNK: ClassVar[int] = 1 << 16
    """Units generated per chunk: bounds memory per rank, amortises numpy call overhead."""

    _FIRST_CHUNK: ClassVar[int] = 0
    """Units in a pass's first chunk (0: ``_CHUNK``); later chunks double up to ``_CHUNK``: a cheap first batch."""

    # -- construction --------------------------------------------------------------------------
    _KEYWORD_DEFAULTS: ClassVar[dict[str, Any]] = {}
    """Defaults of the shared keywords that differ from ``keywords.DEFAULTS`` (each with its reason)."""
    _keyword_kind: ClassVar[type | None]  # set by PlanMeta from ``__init__``'s ``**options: Unpack[...]``

    def _read_keywords(self, options: Mapping[str, Any]) -> Keywords:
        """The shared keywords of this construction (``**options``), checked once, here (see ``.keywords``)."""
        kind = type(self)._keyword_kind
        if kind is None:
            raise TypeError(f"{type(self).__name__}.__init__ should take **options: Unpack[...] (see .keywords)")
        return read_keywords(type(self).__name__, kind, options, self._KEYWORD_DEFAULTS)

    # -- epochs and position -------------------------------------------------------------------
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
        total = self._plan_size(self._progress.upcoming_epoch())
        return rank_count(total, 0, self.world.world_size, self._even)

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

    def __iter__(self) -> Iterator[T]:
        refuse_resharding(self)  # here, not in _begin_pass: it inspects the frames that called __iter__
        self._check_iterable()
        live = self._pass
        if live is not None and live.driver is not None:  # a loader restarting its iterator: the pass is over
            live.driver.restarting(1)  # 1: what called __iter__
        return itertools.chain.from_iterable(self._pass_chunks())

    def _check_iterable(self) -> None:
        """Raise at ``iter()``, not at the first unit, for a configuration that cannot be iterated now."""

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

    def _data_repr(self) -> str:
        return ""

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


install(PlanSampler)  # framework shape: see _frameworks
