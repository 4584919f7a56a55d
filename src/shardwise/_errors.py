"""Argument checks with one message template, shared by every layer.

Every bad argument fails at construction with a message that names the parameter, the value
received and what would be accepted (DESIGN.md section 6).
"""

from __future__ import annotations

import enum
import numbers
from typing import TypeVar

E = TypeVar("E", bound=enum.Enum)


class StateMismatchError(ValueError):
    """A saved state does not belong to this sampler (other data size, seed or kind)."""


class MalformedStateError(ValueError):
    """A saved state is not a shardwise state of a version this release can read."""


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an ``int`` or raise naming ``name``.

    ``bool`` is rejected although it subclasses ``int``: ``num_replicas=True`` is a bug, not 1.
    numpy integers are accepted (``len(np.arange(3))`` style values reach us often).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} should be an integer, but got {name}={value!r} ({type(value).__name__})")
    result = int(value)
    if minimum is not None and result < minimum:
        if minimum == 0:
            wanted = "a non-negative integer"
        elif minimum == 1:
            wanted = "a positive integer"
        else:
            wanted = f"an integer >= {minimum}"
        raise ValueError(f"{name} should be {wanted}, but got {name}={value!r}")
    if maximum is not None and result > maximum:
        raise ValueError(f"{name} should be an integer <= {maximum}, but got {name}={value!r}")
    return result


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool`` or raise naming ``name`` (no truthy strings or ints)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} should be True or False, but got {name}={value!r}")
    return value


def check_choice(name: str, value: object, choices: type[E]) -> E:
    """Return the member of ``choices`` that ``value`` names, or raise listing every option."""
    if isinstance(value, choices):
        return value
    for member in choices:
        if value == member.value:
            return member
    accepted = ", ".join(repr(member.value) for member in choices)
    raise ValueError(f"{name} should be one of {accepted}, but got {name}={value!r}")
