"""Step functions of the epoch or of the samples consumed: ``{threshold: value}``, read and looked up.

A schedule (a batch-size schedule, a weight schedule) is a mapping from thresholds to values: the
value of the last threshold at or below the current epoch (or sample count) holds. Thresholds
start at 0 and increase strictly, in the order given. :func:`read_thresholds` validates such a
mapping once, at construction, with one wording for every schedule; :func:`last_at_or_below`
finds the entry in effect in O(log entries); :class:`Stepwise` is what both schedules share.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from .errors import check_int

_Value = TypeVar("_Value")

BY_EPOCH = "by_epoch"
"""The kind of a schedule whose thresholds count epochs (every other kind counts samples consumed)."""


def read_thresholds(
    name: str, points: object, unit: str, what: str, read_value: Callable[[str, object], _Value]
) -> tuple[tuple[int, ...], tuple[_Value, ...]]:
    """Validate ``{threshold: value}``: integer thresholds from 0, strictly increasing, in the order given.

    Args:
        name: the parameter, for messages (``"sizes"``, ``"weights"``).
        points: what the user passed.
        unit: what a threshold counts (``"epoch"`` or ``"samples"``).
        what: what a value is (``"batch_size"``, ``"weights"``), for messages.
        read_value: validates one value, given its name in messages (``"sizes[10]"``) and the value.

    Returns:
        ``(thresholds, values)``, in the order given.

    Raises:
        TypeError: ``points`` is not a non-empty mapping, or a threshold is not an integer.
        ValueError: a negative threshold, thresholds out of order, or a first threshold other than 0.

    Example:
        >>> read_thresholds("sizes", {0: 8, 10: 4}, "samples", "batch_size", lambda name, value: value)
        ((0, 10), (8, 4))
    """
    if not isinstance(points, Mapping) or not points:
        raise TypeError(
            f"{name} should be a non-empty mapping {{{unit}: {what}}} starting at 0, but got {name}={points!r}"
        )
    thresholds: list[int] = []
    values: list[_Value] = []
    for key, value in points.items():
        threshold = check_int(f"{name} key", key, minimum=0)
        if thresholds and threshold <= thresholds[-1]:
            raise ValueError(
                f"{name} thresholds should be strictly increasing, but got {threshold} after {thresholds[-1]} "
                f"in {name}={dict(points)!r}; list the entries in order"
            )
        values.append(read_value(f"{name}[{threshold}]", value))
        thresholds.append(threshold)
    if thresholds[0] != 0:
        raise ValueError(
            f"{name} should start at {unit} 0 (the {what} before the first change), but its first key is "
            f"{thresholds[0]} in {name}={dict(points)!r}"
        )
    return tuple(thresholds), tuple(values)


def last_at_or_below(thresholds: Sequence[int], value: int) -> int:
    """Index of the last threshold ``<= value`` (``thresholds`` increasing, ``thresholds[0] == 0 <= value``)."""
    return bisect.bisect_right(thresholds, value) - 1


class Stepwise:
    """A schedule whose value is a step function of the epoch or of the samples consumed.

    Subclasses (``WeightSchedule``, ``BatchSizeSchedule``) set ``_kind``, the name of the
    constructor that built them, and ``_thresholds``, where each value starts.
    """

    __slots__ = ()

    _kind: str
    _thresholds: tuple[int, ...]

    @property
    def kind(self) -> str:
        """The constructor that built the schedule: ``"constant"``, ``"by_epoch"``, ``"by_samples"``, ..."""
        return self._kind

    @property
    def thresholds(self) -> tuple[int, ...]:
        """Where each value starts, from 0: epochs for ``by_epoch``, samples consumed otherwise."""
        return self._thresholds

    def level_at(self, epoch: int, samples: int) -> int:
        """Which value is in effect at ``epoch`` with ``samples`` consumed over the run (both checked already)."""
        return last_at_or_below(self._thresholds, epoch if self._kind == BY_EPOCH else samples)
