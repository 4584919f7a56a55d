"""The state of every shardwise sampler, as plain functions: what ``state_dict`` saves and ``load_state_dict`` reads.

``PlanSampler`` (``samplers.base``) holds the position (its ``Progress`` and the live pass) and the
skip ledgers; these functions turn them into a state and back (``_core.state`` holds the format,
its keys and its checks). A state is global and world-size independent: ``{version, epoch,
consumed, seed, fingerprint}``, plus the skip ledgers when something is skipped. Pickling
(``ddp_spawn``, DataLoader workers) carries the position too, never a live pass (:func:`pickled`).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

from .._core.errors import MalformedStateError, StateMismatchError, check_int
from .._core.skips import SKIP, SKIP_IDS, IdSkips, SkipLedger
from .._core.state import Fingerprint, Progress, make_state, read_state
from .delivery import STATEFUL_FIX
from .passes import LivePass

SNAPSHOT_WORLD_SIZE = "world_size"
"""In a state taken by torchdata's snapshot: the world size of the steps the loader replays after it."""


def handed_out(progress: Progress, live: LivePass | None) -> tuple[int, int]:
    """``(epoch, consumed)`` counting what the live pass handed out, without folding it in (torchdata's snapshot)."""
    if live is None:
        return progress.epoch, progress.consumed
    return progress.epoch, live.consumed_after(live.local_done())


def warn_if_lossy(owner: str, live: LivePass | None) -> None:
    """Warn, at the line calling ``state_dict``, that prefetching workers hide what the loop trained."""
    if live is not None and live.driver is not None and live.driver.lossy():
        warnings.warn(
            f"{owner}.state_dict() counts the units handed to a DataLoader whose {live.driver.workers} workers "
            f"prefetch ahead of the training loop, and through {live.driver.wrapper} shardwise cannot tell how many "
            f"were trained: a resume from this state would skip the prefetched batches. To resume exactly, "
            f"{STATEFUL_FIX}",
            stacklevel=3,  # here, state_dict, its caller
        )


def save(epoch: int, consumed: int, *, seed: int, fingerprint: Fingerprint, skips: SkipLedger, skip_ids: IdSkips,
         snapshot_world_size: int | None) -> dict[str, Any]:  # fmt: skip
    """The state of a position: the skip ledgers only when something is skipped (O(ranges)), the world size
    only in torchdata's snapshot (``snapshot_world_size``)."""
    state = make_state(epoch=epoch, consumed=consumed, seed=seed, fingerprint=fingerprint)
    if skips:
        state[SKIP] = skips.to_state()
    if skip_ids:
        state[SKIP_IDS] = skip_ids.to_state()  # four ints a range
    if snapshot_world_size is not None:
        state[SNAPSHOT_WORLD_SIZE] = snapshot_world_size
    return state


def snapshot_world_size(state_dict: object) -> int | None:
    """The world size a torchdata snapshot was taken at (``None``: not such a snapshot, or an older shardwise)."""
    saved = state_dict.get(SNAPSHOT_WORLD_SIZE) if isinstance(state_dict, dict) else None
    if saved is None:
        return None
    try:
        return check_int("state['world_size']", saved, minimum=1)
    except (TypeError, ValueError) as error:
        raise MalformedStateError(str(error)) from None


def refuse_replay(saved: int, world_size: int, steps: int) -> None:
    """Raise if torchdata will replay ``steps`` steps of ``saved`` ranks after loading a snapshot at ``world_size``."""
    if steps and saved != world_size:
        effect = "skip" if world_size > saved else "repeat"
        raise StateMismatchError(
            f"state is torchdata's snapshot of world_size={saved}, taken {steps} steps before the loader's "
            f"state was saved, but this sampler has world_size={world_size}: StatefulDataLoader replays those "
            f"{steps} steps after loading it, and at world_size={world_size} each step covers {world_size} ranks' "
            f"batches instead of {saved}, so the resume would {effect} data. Resume at "
            f"world_size={saved}, or save with StatefulDataLoader(..., snapshot_every_n_steps=1) (the "
            "default: no step is replayed) or num_workers=0"
        )


@dataclass(frozen=True)
class Loaded:
    """A validated state: the position, the seed it was saved with, its skip ledgers."""

    epoch: int
    consumed: int
    seed: int
    skips: SkipLedger
    skip_ids: IdSkips


def read(state_dict: dict[str, Any], *, seed: int | None, fingerprint: Fingerprint) -> Loaded:
    """Check ``state_dict`` against this sampler (``seed``: ``None`` adopts the saved one) and read it."""
    epoch, consumed, saved_seed = read_state(state_dict, seed=seed, fingerprint=fingerprint)
    skips = SkipLedger.from_state(state_dict.get(SKIP, ()))
    skip_ids = IdSkips.from_state(state_dict.get(SKIP_IDS, ()))  # absent in older states: none
    return Loaded(epoch, consumed, saved_seed, skips, skip_ids)


def stopped_message(owner: str) -> str:
    """What an iterator that was running when a state loaded says at its next unit."""
    return (
        f"{owner}.load_state_dict() was called while this iterator was running, so it stops instead of carrying "
        "on from its old position; iterate the sampler again (a new for loop, iter(loader)) to continue from the "
        "loaded state, and load states before iterating"
    )


def pickled(attributes: dict[str, Any], progress: Progress, live: LivePass | None) -> dict[str, Any]:
    """``__getstate__``: a copy of the sampler's attributes without the live pass (it holds iterators).

    The copy holds no pass: like a new pass here, its first pass starts the epoch unless a state
    was loaded; a pass the loop received nothing from moved nothing (as ``_abandon_pass``).
    """
    state = attributes.copy()
    state["_pass"] = None
    if live is not None and live.trained() == 0:
        kept = copy.copy(progress)
        kept.loaded = True
        state["_progress"] = kept
    return state
