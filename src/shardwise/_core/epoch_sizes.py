"""Per-epoch size schedules: the sizes of a batch sampler that builds its own plan, one value an epoch.

Batch samplers whose batch plan must not depend on the world size (bucketing, class-balanced,
two-stream) take a new size at epoch starts only. :class:`EpochSizes` holds their size arguments
(ints or :class:`~shardwise._core.schedule.BatchSizeSchedule`), refuses a schedule that changes
inside an epoch (:func:`check_per_epoch`) and answers the size of each epoch.
"""

from __future__ import annotations

from typing import TypeVar

from .schedule import CALLABLE, CONSTANT, BatchSizeSchedule, Step
from .thresholds import BY_EPOCH

_Default = TypeVar("_Default", bound=int | None)


def check_per_epoch(schedule: BatchSizeSchedule, name: str, epoch_size: int, owner: str) -> None:
    """Refuse a schedule that can change inside an epoch of ``epoch_size`` samples.

    Batch samplers that build their own batch plan (a plan that must not depend on the world
    size) take a new size at epoch starts only: constant and ``by_epoch`` schedules, and
    ``by_samples``/``ramp`` schedules whose every change falls on an epoch start.

    Raises:
        ValueError: naming the parameter and pointing to ``by_epoch`` and ``ScheduledBatchSampler``.
    """
    kind = schedule.kind
    if kind in (CONSTANT, BY_EPOCH):
        return
    if kind != CALLABLE and epoch_size > 0 and all(t % epoch_size == 0 for t in schedule.thresholds):
        return
    where = "a function can change at any step" if kind == CALLABLE else (
        f"its changes at samples {list(schedule.thresholds[1:])} do not all fall on an epoch start "
        f"(multiples of {epoch_size})"
    )  # fmt: skip
    raise ValueError(
        f"{owner} changes {name} at epoch starts only (its batch plan does not depend on the world size), but "
        f"{name}={schedule!r}: {where}. Use BatchSizeSchedule.by_epoch(...), or ScheduledBatchSampler for "
        "changes inside an epoch"
    )


def epoch_value(schedule: BatchSizeSchedule, epoch: int, epoch_size: int) -> Step:
    """The value of a per-epoch schedule for ``epoch`` (at its first sample, ``epoch * epoch_size``)."""
    return schedule(epoch, epoch * epoch_size)


class EpochSizes:
    """Size arguments of a batch sampler with its own plan, each an int or a per-epoch schedule.

    Such a sampler reads ``at(name, epoch, default)`` where it reads a size, and adds
    ``fingerprint()`` to its own (empty when nothing is scheduled, so existing states still load).

    Args:
        owner: the sampler's name, for messages.
        epoch_size: samples one epoch consumes (what a ``by_samples`` threshold counts).
        **values: each size argument as given (ints pass through untouched).

    Raises:
        ValueError: a schedule that changes inside an epoch, or one that carries payloads.
    """

    __slots__ = ("_epoch_size", "_schedules")

    def __init__(self, owner: str, epoch_size: int, **values: object) -> None:
        self._epoch_size = epoch_size
        self._schedules: dict[str, BatchSizeSchedule] = {}
        for name, value in values.items():
            if not isinstance(value, BatchSizeSchedule):
                continue
            check_per_epoch(value, name, epoch_size, owner)
            if value.has_payload:
                raise ValueError(
                    f"{owner} takes no payloads, but {name}={value!r} carries some; give bare sizes, or use "
                    "ScheduledBatchSampler, which yields (index, payload) pairs"
                )
            self._schedules[name] = value

    def __bool__(self) -> bool:
        return bool(self._schedules)

    def initial(self, name: str, value: object) -> object:
        """``value`` itself, or the epoch-0 value of a schedule (for the plain attribute and checks)."""
        schedule = self._schedules.get(name)
        return value if schedule is None else epoch_value(schedule, 0, self._epoch_size).batch_size

    def at(self, name: str, epoch: int, default: _Default) -> int | _Default:
        """The size ``name`` takes in ``epoch``; ``default`` when it is not scheduled."""
        schedule = self._schedules.get(name)
        return default if schedule is None else epoch_value(schedule, epoch, self._epoch_size).batch_size

    def epochs(self) -> list[int]:
        """Every epoch where a scheduled size can change (0 included): what validation must visit."""
        found = {0}
        for schedule in self._schedules.values():
            found.update(schedule.epoch_starts_to_check(self._epoch_size) or [])
        return sorted(found)

    def fingerprint(self) -> dict[str, str]:
        """``{"<name>_schedule": repr}`` for each scheduled size."""
        return {f"{name}_schedule": repr(schedule) for name, schedule in self._schedules.items()}
