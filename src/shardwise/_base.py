"""The shell every shardwise sampler shares: lazy rank resolution, epochs, state, dealing, repr.

A sampler subclass says three things: how many units its global plan has in an epoch
(``_plan_size``), how to turn plan positions into units (``_open_pass``), and what identifies its
configuration (``_fingerprint``). This class deals the plan out by position, keeps every rank's
length equal, tracks the position for ``state_dict`` and advances the epoch.

Position tracking costs nothing per unit: the units of a pass are handed out through
``itertools.chain`` over one list iterator per chunk, and the position is read back from the
current list iterator's ``__length_hint__`` only when someone asks (``state_dict``, ``set_epoch``,
the next ``__iter__``). A Python generator would cost a frame switch per index.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from ._errors import check_choice, check_int
from ._frameworks import PlanMeta, install, refuse_resharding
from ._plan import Even, pass_end, rank_count, rank_positions
from ._seeds import check_seed, log_resolved_seed, resolve_seed
from ._state import SEED, Fingerprint, Progress, make_state, read_state
from ._world import World, check_world_args, resolve_world

T = TypeVar("T")

UnitSource = Callable[[np.ndarray], list[Any]]
"""Turns an array of plan positions (each in ``[0, total)``) into the units at those positions."""


def torch_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of an initialised default ``torch.distributed`` group, else ``None``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def current_world(num_replicas: int | None = None, rank: int | None = None) -> World:
    """Resolve rank and world size now (DESIGN.md section 3): arguments, torch.distributed, launcher."""
    return resolve_world(num_replicas, rank, dist=torch_world(), env=os.environ)


class _Pass:
    """One rank's live pass over an epoch: where it started and how far the consumer has read."""

    __slots__ = ("count", "current", "current_len", "done_chunks", "start", "total", "world_size")

    def __init__(self, start: int, count: int, total: int, world_size: int) -> None:
        self.start, self.count, self.total, self.world_size = start, count, total, world_size
        self.done_chunks = 0
        self.current: Iterator[Any] | None = None
        self.current_len = 0

    def local_done(self) -> int:
        """Units this rank has handed out in this pass."""
        if self.current is None:
            return self.done_chunks
        remaining: int = self.current.__length_hint__()  # type: ignore[attr-defined]
        return self.done_chunks + self.current_len - remaining


class PlanSampler(Generic[T], metaclass=PlanMeta):
    """Mixin with the behaviour DESIGN.md requires of every sampler; see the module docstring.

    Subclasses call :meth:`_init_plan` from ``__init__`` and implement the three hooks.
    """

    _CHUNK: ClassVar[int] = 1 << 16
    """Units generated per chunk: bounds memory per rank, amortises numpy call overhead."""

    _FIRST_CHUNK: ClassVar[int] = 0
    """Units in a pass's first chunk (0: ``_CHUNK``); later chunks double up to ``_CHUNK``: a cheap first batch."""

    _seed_arg: int | None
    _resolved_seed: int | None
    _seed_source: str
    _num_replicas_arg: int | None
    _rank_arg: int | None
    _even: Even
    _progress: Progress
    _pass: _Pass | None

    # -- hooks -------------------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        """Units in the global plan of ``epoch``."""
        raise NotImplementedError

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        """The unit source for one pass over ``epoch`` starting at plan position ``start``."""
        raise NotImplementedError

    def _fingerprint(self) -> Fingerprint:
        """Plain values identifying the plan; the kind is added here."""
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        """Configuration shown by ``__repr__`` (after the data argument)."""
        return {}

    def _on_epoch(self, epoch: int) -> None:
        """Called whenever the epoch is set or advances (wrappers forward it to what they wrap)."""

    # -- construction --------------------------------------------------------------------------
    def _init_plan(self, *, seed: object, num_replicas: object, rank: object, even: object) -> None:
        self._seed_arg = check_seed(seed)
        self._resolved_seed = self._seed_arg
        self._seed_source = "argument"
        self._num_replicas_arg, self._rank_arg = check_world_args(num_replicas, rank)
        self._even = check_choice("even", even, Even)
        self._progress = Progress()
        self._pass = None

    # -- resolution ----------------------------------------------------------------------------
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

    @property
    def even(self) -> Even:
        """How ranks are given equal lengths: ``Even.PAD`` or ``Even.DROP``."""
        return self._even

    # -- epochs and position -------------------------------------------------------------------
    def _sync(self) -> None:
        """Fold the live pass's read position into the progress record."""
        live = self._pass
        if live is None:
            return
        done = live.local_done()
        if done >= live.count:
            self._progress.consumed = pass_end(live.total, live.start, live.world_size, self._even)
            self._progress.completed = True
            self._pass = None
        else:
            self._progress.consumed = live.start + done * live.world_size

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
        if self._pass is not None and check_int("epoch", epoch, minimum=0) == self._progress.epoch:
            return
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

    def _begin_pass(self) -> tuple[World, int, int, int, int]:
        """Open the next pass: ``(world, seed, epoch, start, total)``, advancing a completed epoch."""
        self._sync()
        world = self.world
        seed = self.seed
        advancing = self._progress.completed
        epoch, start = self._progress.begin()
        if advancing:
            self._on_epoch(epoch)
        return world, seed, epoch, start, self._plan_size(epoch)

    def __iter__(self) -> Iterator[T]:
        refuse_resharding(self)  # here, not in _begin_pass: it inspects the frames that called __iter__
        world, seed, epoch, start, total = self._begin_pass()
        count = rank_count(total, start, world.world_size, self._even)
        live = _Pass(start, count, total, world.world_size)
        self._pass = live
        source = self._open_pass(epoch, seed, world, start)
        return itertools.chain.from_iterable(self._chunks(live, world, source))

    def _chunks(self, live: _Pass, world: World, source: UnitSource) -> Iterator[Iterator[T]]:
        # Only chunk boundaries depend on the chunk sizes, never the units (a source is a pure
        # function of the positions), so small first chunks just make the first units cheaper.
        first, size = 0, min(self._FIRST_CHUNK or self._CHUNK, self._CHUNK)
        while first < live.count:
            stop = min(first + size, live.count)
            positions = rank_positions(live.start, world.rank, world.world_size, first, stop, live.total)
            units = source(positions)
            if len(units) != stop - first:
                raise RuntimeError(f"{type(self).__name__} produced {len(units)} units for {stop - first} positions")
            live.done_chunks += live.current_len
            live.current, live.current_len = iter(units), len(units)
            yield live.current
            first, size = stop, min(2 * size, self._CHUNK)

    # -- state ---------------------------------------------------------------------------------
    def _full_fingerprint(self) -> Fingerprint:
        return {"kind": type(self).__name__, **self._fingerprint()}

    def state_dict(self) -> dict[str, Any]:
        """The global, world-size-independent position: ``{version, epoch, consumed, seed, fingerprint}``.

        Every rank returns the same dict at a step boundary, so saving rank 0's is enough.
        """
        self._sync()
        progress = self._progress
        return make_state(
            epoch=progress.epoch, consumed=progress.consumed, seed=self.seed, fingerprint=self._full_fingerprint()
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()`` output, in O(1), at any world size.

        Raises:
            StateMismatchError: the state belongs to another configuration (names the field).
            MalformedStateError: the dict is not a shardwise state of a known version.
        """
        if self._seed_arg is None and isinstance(state_dict, dict) and isinstance(state_dict.get(SEED), int):
            # seed=None resumes with the seed the saved run resolved to.
            self._resolved_seed, self._seed_source = state_dict[SEED], "resumed state"
        epoch, consumed = read_state(state_dict, seed=self.seed, fingerprint=self._full_fingerprint())
        self._pass = None
        self._progress.load(epoch, consumed, self._plan_size(epoch))
        self._on_epoch(epoch)

    def __getstate__(self) -> dict[str, Any]:
        # A live pass holds iterators; pickling (ddp_spawn, workers) carries only the position.
        self._sync()
        state = self.__dict__.copy()
        state["_pass"] = None
        return state

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
