"""How a ``ScheduledBatchSampler`` pass walks its steps: a pass of runs of equal-size steps, and how far a
plan written at run time lets a chunk of steps read (``samplers.scheduled``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._core.mixture import PendingWeightsError
from .._core.schedule import Run
from .passes import LivePass
from .plan_view import PlanView


class StepPass(LivePass):
    """One rank's live pass: the epoch's remaining steps (as runs) and how many were handed out."""

    __slots__ = ("done", "runs")

    def __init__(self, start: int, runs: list[Run], total: int, world_size: int) -> None:
        super().__init__(start, sum(run.steps for run in runs), total, world_size)
        self.runs = runs
        self.done = 0

    def local_done(self) -> int:
        return self.done

    def consumed_at(self, done: int) -> int:
        return self.position(done)

    def end(self) -> int:
        return max(self.position(self.count), self.total)

    def position(self, steps: int) -> int:
        """The plan position where the pass's step number ``steps`` starts (or where it ended)."""
        for run in self.runs:
            if steps < run.steps:
                return run.first + steps * self.world_size * run.batch_size
            steps -= run.steps
        return self.runs[-1].end(self.world_size) if self.runs else self.start


class KnownSteps:
    """A wrapped plan written at run time (an adaptive mixture): how many leading steps of a chunk it knows yet.

    NOTE [ Steps over a plan written at run time ]
    ``MixtureSampler(weights=AdaptiveWeights(...))`` knows its plan only as far as its weight ledger
    (``plan.core.known_until``, a run position); each update reveals more. A pass over it cuts each
    chunk at the last whole step of this rank whose positions are all known, and reads the next
    chunk when its first batch is pulled, i.e. after the loop's update. A position's unit never
    changes once known, so the batches are those of the same plan read after every update, and
    ``consumed`` (a step boundary) keeps its meaning. Cost: O(chunk) a chunk, and a chunk at most
    per update (its steps are bounded by ``known_until`` first, by arithmetic).
    """

    __slots__ = ("_epoch", "_plan", "_uncompacted")

    def __init__(self, plan: PlanView, epoch: int, uncompacted: Callable[[int, np.ndarray], np.ndarray]) -> None:
        self._plan, self._epoch, self._uncompacted = plan, epoch, uncompacted

    def bound(self, starts: np.ndarray) -> int:
        """How many of the steps starting at ``starts`` (ascending) can be known: at least 1.

        A dealt position is at most its plan position (skips only remove), so a step that starts at
        or past the ledger's reach is unknown (a padded step wrapping to the epoch's start may not be,
        which only makes its chunk start later).
        """
        core = self._plan.core
        extent = core.known_until - core.epoch_start(self._epoch)
        return max(1, int(np.searchsorted(starts, extent)))

    def steps(self, positions: np.ndarray, size: int) -> int:
        """The leading whole steps (``size`` positions each) of ``positions`` whose units are known; raises if none."""
        core, epoch = self._plan.core, self._epoch
        raw = self._plan.uncompacted(epoch, self._uncompacted(epoch, positions))
        try:
            known = len(core.known_prefix(epoch, raw)) // size
            if not known:
                core.check_known(epoch, raw[:size])
        except PendingWeightsError as error:
            raise PendingWeightsError(
                f"{error}. Over ScheduledBatchSampler, report it on the batch sampler's own .adaptive (its clock "
                "is the steps it handed out; the MixtureSampler's own adaptive.update_due() does not see them)"
            ) from error
        return known
