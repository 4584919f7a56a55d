"""What every sampler is made of: its arguments, its position, its skip ledgers, and the hooks of its plan.

:class:`Shell` is the base of the sampler shell (``samplers.base.PlanSampler``): it holds the
attributes every layer reads (the seed and world as given, the progress record, the live pass,
the skip ledgers), resolves the world and the seed lazily, folds a live pass into the progress
(:meth:`Shell._sync`), and declares the hooks a sampler implements. The layers above it are a
straight line, each reading only what this class declares: the skip ledger (``samplers.skipping``),
the provenance queries (``samplers.queries``), the passes and the state (``samplers.base``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._core.plan import Even
from .._core.seeds import check_seed, log_resolved_seed, resolve_seed
from .._core.skips import IdSkips, SkipLedger
from .._core.state import Fingerprint, Progress
from .._core.world import World, check_world_args
from .keywords import Keywords
from .passes import LivePass, UnitSource
from .world import current_world


class Shell:
    """The attributes, the lazy resolution and the plan hooks of every sampler; see the module docstring.

    A sampler calls :meth:`_init_plan` from ``__init__`` and implements ``_plan_size``, ``_open_pass``
    and ``_fingerprint`` (the others have defaults).
    """

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

    def _known_positions(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """For one pass: the leading positions of a chunk whose units can be computed yet (``None``: all).

        A sampler whose plan is written at run time (adaptive mixture weights) cuts each chunk there, and
        raises when not even the first position is known.
        """
        return None

    def _wrap_period(self) -> int | None:
        """The period padding wraps within (NOTE [ Padding wrap ] in ``_core.plan``); ``None``: ``p % total``."""
        return None

    def _id_count(self) -> int | None:
        """The hook behind :attr:`id_count`; every shardwise sampler that inverts its plan overrides it."""
        return None

    # -- construction ------------------------------------------------------------------------
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

    def _refuse_mid_epoch(self, name: str) -> None:
        """Raise before ``name`` changes while an epoch is under way (the pass and the state follow one plan)."""
        self._sync()
        if self._pass is not None or (self._progress.consumed and not self._progress.completed):
            raise RuntimeError(
                f"{name} cannot change in the middle of an epoch; set it before iterating or between epochs"
            )

    @property
    def even(self) -> Even:
        """How ranks are given equal lengths: ``Even.PAD`` or ``Even.DROP``."""
        return self._even

    # -- position and identity -----------------------------------------------------------------
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

    def _full_fingerprint(self) -> Fingerprint:
        return {"kind": type(self).__name__, **self._fingerprint()}

    def _adopt_seed(self, seed: int) -> None:  # a validated state's seed (this sampler was built with seed=None)
        self._resolved_seed, self._seed_source = seed, "resumed state"
