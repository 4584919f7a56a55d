"""The state protocol of every shardwise sampler: ``state_dict``, ``load_state_dict``, pickling.

:class:`PlanState` is a base of ``PlanSampler`` (``samplers.base``), which tracks the position;
this class turns that position into a state (``_core.state`` holds the format, its keys and its
checks) and back. A state is global and world-size independent: ``{version, epoch, consumed,
seed, fingerprint}``, plus the skip ledgers when something is skipped. Pickling (``ddp_spawn``,
DataLoader workers) carries the position too, never a live pass.
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING, Any

from .._core.errors import MalformedStateError, StateMismatchError, check_int
from .._core.skips import SKIP, SKIP_IDS, IdSkips, SkipLedger
from .._core.state import Fingerprint, Progress, make_state, read_state
from . import callers
from .delivery import STATEFUL_FIX
from .passes import LivePass

if TYPE_CHECKING:
    from .._core.world import World

SNAPSHOT_WORLD_SIZE = "world_size"
"""In a state taken by torchdata's snapshot: the world size of the steps the loader replays after it."""


class PlanState:
    """``state_dict`` / ``load_state_dict`` / ``__getstate__`` of a ``PlanSampler``; see the module docstring."""

    if TYPE_CHECKING:  # provided by PlanSampler
        _seed_arg: int | None
        _resolved_seed: int | None
        _seed_source: str
        _progress: Progress
        _pass: LivePass | None
        _skips: SkipLedger
        _skip_ids: IdSkips

        @property
        def seed(self) -> int: ...

        @property
        def world(self) -> World: ...

        def _sync(self) -> None: ...

        def _plan_size(self, epoch: int) -> int: ...

        def _fingerprint(self) -> Fingerprint: ...

        def _on_epoch(self, epoch: int) -> None: ...

    def _full_fingerprint(self) -> Fingerprint:
        return {"kind": type(self).__name__, **self._fingerprint()}

    def _handed_out(self) -> tuple[int, int]:
        """``(epoch, consumed)`` counting what the live pass handed out, without folding it in."""
        live = self._pass
        if live is None:
            return self._progress.epoch, self._progress.consumed
        done = live.local_done()
        return self._progress.epoch, live.end() if done >= live.count else live.consumed_at(done)

    def state_dict(self) -> dict[str, Any]:
        """The global, world-size-independent position: ``{version, epoch, consumed, seed, fingerprint}``.

        ``consumed`` counts what the training loop received, not what the DataLoader's workers
        prefetched: called after ``k`` trained batches, the resumed run starts at batch ``k + 1``,
        with any ``num_workers`` and ``prefetch_factor`` (see ``shardwise.samplers.delivery``).
        Every rank returns the same dict at a step boundary, so saving rank 0's is enough.

        Warns when a DataLoader with workers draws from this sampler through a batch sampler that
        wraps it, which hides how many prefetched units were trained.

        A state taken by torchdata's ``StatefulDataLoader`` for its snapshots also says the world
        size (``"world_size"``): torchdata replays the steps taken after a snapshot, and those
        cover the saved position only at the world size they were taken at (see ``load_state_dict``).
        """
        snapshot = callers.torchdata_snapshotting(1)  # 1: who called state_dict
        if snapshot:
            # torchdata snapshots at hand-out and pairs the snapshot with the delivering step.
            epoch, consumed = self._handed_out()
        else:
            self._sync()
            live = self._pass
            if live is not None and live.driver is not None and live.driver.lossy():
                warnings.warn(
                    f"{type(self).__name__}.state_dict() counts the units handed to a DataLoader whose "
                    f"{live.driver.workers} workers prefetch ahead of the training loop, and through "
                    f"{live.driver.wrapper} shardwise cannot tell how many were trained: a resume from this "
                    f"state would skip the prefetched batches. To resume exactly, {STATEFUL_FIX}",
                    stacklevel=2,
                )
            epoch, consumed = self._progress.epoch, self._progress.consumed
        state = make_state(epoch=epoch, consumed=consumed, seed=self.seed, fingerprint=self._full_fingerprint())
        if self._skips:
            state[SKIP] = self._skips.to_state()  # O(ranges); absent when nothing is skipped
        if self._skip_ids:
            state[SKIP_IDS] = self._skip_ids.to_state()  # four ints a range; absent when no id is skipped
        if snapshot:
            live = self._pass
            state[SNAPSHOT_WORLD_SIZE] = live.world_size if live is not None else self.world.world_size
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()`` output, in O(1), at any world size.

        The next pass (the next ``iter()`` that is pulled) continues from the loaded position.

        .. warning::
            An iterator of this sampler that is running when the state is loaded does not carry
            on from its old position: it raises ``RuntimeError`` at its next unit. Load the state
            before iterating (frameworks do), then iterate again.

        A state that torchdata's ``StatefulDataLoader`` (with workers and ``snapshot_every_n_steps``
        above 1) restores from a snapshot taken some steps before it was saved loads only at the
        world size it was saved at: torchdata replays those steps, which at another world size
        cover another number of samples (skipped or repeated).

        Raises:
            StateMismatchError: the state belongs to another configuration (names the field), or is
                such a snapshot loading at another world size.
            MalformedStateError: the dict is not a shardwise state of a known version.
        """
        self._refuse_replay_at_another_world_size(state_dict)
        # seed=None resumes with the seed the saved run resolved to, adopted only once the state is valid.
        adopt = self._seed_arg is None
        epoch, consumed, seed = read_state(
            state_dict, seed=None if adopt else self.seed, fingerprint=self._full_fingerprint()
        )
        if adopt:
            self._adopt_seed(seed)
        self._skips = SkipLedger.from_state(state_dict.get(SKIP, ()))  # before the size below, which it shrinks
        self._skip_ids = IdSkips.from_state(state_dict.get(SKIP_IDS, ()))  # absent in older states: none
        self._sync()
        live = self._pass
        if live is not None:  # a running pass: its iterator must not carry on from the old position
            live.stop(
                f"{type(self).__name__}.load_state_dict() was called while this iterator was running, so it stops "
                "instead of carrying on from its old position; iterate the sampler again (a new for loop, "
                "iter(loader)) to continue from the loaded state, and load states before iterating"
            )
        self._pass = None
        self._progress.load(epoch, consumed, self._plan_size(epoch))
        self._on_epoch(epoch)

    def _refuse_replay_at_another_world_size(self, state_dict: dict[str, Any]) -> None:
        """Raise if torchdata is restoring a snapshot of another world size and will replay steps after it."""
        saved = state_dict.get(SNAPSHOT_WORLD_SIZE) if isinstance(state_dict, dict) else None
        if saved is None:
            return  # a state of an older shardwise, or not taken by torchdata's snapshot
        try:
            saved = check_int("state['world_size']", saved, minimum=1)
        except (TypeError, ValueError) as error:
            raise MalformedStateError(str(error)) from None
        world_size = self.world.world_size
        if saved == world_size:
            return
        steps = callers.torchdata_replayed_steps(2)  # 2: who called load_state_dict
        if steps:
            effect = "skip" if world_size > saved else "repeat"
            raise StateMismatchError(
                f"state is torchdata's snapshot of world_size={saved}, taken {steps} steps before the loader's "
                f"state was saved, but this sampler has world_size={world_size}: StatefulDataLoader replays those "
                f"{steps} steps after loading it, and at world_size={world_size} each step covers {world_size} ranks' "
                f"batches instead of {saved}, so the resume would {effect} data. Resume at "
                f"world_size={saved}, or save with StatefulDataLoader(..., snapshot_every_n_steps=1) (the "
                "default: no step is replayed) or num_workers=0"
            )

    def _adopt_seed(self, seed: int) -> None:
        """Take the seed of a validated state (this sampler was built with ``seed=None``)."""
        self._resolved_seed, self._seed_source = seed, "resumed state"

    def __getstate__(self) -> dict[str, Any]:
        # A live pass holds iterators; pickling (ddp_spawn, workers) carries only the position. The copy
        # holds no pass: like a new pass here, its first pass starts the epoch unless a state was loaded.
        self._sync()
        state = self.__dict__.copy()
        state["_pass"] = None
        if self._pass is not None and self._pass.trained() == 0:
            progress = copy.copy(self._progress)
            progress.loaded = True  # as _abandon_pass: a pass the loop received nothing from moved nothing
            state["_progress"] = progress
        return state
