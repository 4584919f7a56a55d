"""``ScheduledBatchSampler``: batches whose size follows a schedule, every rank in lockstep.

The global plan here is a plan of **samples** (a keyed permutation of the data, or the plan of an
index sampler such as ``WeightedSampler``), and the batch structure is cut from it step by step:
global step ``s`` starts at sample position ``p_s``, takes the per-rank size ``b_s`` the schedule
gives at ``p_s``, and covers the ``W * b_s`` positions ``[p_s, p_s + W * b_s)``, rank ``r``
taking the slice ``[p_s + r * b_s, p_s + (r + 1) * b_s)``. So the ``W`` batches of a step always
have the same size, and a size change lands on a global step boundary.

Because a step consumes ``W * b`` samples, batch boundaries depend on the world size, but the
sample plan does not. The resume state therefore counts ``consumed`` in **samples of the global
sample plan** (at a step boundary, the same on every rank); resuming at any world size ``W'``
recomputes the steps from that position with the schedule, so nothing is lost or repeated, in
O(schedule segments) time, not O(samples).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from .._core.errors import MalformedStateError, check_int
from .._core.permutation import Permutation, positions_of
from .._core.plan import wrap
from .._core.provenance import ProvenanceUnsupported, run_occurrences, run_of_step, run_step_positions
from .._core.schedule import BatchSizeSchedule, Run, ScheduleLike, Step, as_schedule, plan_steps
from .._core.seeds import INDEX_SHUFFLE, derive_seed
from .._core.state import Fingerprint
from .._core.world import World
from .adaptive import AdaptiveMixture
from .base import PlanSampler
from .feedback import ADAPTIVE
from .frameworks import is_batch_plan
from .identity import with_data
from .inputs import dataset_size
from .keywords import ShuffledKeywords
from .passes import LivePass, UnitSource
from .scheduled_steps import KnownSteps, StepPass

if TYPE_CHECKING:
    from typing_extensions import Unpack

_CHUNK_SAMPLES = 1 << 16
"""Samples generated per numpy call: bounds memory per rank, amortises call overhead."""


class ScheduledBatchSampler(PlanSampler[list[Any]], Sampler[list[Any]]):
    """Distributed batches whose size (and payload) follows a schedule, in lockstep on every rank.

    One epoch is one pass over a global sample plan: a shuffled (or in-order) pass over the data,
    or the plan of a shardwise index sampler (``ShardedSampler``, ``WeightedSampler``, ``shard(...)``).
    Global step ``s`` takes ``W * b_s`` consecutive plan positions, ``b_s`` from the schedule at
    that position; rank ``r`` of ``W`` gets the ``r``-th slice of ``b_s``. Every rank yields the
    same number of batches, of the same sizes, and ``len()`` is exact before the first batch.

    The last step of an epoch, when fewer than ``W * b`` samples remain, is cut to
    ``ceil(remaining / W)`` samples per rank, wrapping back into the plan for the at most
    ``W - 1`` missing ones (``drop_last=False``; to its start, or as the index sampler wraps: a
    partitioned ``LocalitySampler`` within the partition), or dropped (``drop_last=True``).

    With a schedule that carries payloads, every batch is a list of ``(index, payload)`` pairs,
    so that ``dataset[(index, payload)]`` sees, say, the image size of its step inside the
    DataLoader workers; without payloads, batches are lists of indices.

    Cost at 1e9 samples: O(schedule segments) integers and one chunk of 65,536 positions per
    rank, plus what ``data`` holds (nothing for a length or ``ShardedSampler``; see
    ``docs/scale.md`` for the index samplers): it never builds an O(n) array itself.

    Resume: ``state_dict()["consumed"]`` counts samples of the epoch's global plan handed out by
    all ranks (a step boundary, equal on every rank). Loading it at another world size, or with
    another schedule, continues from that sample position: nothing is lost or repeated.

    Args:
        data: a dataset with ``len()``, its length as an int, or a shardwise index sampler whose
            global plan is batched (its own ``seed`` and order are used).
        batch_size: a positive int, a :class:`BatchSizeSchedule`, or a callable
            ``(epoch, samples) -> size`` (or ``(size, payload)``), the per-rank batch size.
        shuffle: shuffle the data, differently every epoch (a length or dataset only).
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: drop the last, short step instead of shrinking it.

    Raises:
        ValueError: a schedule under which a rank would get zero batches in an epoch
            (``drop_last=True`` and fewer samples than one global step needs).

    Example:
        >>> schedule = BatchSizeSchedule.by_samples({0: 2, 8: 3})
        >>> sampler = ScheduledBatchSampler(20, batch_size=schedule, shuffle=False, num_replicas=2, rank=0)
        >>> list(sampler)
        [[0, 1], [4, 5], [8, 9, 10], [14, 15, 16]]
        >>> [step.batch_size for step in sampler.steps(epoch=0)]
        [2, 2, 3, 3]
        >>> [step.batch_size for step in sampler.steps(epoch=1)]  # epoch 1 starts at sample 20
        [3, 3, 3, 1]
    """

    def __init__(
        self,
        data: Any,
        *,
        batch_size: ScheduleLike,
        **options: Unpack[ShuffledKeywords],
    ) -> None:
        self.schedule: BatchSizeSchedule = as_schedule(batch_size)
        keywords = self._read_keywords(options)
        self.shuffle, self.drop_last = keywords.shuffle, keywords.drop_last
        self.data = data
        self._inner: PlanSampler[Any] | None = None
        self._size = 0
        if isinstance(data, PlanSampler) and is_batch_plan(data):
            raise TypeError(
                f"data should be a dataset, a length or a shardwise index sampler, but got {type(data).__name__}, "
                "a batch sampler whose units are batches; a batch sampler takes a BatchSizeSchedule itself "
                "(e.g. its batch_size=), or give ScheduledBatchSampler the index sampler or the data"
            )
        if isinstance(data, PlanSampler):
            self._inner = data
            inner_seed = data.plan.explicit_seed
            if not keywords.shuffle:
                raise ValueError(
                    f"shuffle=False has no effect when data is an index sampler ({type(data).__name__}), "
                    "whose plan brings its own order; build that sampler with shuffle=False instead"
                )
            seed = keywords.seed
            if seed not in (0, inner_seed):
                raise ValueError(
                    f"seed={seed!r} differs from the seed of the index sampler data ({type(data).__name__} has "
                    f"seed={inner_seed!r}), whose plan is batched as is; set the seed on that sampler"
                )
            keywords = keywords.with_seed(inner_seed)
        elif isinstance(data, Sampler):
            raise TypeError(
                f"data should be a dataset, a length or a shardwise index sampler, but got {type(data).__name__}, "
                "a torch sampler that is not distributed; wrap it as shardwise.shard(sampler) to batch its order"
            )
        else:
            self._size = dataset_size(data, "data")
        self._init_plan(keywords)
        self._cache: tuple[tuple[int, int, int], list[Run]] | None = None
        self.schedule(0, 0)  # a callable schedule's return value is checked now, not at the first batch
        world_size = self._num_replicas_arg or 1
        total = self._plan_size(0)
        epochs = self.schedule.epoch_starts_to_check(total) or [0]
        for epoch in epochs:
            self._check_not_empty(epoch, total if epoch == 0 else self._plan_size(epoch), world_size)

    # -- the plan ------------------------------------------------------------------------------
    def _plan_size(self, epoch: int) -> int:
        """Samples in the global plan of ``epoch`` (the unit of ``consumed``)."""
        if self._inner is not None:
            return self._inner.plan.size(epoch)
        return self._size

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        """The sample source: plan positions -> sample indices."""
        if self._inner is not None:
            return self._inner.plan.source(epoch, seed, world, start)
        if not self.shuffle:
            return np.ndarray.tolist
        permutation = Permutation(self._size, derive_seed(seed, epoch, INDEX_SHUFFLE))
        return lambda positions: permutation(positions).tolist()

    def _on_epoch(self, epoch: int) -> None:
        if self._inner is not None:
            self._inner.plan.notify_epoch(epoch)

    def _wrap_period(self) -> int | None:
        """The index sampler's wrap period: its plan's positions, wrapped as it wraps them."""
        return None if self._inner is None else self._inner.plan.wrap_period

    def _runs(self, epoch: int, total: int, start: int, world_size: int) -> list[Run]:
        key = (epoch, start, world_size)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        runs = plan_steps(
            self.schedule, epoch=epoch, total=total, start=start, world_size=world_size, drop_last=self.drop_last
        )
        self._cache = (key, runs)
        return runs

    def _check_not_empty(self, epoch: int, total: int, world_size: int) -> None:
        if not self.drop_last or total == 0:
            return
        size = self.schedule(epoch, epoch * total).batch_size
        if total < world_size * size:
            raise ValueError(
                f"batch_size schedule gives batch size {size} at the start of epoch {epoch}, so one global step "
                f"of {world_size} rank(s) needs {world_size * size} samples, but the plan has {total} and "
                "drop_last=True: every rank would get zero batches. Use a smaller batch size, drop_last=False "
                "or more data"
            )

    # -- iteration and position (the shell's dealing is per unit; here it is per step) ---------
    def __len__(self) -> int:
        """Batches this rank yields in a full pass of the upcoming epoch, equal on every rank.

        After a mid-epoch ``load_state_dict`` the resumed pass yields only the remaining steps;
        ``len`` still describes the whole epoch at the current world size.
        """
        self._sync()
        epoch = self._progress.upcoming_epoch()
        world_size = self.world.world_size
        self._check_not_empty(epoch, self._plan_size(epoch), world_size)
        return self._pass_units(epoch, 0, world_size)

    def _check_iterable(self) -> None:
        self._sync()
        epoch = self._progress.upcoming_epoch()
        self._check_not_empty(epoch, self._plan_size(epoch), self.world.world_size)
        inner = self._inner
        if inner is not None and self._inner_adaptive() is not None and inner.skipped_ids:
            raise ValueError(
                f"data is a {type(inner).__name__} with adaptive weights that skips sample ids, whose epoch shrinks "
                "as the updates reveal where they are drawn, but ScheduledBatchSampler cuts its steps from the "
                "epoch's size at its start; skip plan positions instead (skip_positions, shardwise.skip_steps), or "
                "build the mixture without those ids"
            )

    def _known_steps(self, epoch: int) -> KnownSteps | None:
        """Over a plan written at run time: how far a chunk reads (NOTE [ Steps over a plan written at run time ])."""
        if self._inner is None or self._inner_adaptive() is None:
            return None
        return KnownSteps(self._inner.plan, epoch, self._uncompacted)

    def _start_pass(self, *, restored: bool) -> tuple[LivePass, Iterator[Iterator[list[Any]]]]:
        # The shell's dealing is per unit; here it is per step (a pass of runs of equal-size steps).
        world, seed, epoch, start, total = self._begin_pass(restored=restored)
        self._check_not_empty(epoch, total, world.world_size)
        live = StepPass(start, self._runs(epoch, total, start, world.world_size), total, world.world_size)
        self._pass = live
        source = self._open_pass(epoch, seed, world, start)
        return live, iter([self._batches(live, source, world.rank, self._known_steps(epoch))])

    def _batches(
        self, live: StepPass, source: UnitSource, rank: int, known: KnownSteps | None
    ) -> Iterator[list[Any]]:
        world_size, total = live.world_size, live.total
        period = self._wrap_period()
        with_payload = self.schedule.has_payload
        checked = False
        for run in live.runs:
            size = run.batch_size
            span = world_size * size
            steps_per_chunk = max(1, _CHUNK_SAMPLES // size)
            within = np.arange(size, dtype=np.int64)
            first = 0
            while first < run.steps:
                # computed when the chunk's first batch is pulled: after the loop's last update
                stop = min(first + steps_per_chunk, run.steps)
                starts = run.first + rank * size + span * np.arange(first, stop, dtype=np.int64)  # (steps,)
                if known is not None:
                    starts = starts[: known.bound(starts)]
                # positions: (steps, size), ascending, wrapped only in a padded tail
                positions = wrap((starts[:, None] + within).ravel(), total, period)
                if known is not None:
                    positions = positions[: known.steps(positions, size) * size]
                stop = first + positions.size // size
                units = source(positions)
                if len(units) != positions.size:
                    raise RuntimeError(f"{type(self).__name__} got {len(units)} samples for {positions.size} positions")
                if not checked and not isinstance(units[0], (int, np.integer)):
                    raise TypeError(
                        f"data should be an index sampler, but {type(self.data).__name__} yields "
                        f"{type(units[0]).__name__} units; batch samplers take a batch_size schedule themselves"
                    )
                checked = True
                for step in range(stop - first):
                    live.check()  # load_state_dict stopped this pass
                    batch = units[step * size : (step + 1) * size]
                    live.done += 1
                    yield [(index, run.payload) for index in batch] if with_payload else batch
                first = stop

    # -- provenance: steps are cut from the sample plan (see shardwise.samplers.provenance) ----
    def _pass_units(self, epoch: int, start: int, world_size: int) -> int:
        """Steps each rank takes in a pass over ``epoch`` from ``start``: the plan is dealt step by step."""
        return sum(run.steps for run in self._runs(epoch, self._plan_size(epoch), start, world_size))

    def _consumed_after(self, epoch: int, start: int, world_size: int, units: int) -> int:
        """The sample position once every rank has taken ``units`` steps of a pass over ``epoch`` from ``start``."""
        total = self._plan_size(epoch)
        return StepPass(start, self._runs(epoch, total, start, world_size), total, world_size).consumed_after(units)

    def _step_positions(self, epoch: int, start: int, world: World, step: int, per_step: int,
                        drop_last: bool = False) -> np.ndarray:  # fmt: skip
        total = self._plan_size(epoch)
        return run_step_positions(self._runs(epoch, total, start, world.world_size), world.world_size, total, step,
                                  world.rank, self._wrap_period())  # fmt: skip

    def _position_steps(self, epoch: int, start: int, world_size: int, position: int, per_step: int,
                        drop_last: bool = False) -> list[tuple[int, int]]:  # fmt: skip
        total = self._plan_size(epoch)
        return run_occurrences(self._runs(epoch, total, start, world_size), world_size, total, position,
                               self._wrap_period())

    def _step_span(self, epoch: int, start: int, world_size: int, step: int, per_step: int,
                   drop_last: bool = False) -> tuple[int, int]:  # fmt: skip
        total = self._plan_size(epoch)
        run, within = run_of_step(self._runs(epoch, total, start, world_size), step)
        first = run.first + within * world_size * run.batch_size
        return first, min(first + world_size * run.batch_size, total)

    def _id_count(self) -> int | None:
        return self._inner.plan.id_count if self._inner is not None else self._size

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        if self._inner is not None:
            return self._inner.plan.positions_of(epoch, index)
        if not self.shuffle:
            return np.asarray([index], dtype=np.int64)
        return positions_of(Permutation(self._size, derive_seed(self.seed, epoch, INDEX_SHUFFLE)), np.asarray([index]))

    def _positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """The positions holding ``ids`` (``skip_ids``): the index sampler's, or the permutation inverted."""
        if self._inner is not None and self._inner_adaptive() is not None:
            raise ProvenanceUnsupported(
                f"{type(self).__name__} over a {type(self._inner).__name__} with adaptive weights cannot skip sample "
                "ids: the positions that draw them are revealed by later updates, which would shrink an epoch whose "
                "steps were cut at its start; skip plan positions instead (skip_positions, shardwise.skip_steps), "
                "or build the mixture without those ids"
            )
        if self._inner is not None:
            return self._inner.plan.positions_of_ids(epoch, ids)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self._size):
            raise ValueError(f"sample ids should be in [0, {self._size - 1}], but got ids up to {int(ids.max())}")
        if not self.shuffle:
            return np.asarray(ids, dtype=np.int64)
        return positions_of(Permutation(self._size, derive_seed(self.seed, epoch, INDEX_SHUFFLE)), ids)

    # -- what frameworks and users read --------------------------------------------------------
    @property
    def seed(self) -> int:
        """The seed in use (an index sampler's own, when ``data`` is one)."""
        if self._inner is not None:
            return self._inner.seed
        return super().seed

    @seed.setter
    def seed(self, value: int | None) -> None:
        if self._inner is not None:
            raise AttributeError(f"seed comes from the index sampler data; set it on that {type(self._inner).__name__}")
        PlanSampler.seed.fset(self, value)  # type: ignore[attr-defined]

    @property
    def batch_size(self) -> int:
        """The per-rank batch size of the next global step (frameworks read ``batch_size``)."""
        self._sync()
        epoch = self._progress.upcoming_epoch()
        consumed = 0 if self._progress.completed else self._progress.consumed
        return self.schedule(epoch, epoch * self._plan_size(epoch) + consumed).batch_size

    def steps(self, epoch: int | None = None) -> list[Step]:
        """The global steps of a whole epoch (default: the upcoming one) at the current world size.

        Every rank's batch of step ``s`` has ``steps()[s].batch_size`` samples.
        """
        self._sync()
        epoch = self._progress.upcoming_epoch() if epoch is None else check_int("epoch", epoch, minimum=0)
        total = self._plan_size(epoch)
        world_size = self.world.world_size
        self._check_not_empty(epoch, total, world_size)
        return [
            Step(run.batch_size, run.payload)
            for run in self._runs(epoch, total, 0, world_size)
            for _ in range(run.steps)
        ]

    @property
    def adaptive(self) -> AdaptiveMixture | None:
        """``data``'s adaptive weights on this sampler's clock (``record``, ``update_due``, ``update``, the ledger).

        ``None`` unless ``data`` is a ``MixtureSampler(weights=AdaptiveWeights(...))``. Report the
        updates here, not on the mixture, whose own position does not move (``AdaptiveMixture.on_clock``).
        """
        weights = self._inner_adaptive()
        return None if weights is None else weights.on_clock(self._adaptive_position)

    def _inner_adaptive(self) -> AdaptiveMixture | None:
        weights = getattr(self._inner, "adaptive", None) if self._inner is not None else None
        return weights if isinstance(weights, AdaptiveMixture) else None

    def _adaptive_position(self, epoch: int | None, consumed: int | None) -> int:
        """The run position of ``data``'s plan trained through at ``(epoch, consumed)`` (default: this sampler's)."""
        weights = self._inner_adaptive()
        if weights is None:
            raise RuntimeError(f"{type(self).__name__}.adaptive needs data with adaptive weights")
        if epoch is None or consumed is None:
            self._sync()
            epoch, consumed = self._progress.epoch, self._progress.consumed
        else:
            epoch, consumed = check_int("epoch", epoch, minimum=0), check_int("consumed", consumed, minimum=0)
        dealt = min(consumed, self._plan_size(epoch))  # past the end: padding; the epoch's end
        return weights.trained_position(epoch, int(self._uncompacted(epoch, np.asarray([dealt], dtype=np.int64))[0]))

    def state_dict(self) -> dict[str, Any]:
        """The shell's state; over a mixture with adaptive weights also its weight ledger (``state["adaptive"]``)."""
        state = super().state_dict()
        weights = self._inner_adaptive()
        if weights is not None:
            state[ADAPTIVE] = weights.ledger.to_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()`` output in O(schedule segments), at any world size.

        Over a mixture with adaptive weights the state's ledger goes to that mixture (its plan is
        rebuilt from it: NOTE [ Resuming an adaptive mixture ] in docs/mixture.md).

        Raises:
            StateMismatchError: the state belongs to another configuration (names the field).
            MalformedStateError: the dict is not a shardwise state of a known version.
        """
        inner = self._inner
        adaptive = inner is not None and self._inner_adaptive() is not None
        if adaptive and (not isinstance(state_dict, dict) or ADAPTIVE not in state_dict):
            raise MalformedStateError(
                f"state should hold 'adaptive' (the weight ledger) for a {type(self).__name__} over a mixture with "
                f"adaptive weights; save this {type(self).__name__}'s state_dict()"
            )
        super().load_state_dict(state_dict)
        if inner is not None and adaptive:
            mixture = inner.state_dict()  # its own position (unused here) with the saved ledger
            mixture[ADAPTIVE] = state_dict[ADAPTIVE]
            inner.load_state_dict(mixture)

    def _adopt_seed(self, seed: int) -> None:
        super()._adopt_seed(seed)
        inner = self._inner
        if inner is not None:
            inner.plan.adopt_seed(seed)  # the index sampler's plan is batched with its own seed

    def _fingerprint(self) -> Fingerprint:
        # The schedule is left out on purpose: consumed counts samples, so a state resumes
        # under a changed schedule too (the new sizes apply from the saved position).
        if self._inner is not None:
            return {"data": self._inner.plan.fingerprint()}
        return with_data({"num_samples": self._size, "shuffle": self.shuffle}, self.data)

    def _config(self) -> dict[str, Any]:
        return {"batch_size": self.schedule, "shuffle": self.shuffle, "drop_last": self.drop_last}

    def describe(self) -> dict[str, Any]:
        """What this sampler is doing and with which seed: log it once per run to reproduce it."""
        info = super().describe()
        info["batch_size"] = repr(self.schedule)
        return info

    def _data_repr(self) -> str:
        if self._inner is not None:
            return f"data={type(self._inner).__name__}"
        return f"n={self._size}"
