"""The resume state and the epoch/position bookkeeping every sampler shares.

A state is global and O(1): ``{"version", "epoch", "consumed", "seed", "fingerprint"}``, where
``consumed`` counts the units of the epoch's global plan already handed out by all ranks
together. It is the same on every rank (rank 0's copy restores all) and it does not depend on the
world size, so a state saved with ``W`` ranks loads with ``W'``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .errors import MalformedStateError, StateMismatchError, check_int
from .seeds import SEED_MAX

STATE_VERSION = 1

VERSION = "version"
EPOCH = "epoch"
CONSUMED = "consumed"
SEED = "seed"
FINGERPRINT = "fingerprint"
KEYS = (VERSION, EPOCH, CONSUMED, SEED, FINGERPRINT)

Fingerprint = dict[str, Any]
"""Plain values that identify a plan (sampler kind, data size, shuffle, digests of arrays)."""

LATER_FIELDS = frozenset({"dataset", "names"})
"""Fingerprint fields that older states lack, or that only some data has (see NOTE [ What the data
fingerprint checks ] in ``shardwise.samplers.identity``): missing on either side, the state loads and
a warning is logged; present on both, they must match."""

PLAN_HINT = (
    " (the state holds a position in an earlier plan of this sampler; BucketBatchSampler's earlier plan loads "
    "with batch_order='ascending')"
)
OTHER_PLAN_HINT = (
    " (a state of another shardwise release's plan: resume it with that release, or load "
    "shardwise.rebase_state(state, sampler), which resumes at the same position of this plan and so repeats "
    "or skips some of the epoch's samples)"
)
REBASE_HINT = "; if the data changed on purpose, load shardwise.rebase_state(state, sampler) instead"

logger = logging.getLogger("shardwise")


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict`` (torchdata's protocol, restated here)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def make_state(*, epoch: int, consumed: int, seed: int, fingerprint: Fingerprint) -> dict[str, Any]:
    """A fresh state dict (plain ints, strings and dicts: safe for ``torch.save`` and JSON)."""
    return {VERSION: STATE_VERSION, EPOCH: epoch, CONSUMED: consumed, SEED: seed, FINGERPRINT: dict(fingerprint)}


def read_state(state: object, *, seed: int | None, fingerprint: Fingerprint) -> tuple[int, int, int]:
    """Validate a saved state against this sampler and return its ``(epoch, consumed, seed)``.

    ``seed=None``: the sampler takes the saved seed (it was built with ``seed=None``), which must
    then only be a valid seed; otherwise the saved seed must equal ``seed``.

    Raises:
        MalformedStateError: not a mapping, a missing key, a wrong type, a value out of range
            (a seed outside ``[0, 2**64)``, an epoch or position beyond ``2**62``), or another version.
        StateMismatchError: the state belongs to another configuration; the message names the
            first field that differs, e.g. ``num_samples``.
    """
    if not isinstance(state, Mapping):
        raise MalformedStateError(f"state should be a dict from state_dict(), but got {type(state).__name__}")
    missing = [key for key in KEYS if key not in state]
    if missing:
        raise MalformedStateError(
            f"state is missing {', '.join(repr(k) for k in missing)}; a shardwise state has keys {', '.join(KEYS)}"
        )
    if state[VERSION] != STATE_VERSION:
        raise MalformedStateError(
            f"state has version={state[VERSION]!r}, but this release of shardwise reads version={STATE_VERSION}"
        )
    try:
        epoch = check_int("state['epoch']", state[EPOCH], minimum=0)
        consumed = check_int("state['consumed']", state[CONSUMED], minimum=0)
        saved_seed = check_int("state['seed']", state[SEED], minimum=0, maximum=SEED_MAX)
    except (TypeError, ValueError) as error:
        raise MalformedStateError(str(error)) from None
    saved = state[FINGERPRINT]
    if not isinstance(saved, Mapping):
        raise MalformedStateError(f"state['fingerprint'] should be a dict, but got {type(saved).__name__}")
    for name, value in fingerprint.items():
        if name not in saved and name in LATER_FIELDS:
            logger.warning("state was saved without %s: the data is not checked against this sampler's %s=%r "
                           "(a state of an older shardwise, or of data without one)", name, name, value)  # fmt: skip
        elif name not in saved:
            raise StateMismatchError(
                f"state was saved without {name}, but this sampler has {name}={value!r}"
                + (PLAN_HINT if name == "plan" else "")
            )
        elif saved[name] != value:
            raise StateMismatchError(
                f"state was saved for {name}={saved[name]!r}, but this sampler has {name}={value!r}"
                + {"kind": "", "plan": OTHER_PLAN_HINT}.get(name, REBASE_HINT)
            )
    for name in sorted(LATER_FIELDS & set(saved) - set(fingerprint)):
        logger.warning("state was saved with %s=%r, which this sampler's data does not have: not checked",
                       name, saved[name])  # fmt: skip
    extra = sorted(set(saved) - set(fingerprint) - LATER_FIELDS)
    if extra:
        raise StateMismatchError(
            f"state was saved with {extra[0]}={saved[extra[0]]!r}, which this sampler does not have"
        )
    if seed is not None and saved_seed != seed:
        raise StateMismatchError(f"state was saved for seed={saved_seed}, but this sampler has seed={seed}")
    return epoch, consumed, saved_seed


class Progress:
    """Epoch and global position of one sampler, with the auto-advance rule of docs/design.md, "Epochs".

    - ``set_epoch(e)`` always wins: a different epoch starts at position 0, and so does the same
      epoch once a pass over it completed here (code that calls ``set_epoch(0)`` every epoch gets
      the same order every time).
    - A position loaded from a state is authoritative: ``set_epoch`` of that same epoch, which
      frameworks call right after ``load_state_dict``, keeps it, even when the saved epoch was
      complete (the rest of the epoch is then empty, as it would have been without the restart).
    - A pass that completed with no ``set_epoch`` after it makes the next pass the next epoch, so
      orders differ between epochs even when nobody calls ``set_epoch``.
    - A loaded epoch end (a state saved just after the epoch's last unit) met by a loader that
      restores the state itself (torchdata: the load happens inside ``iter(loader)``, after the
      user's ``set_epoch``): the epoch the user set last decides. ``set_epoch(e)`` of the saved
      epoch gives the empty rest of ``e``; ``set_epoch(e + 1)`` gives epoch ``e + 1``; with no
      ``set_epoch``, the restored iterator (``begin(keep_end=True)``) continues the loaded
      position (empty) and the next pass is ``e + 1``. An empty rest handed to a restored
      iterator leaves the loaded position as it was: torchdata may discard that iterator.
    - NOTE [ A new pass starts its epoch ]: a pass begins at its epoch's start, as with torch's
      ``DistributedSampler``, unless a loaded position is waiting for it (``loaded``): a pass that
      was broken off (a loop left by ``break``, a sanity check of a few batches, ``next(iter(s))``)
      leaves ``consumed`` saying what was trained, for ``state_dict``, but the next pass of the
      same epoch starts at 0. A loaded position waits through ``set_epoch`` of its epoch and is
      taken by the first pass that begins; the sampler gives it back (``loaded = True``) when that
      pass was abandoned before the loop received anything from it.
    """

    __slots__ = ("completed", "consumed", "epoch", "loaded", "requested", "resumed")

    def __init__(self) -> None:
        self.epoch = 0
        self.consumed = 0
        self.completed = False
        self.resumed = False
        self.loaded = False  # consumed is a loaded position that the next pass continues
        self.requested: int | None = None  # the epoch of the last set_epoch, until a pass begins

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, minimum=0)
        self.requested = epoch
        if epoch != self.epoch or (self.completed and not self.resumed):
            self.epoch, self.consumed, self.completed, self.loaded = epoch, 0, False, False
        else:
            self.completed = False  # same epoch: keep the position, even at its end after a resume
        self.resumed = False

    def begin(self, *, keep_end: bool = False) -> tuple[int, int]:
        """The ``(epoch, start position)`` of the pass about to be iterated.

        ``keep_end``: the pass continues a loaded position (a restored loader iterator), so a
        loaded epoch end gives an empty pass of that epoch instead of the next epoch.
        """
        if self.completed and self.resumed:
            stay = self.requested == self.epoch or (keep_end and self.requested is None)
            if stay and keep_end:
                return self.epoch, self.consumed  # an empty rest: the loaded position stays for the next pass
            if stay:
                self.completed = False
        if self.completed:
            self.epoch, self.consumed = self.epoch + 1, 0
        elif not self.loaded:
            self.consumed = 0  # NOTE [ A new pass starts its epoch ]: what a broken-off pass trained stays trained
        self.completed = self.resumed = self.loaded = False
        self.requested = None
        return self.epoch, self.consumed

    def upcoming_epoch(self) -> int:
        """The epoch the next pass will iterate (what ``len()`` must describe)."""
        return self.epoch + 1 if self.completed else self.epoch

    def load(self, epoch: int, consumed: int, total: int) -> None:
        """Adopt a saved position; a saved ``consumed >= total`` (nonzero) is a completed epoch."""
        self.epoch, self.consumed = epoch, consumed
        self.completed = total > 0 and consumed >= total
        self.resumed = self.loaded = True
