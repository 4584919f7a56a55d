"""Batch-size schedules: the batch size (and an optional payload) as a pure function of plan position.

A schedule answers one question: at epoch ``e``, with ``samples`` samples of the run already
handed out by all ranks together, what is the per-rank batch size of the next global step (and
its payload, e.g. an image size)? ``samples`` counts positions of the global sample plans,
``e * n + p`` at position ``p`` of epoch ``e`` when every epoch plans ``n`` samples: a dropped or
padded tail counts as the ``n`` samples the plan holds, so the value never depends on the world
size, and a schedule is the same on every rank.

:func:`plan_steps` turns a schedule into the global steps of one epoch for a world size ``W``:
step ``s`` starts at plan position ``p_s``, has per-rank size ``b_s`` (the schedule's value at
``p_s``) and covers the ``W * b_s`` plan positions ``[p_s, p_s + W * b_s)``; rank ``r`` takes the
slice ``[p_s + r * b_s, p_s + (r + 1) * b_s)``. Every rank's batch of a step has the same size;
a new size takes effect at the first step that starts at or after the position where the schedule
changes. Steps are computed segment by segment (a segment is a stretch where the schedule is
constant), so an epoch costs O(segments), except for arbitrary callables (O(steps)).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import check_callable, check_int
from .public import public
from .thresholds import BY_EPOCH, Stepwise, read_thresholds


class Step(NamedTuple):
    """The per-rank batch size of one global step and its payload (``None`` without payloads)."""

    batch_size: int
    payload: Any


@dataclass(frozen=True)
class Run:
    """``steps`` consecutive global steps of one size, the first starting at plan position ``first``."""

    first: int
    batch_size: int
    steps: int
    payload: Any

    def end(self, world_size: int) -> int:
        """The plan position just past this run's last step."""
        return self.first + self.steps * world_size * self.batch_size


CONSTANT, BY_SAMPLES, RAMP, CALLABLE = "constant", "by_samples", "ramp", "callable"
"""Kinds of :class:`BatchSizeSchedule` (with ``thresholds.BY_EPOCH``)."""
_NO_PAYLOAD = object()


def _split_value(name: str, value: object) -> tuple[int, Any]:
    """``value`` as ``(size, payload)``; a bare size gets the ``_NO_PAYLOAD`` marker."""
    if isinstance(value, tuple):
        if len(value) != 2:
            raise TypeError(
                f"{name} should be a positive int or a (batch_size, payload) pair, but got {name}={value!r}"
            )
        return check_int(name, value[0], minimum=1), value[1]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} should be a positive int or a (batch_size, payload) pair, "
            f"but got {name}={value!r} ({type(value).__name__})"
        )
    return check_int(name, value, minimum=1), _NO_PAYLOAD


def _read_points(name: str, points: object, unit: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Any, ...]]:
    """Validate ``{threshold: size or (size, payload)}`` (see :func:`~shardwise._core.thresholds.read_thresholds`)."""
    thresholds, values = read_thresholds(name, points, unit, "batch_size", _split_value)
    with_payload = [payload is not _NO_PAYLOAD for _, payload in values]
    if any(with_payload) and not all(with_payload):
        raise ValueError(f"{name} should give a payload for every entry or for none, but got {name}={points!r}")
    sizes = tuple(size for size, _ in values)
    return thresholds, sizes, tuple(None if payload is _NO_PAYLOAD else payload for _, payload in values)


class BatchSizeSchedule(Stepwise):
    """The per-rank batch size, and optionally a payload, as a function of the plan position.

    Build one with a constructor: :meth:`constant`, :meth:`by_epoch`, :meth:`by_samples`,
    :meth:`ramp`, or ``BatchSizeSchedule(function)`` for any ``function(epoch, samples)``.
    Sizes are **per rank** (what each rank's DataLoader yields per step); a global step holds
    ``world_size`` times as many samples. ``samples`` is counted over all ranks together, in
    positions of the global sample plans: epoch ``e`` starts at ``e * n`` for ``n`` samples per
    epoch, whatever was padded or dropped, so a schedule never depends on the world size.

    A payload travels with every step: give each entry as ``(batch_size, payload)``, for instance
    ``{0: (256, {"size": 128}), 10: (128, {"size": 224})}``; a scheduled sampler then yields
    ``(index, payload)`` pairs so that the dataset (in DataLoader workers) sees the payload.

    Example:
        >>> schedule = BatchSizeSchedule.by_samples({0: 32, 50_000: 64})
        >>> schedule(0, 49_999), schedule(0, 50_000)
        (Step(batch_size=32, payload=None), Step(batch_size=64, payload=None))
        >>> BatchSizeSchedule.ramp(start=32, end=256, increment=32, over_samples=700)(0, 100).batch_size
        64
        >>> BatchSizeSchedule.by_epoch({0: (8, 128), 2: (4, 224)})(3, 0)
        Step(batch_size=4, payload=224)
    """

    __slots__ = ("_function", "_has_payload", "_increment", "_kind", "_name", "_payloads", "_sizes", "_thresholds")

    _kind: str
    _thresholds: tuple[int, ...]
    _sizes: tuple[int, ...]
    _payloads: tuple[Any, ...]
    _increment: int
    _function: Callable[[int, int], object] | None
    _has_payload: bool | None
    _name: str

    def __init__(self, function: Callable[[int, int], object]) -> None:
        """A schedule given by ``function(epoch, samples)``, returning a size or ``(size, payload)``.

        The function must be pure (the same value for the same arguments, on every rank). Its
        return type is checked every time it is called; the first call decides whether the
        schedule carries payloads, and later calls must agree.
        """
        self._init_function(function, "function")

    def _init_function(self, function: object, name: str) -> None:
        """Check ``function`` (named ``name`` in messages): two positional arguments, a good value at (0, 0).

        A schedule is pure, so calling it once here costs nothing and turns a bad return value
        into an error at construction instead of at the first batch.
        """
        if isinstance(function, BatchSizeSchedule):
            raise TypeError(f"{name} should be a callable (epoch, samples) -> batch_size, but got {name}={function!r}")
        self._setup(CALLABLE, (0,), (1,), (None,), has_payload=None)
        self._function = check_callable(name, function, arguments=("epoch", "samples"), returns="batch_size")
        self._name = name
        self._evaluate(0, 0)

    def _setup(self, kind: str, thresholds: tuple[int, ...], sizes: tuple[int, ...], payloads: tuple[Any, ...],
               *, has_payload: bool | None, increment: int = 0) -> None:  # fmt: skip
        self._kind, self._thresholds, self._sizes, self._payloads = kind, thresholds, sizes, payloads
        self._increment, self._function, self._has_payload = increment, None, has_payload
        self._name = "batch_size"

    @classmethod
    def _build(cls, kind: str, thresholds: tuple[int, ...], sizes: tuple[int, ...], payloads: tuple[Any, ...],
               *, has_payload: bool, increment: int = 0) -> BatchSizeSchedule:  # fmt: skip
        schedule = cls.__new__(cls)
        schedule._setup(kind, thresholds, sizes, payloads, has_payload=has_payload, increment=increment)
        return schedule

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def constant(cls, batch_size: int, payload: Any = None) -> BatchSizeSchedule:
        """One size for the whole run (what a plain ``batch_size=int`` means); ``payload`` opts in."""
        size = check_int("batch_size", batch_size, minimum=1)
        return cls._build(CONSTANT, (0,), (size,), (payload,), has_payload=payload is not None)

    @classmethod
    def by_epoch(cls, sizes: Mapping[int, int | tuple[int, Any]]) -> BatchSizeSchedule:
        """``{first epoch: size}``, e.g. ``{0: 256, 10: 128, 20: 64}``; values may be ``(size, payload)``."""
        thresholds, values, payloads = _read_points("sizes", sizes, "epoch")
        has_payload = _has_payload(sizes)
        return cls._build(BY_EPOCH, thresholds, values, payloads, has_payload=has_payload)

    @classmethod
    def by_samples(cls, sizes: Mapping[int, int | tuple[int, Any]]) -> BatchSizeSchedule:
        """``{samples consumed (all ranks together, over the run): size}``, e.g. ``{0: 32, 50_000: 64}``.

        A change takes effect at the first global step that starts at or after its threshold,
        mid-epoch if the threshold falls there.
        """
        thresholds, values, payloads = _read_points("sizes", sizes, "samples")
        return cls._build(BY_SAMPLES, thresholds, values, payloads, has_payload=_has_payload(sizes))

    @classmethod
    def ramp(cls, *, start: int, end: int, increment: int, over_samples: int) -> BatchSizeSchedule:
        """Megatron-style ramp-up: ``start``, then ``+increment`` in equal steps, reaching ``end``.

        With ``k = (end - start) // increment`` increments, the size after ``samples`` consumed
        samples is ``start + increment * (samples * k // over_samples)``, and ``end`` from
        ``over_samples`` on: each size is used for ``over_samples / k`` samples. As in Megatron-LM,
        ``end - start`` must be a multiple of ``increment``. Sizes are per rank here.
        """
        start = check_int("start", start, minimum=1)
        end = check_int("end", end, minimum=1)
        increment = check_int("increment", increment, minimum=1)
        over_samples = check_int("over_samples", over_samples, minimum=0)
        if end < start:
            raise ValueError(f"end should be >= start={start}, but got end={end}")
        if (end - start) % increment:
            raise ValueError(
                f"end - start should be a multiple of increment={increment}, but got start={start}, end={end}"
            )
        count = (end - start) // increment
        if count == 0 or over_samples == 0:
            return cls._build(CONSTANT, (0,), (end,), (None,), has_payload=False)
        # Threshold of level j: the least s with s * count // over_samples >= j.
        thresholds = tuple(-(-j * over_samples // count) for j in range(count + 1))
        sizes = tuple(start + j * increment for j in range(count + 1))
        return cls._build(RAMP, thresholds, sizes, (None,) * (count + 1), has_payload=False, increment=increment)

    # -- evaluation ----------------------------------------------------------------------------
    @property
    def has_payload(self) -> bool:
        """Whether steps carry a payload (for a function: decided by its first call)."""
        return bool(self._has_payload)

    @property
    def is_callable(self) -> bool:
        """Whether the schedule is an arbitrary function (evaluated step by step)."""
        return self._kind == CALLABLE

    def __call__(self, epoch: int, samples: int) -> Step:
        """The step size and payload at ``epoch`` after ``samples`` samples of the run."""
        size, payload, _ = self.segment(epoch, samples)
        return Step(size, payload)

    def segment(self, epoch: int, samples: int) -> tuple[int, Any, int | None]:
        """``(size, payload, until)``: the value now and the sample count from which it may change.

        ``until`` is ``None`` when the value holds for the rest of the epoch (and beyond it for
        sample-based schedules).

        Raises:
            TypeError: ``epoch`` or ``samples`` is not an integer (a float or bool).
            ValueError: ``epoch`` or ``samples`` is negative.
        """
        epoch, samples = check_int("epoch", epoch, minimum=0), check_int("samples", samples, minimum=0)
        kind = self._kind
        if kind == CALLABLE:
            return (*self._evaluate(epoch, samples), samples + 1)
        if kind == CONSTANT:
            return self._sizes[0], self._payloads[0], None
        level = self.level_at(epoch, samples)
        if kind == BY_EPOCH:
            return self._sizes[level], self._payloads[level], None
        until = self._thresholds[level + 1] if level + 1 < len(self._thresholds) else None
        return self._sizes[level], self._payloads[level], until

    def _evaluate(self, epoch: int, samples: int) -> tuple[int, Any]:
        if self._function is None:
            raise RuntimeError("a callable schedule lost its function")
        value = self._function(epoch, samples)
        where = f"at epoch={epoch}, samples={samples}"
        name = getattr(self._function, "__qualname__", repr(self._function))
        pair = isinstance(value, tuple)
        if self._has_payload is not None and pair != self._has_payload:
            shape = "(batch_size, payload) pairs" if self._has_payload else "bare batch sizes"
            raise TypeError(
                f"{self._name} schedule {name} returned {value!r} {where}, but it returned {shape} before; "
                "return the same shape every time"
            )
        try:
            size, payload = _split_value("batch_size", value)
        except (TypeError, ValueError) as error:
            raise type(error)(
                f"{self._name} schedule {name} returned {value!r} ({type(value).__name__}) {where}; it should "
                "return a positive int, or a (positive int, payload) pair"
            ) from None
        self._has_payload = pair
        return size, (payload if pair else None)

    # -- what validation needs -----------------------------------------------------------------
    def epoch_starts_to_check(self, epoch_size: int) -> list[int] | None:
        """The epochs whose first step can differ from an earlier epoch's (``None``: not known)."""
        if self._kind == CALLABLE:
            return None
        if self._kind == BY_EPOCH:
            return list(self._thresholds)
        if epoch_size == 0:
            return [0]
        return sorted({0, *(-(-t // epoch_size) for t in self._thresholds)})

    def fingerprint(self) -> dict[str, Any]:
        """Plain values describing the schedule (for ``describe()``; not part of the resume state)."""
        if self._kind == CALLABLE:
            return {"kind": CALLABLE, "function": getattr(self._function, "__qualname__", repr(self._function))}
        return {"kind": self._kind, "thresholds": list(self._thresholds), "sizes": list(self._sizes)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchSizeSchedule):
            return NotImplemented
        if CALLABLE in (self._kind, other._kind):
            return self is other or (self._kind == other._kind and self._function is other._function)
        return (self._kind, self._thresholds, self._sizes, self._payloads) == (
            other._kind,
            other._thresholds,
            other._sizes,
            other._payloads,
        )

    def __hash__(self) -> int:
        return hash((self._kind, self._thresholds, self._sizes))

    def __repr__(self) -> str:
        if self._kind == CALLABLE:
            return f"BatchSizeSchedule({getattr(self._function, '__qualname__', repr(self._function))})"
        if self._kind == CONSTANT:
            payload = f", payload={self._payloads[0]!r}" if self._has_payload else ""
            return f"BatchSizeSchedule.constant({self._sizes[0]}{payload})"
        if self._kind == RAMP:
            # The last level starts at ceil(count * over_samples / count) == over_samples.
            over = self._thresholds[-1]
            return (
                f"BatchSizeSchedule.ramp(start={self._sizes[0]}, end={self._sizes[-1]}, "
                f"increment={self._increment}, over_samples={over})"
            )
        points = {
            t: (s, p) if self._has_payload else s
            for t, s, p in zip(self._thresholds, self._sizes, self._payloads, strict=True)
        }
        return f"BatchSizeSchedule.{self._kind}({points!r})"


def _has_payload(points: Mapping[int, object]) -> bool:
    return any(isinstance(value, tuple) for value in points.values())


ScheduleLike = BatchSizeSchedule | int | Callable[[int, int], object]


def as_schedule(batch_size: object, name: str = "batch_size") -> BatchSizeSchedule:
    """A ``BatchSizeSchedule`` from what users pass as ``batch_size``: an int, a schedule, a callable."""
    if isinstance(batch_size, BatchSizeSchedule):
        return batch_size
    if isinstance(batch_size, numbers.Integral):  # check_int refuses bool
        return BatchSizeSchedule.constant(check_int(name, batch_size, minimum=1))
    if callable(batch_size):
        schedule = BatchSizeSchedule.__new__(BatchSizeSchedule)
        schedule._init_function(batch_size, name)
        return schedule
    raise TypeError(
        f"{name} should be a positive int, a BatchSizeSchedule or a callable (epoch, samples) -> int, "
        f"but got {name}={batch_size!r} ({type(batch_size).__name__})"
    )


def plan_steps(
    schedule: BatchSizeSchedule,
    *,
    epoch: int,
    total: int,
    start: int,
    world_size: int,
    drop_last: bool,
) -> list[Run]:
    """The global steps of ``epoch`` from plan position ``start`` on, as runs of equal-size steps.

    A plan of ``total`` samples; epoch ``epoch`` begins at run-wide sample ``epoch * total``.
    The last step, if fewer than ``W * b`` samples remain, is dropped (``drop_last``) or cut to
    per-rank size ``ceil(remaining / W)``, its positions past the plan wrapping back into it
    (``_core.plan.wrap``, at most ``W - 1`` repeats), so every rank's batch of every step has the same size.
    """
    runs: list[Run] = []
    base = epoch * total
    position = start
    while position < total:
        size, payload, until = schedule.segment(epoch, base + position)
        span = world_size * size
        limit = total if until is None else min(max(until - base, position + 1), total)
        steps = -(-(limit - position) // span)
        end = position + steps * span
        if end <= total:
            runs.append(Run(position, size, steps, payload))
            position = end
            continue
        if steps > 1:
            runs.append(Run(position, size, steps - 1, payload))
        last = position + (steps - 1) * span
        if not drop_last:
            runs.append(Run(last, -(-(total - last) // world_size), 1, payload))
        break
    return runs


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(BatchSizeSchedule)
