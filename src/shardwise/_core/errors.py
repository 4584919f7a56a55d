"""Argument checks with one message template, shared by every layer.

Every bad argument fails at construction with a message that names the parameter, the value
received and what would be accepted (README.md's promise; docs/design.md states the contract).
"""

from __future__ import annotations

import enum
import inspect
import math
import numbers
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .public import public

E = TypeVar("E", bound=enum.Enum)


class StateMismatchError(ValueError):
    """A saved state does not belong to this sampler (other data size, seed or kind)."""


class MalformedStateError(ValueError):
    """A saved state is not a shardwise state of a version this release can read."""


INT_LIMIT = 2**62
"""The largest integer ``check_int`` takes unless given another ``maximum``: counts, sizes, epochs
and positions are int64 in the core, with room for the sums and products of plan arithmetic (a
larger value would fail later, deep inside numpy or torch, with an ``OverflowError``)."""


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an ``int`` or raise naming ``name``.

    ``bool`` is rejected although it subclasses ``int``: ``num_replicas=True`` is a bug, not 1.
    numpy integers are accepted (``len(np.arange(3))`` style values reach us often). Without a
    ``maximum``, values above :data:`INT_LIMIT` (``2**62``) are refused (seeds pass their own).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} should be an integer, but got {name}={value!r} ({type(value).__name__})")
    result = int(value)
    if maximum is None and result > INT_LIMIT:
        raise ValueError(
            f"{name} should be an integer <= 2**62 (counts, sizes and positions are 64-bit), but got {name}={value!r}"
        )
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


def shown(name: str, value: object) -> str:
    """``name=value`` for a parameter name, or just the value for a phrase such as ``sample 3``."""
    return f"{name}={value!r}" if name.isidentifier() else repr(value)


def check_number(name: str, value: object, *, allow_bool: bool = False) -> int | float | complex:
    """Return ``value`` if it is a real or complex number, or raise naming ``name``; ``bool`` only if allowed."""
    if (isinstance(value, bool) and not allow_bool) or not isinstance(value, numbers.Number):
        raise TypeError(
            f"{name} should be a number, but got {shown(name, value)} ({type(value).__name__})"
        )
    return value  # type: ignore[return-value]


def check_seconds(name: str, value: object, *, allow_zero: bool = True) -> float:
    """``value`` as finite seconds (``>= 0``, or ``> 0`` without ``allow_zero``), or raise naming ``name``."""
    check_number(name, value)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        accepted = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} should be {accepted} number of seconds (finite), but got {shown(name, value)}")
    return float(value)


def check_path(name: str, value: object) -> str:
    """``value`` as a ``str`` path (``str`` or ``os.PathLike``), or raise naming ``name``."""
    path = value
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
    if not isinstance(path, str) or not path:
        raise TypeError(
            f"{name} should be a non-empty path (str or os.PathLike), but got {shown(name, value)} "
            f"({type(value).__name__})"
        )
    return path


def check_cache_dir(
    value: object, *, file_error: type[ValueError] = ValueError, name: str = "cache_dir"
) -> str | bool | None:
    """``cache_dir`` (or ``name``) checked at construction: ``None``, ``False``, or a path that is not a file.

    The index cache itself checks ``cache_dir`` only when it builds or opens an entry, which a
    small input may never do; every sampler that takes ``cache_dir`` calls this first, so that a
    wrong type or a file fails at the call that takes it. A path is returned as a ``str``
    (``os.fspath``, not expanded); ``file_error`` is the ``ValueError`` subclass to raise for a
    file (the index layer's ``IndexCacheError``).
    """
    accepted = "None (the default directory), False (no cache) or a directory path (str or os.PathLike)"
    if value is None or value is False:
        return value
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str) or not path:
        raise TypeError(f"{name} should be {accepted}, but got {name}={value!r} ({type(value).__name__})")
    if os.path.isfile(os.path.expanduser(path)):
        raise file_error(
            f"{name} should be a directory, but {path!r} is a file; pass another {name}, "
            f"or {name}=False to build the index in memory"
        )
    return path


def check_iterable(name: str, value: object, *, of: str) -> Iterable[Any]:
    """Return ``value`` if it can be iterated (and is not a ``str``/``bytes``), or raise naming ``name``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} should be an iterable of {of}, but got {shown(name, value)} ({type(value).__name__})")
    return value


def check_callable(name: str, value: object, *, arguments: tuple[str, ...], returns: str) -> Callable[..., Any]:
    """Return ``value`` if it is callable with ``len(arguments)`` positional arguments, or raise naming ``name``.

    The signature is checked without calling; a callable whose signature Python cannot read
    (some builtins) is accepted as is.
    """
    wanted = f"a callable ({', '.join(arguments)}) -> {returns}"
    if not callable(value):
        raise TypeError(f"{name} should be {wanted}, but got {shown(name, value)} ({type(value).__name__})")
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return value
    try:
        signature.bind(*arguments)
    except TypeError as error:
        raise TypeError(
            f"{name} should be {wanted}, taking {len(arguments)} positional arguments, but got "
            f"{shown(name, value)} with signature {signature} ({error})"
        ) from None
    return value


def check_instance_or_factory(
    name: str, value: object, *, kind: type, described: str, arguments: tuple[str, ...]
) -> object:
    """``value`` if it is a ``kind`` or a callable of ``arguments`` that builds one, else raise naming ``name``.

    A class (or a ``functools.partial`` of one) is a factory only if it subclasses ``kind`` and its
    constructor takes ``arguments``: passing ``ShardedSampler`` where ``ShardedSampler(data)`` is
    meant is the usual slip. The signature is checked without calling; one Python cannot read
    (some builtins) is accepted.
    """
    import functools

    wanted = f"{described} instance, or a callable ({', '.join(arguments)}) -> {described}"
    if isinstance(value, kind):
        return value
    if not callable(value):
        raise TypeError(f"{name} should be {wanted}, but got {shown(name, value)} ({type(value).__name__})")
    target: Callable[..., Any] = value
    given: tuple[Any, ...] = ()  # a partial's own arguments come first
    keywords: dict[str, Any] = {}
    if isinstance(value, functools.partial):
        target, given, keywords = value.func, value.args, value.keywords
    cls = target if isinstance(target, type) else None
    got = f"the class {cls.__name__}" if cls is not None and target is value else shown(name, value)
    if cls is not None and not issubclass(cls, kind):
        raise TypeError(f"{name} should be {wanted}, but got {got}, which does not build {described}")
    try:
        # A class's own signature can be its metaclass's __call__(*args, **kwargs); its __init__ is the real one.
        signature = inspect.signature(target if cls is None else cls.__init__)
    except (TypeError, ValueError):
        return value
    parameters = list(signature.parameters.values())[0 if cls is None else 1 :]  # a class: drop self
    try:
        signature.replace(parameters=parameters).bind(*given, *arguments, **keywords)
        # A class is built positionally: ShardedSampler(dataset, num_replicas, ...) binds (train_dataset, args), but
        # would read args as num_replicas. A class is a factory only if its later positions are named as they mean.
        named = [p.name for p in parameters[len(given) + 1 : len(given) + len(arguments)]]
        if cls is not None and named != list(arguments[1:]):
            raise TypeError
    except TypeError:
        bare = inspect.Signature([parameter.replace(annotation=inspect.Parameter.empty) for parameter in parameters])
        fix = f"; pass an instance instead: {name}={cls.__name__}(...)" if cls is not None else ""
        raise TypeError(
            f"{name} should be {wanted}, but got {got} with signature {bare}, which does not take the "
            f"{len(arguments)} positional arguments ({', '.join(arguments)}){fix}"
        ) from None
    return value


def check_str(name: str, value: object, *, allow_empty: bool = False) -> str:
    """Return ``value`` if it is a ``str`` (non-empty unless ``allow_empty``), or raise naming ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} should be a str, but got {shown(name, value)} ({type(value).__name__})")
    if not value and not allow_empty:
        raise ValueError(f"{name} should be a non-empty str, but got {name}=''")
    return value


def check_integer_array(name: str, values: object, *, ndim: int = 1) -> Any:
    """``values`` as an integer numpy array of ``ndim`` dimensions (as is if it is one), or raise naming ``name``."""
    import numpy as np  # _core is numpy-only; imported here to keep this module light

    array = np.asarray(values) if not isinstance(values, np.ndarray) else values
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(
            f"{name} should be an array of integers, but got {shown(name, values) if array.size < 8 else name} "
            f"of dtype {array.dtype} ({type(values).__name__})"
        )
    if array.ndim != ndim:
        raise ValueError(f"{name} should be a {ndim}-D array of integers, but got {name} with shape {array.shape}")
    return array


def check_sample_id(name: str, value: object, count: int, *, owner: str) -> int:
    """``value`` as a sample id of ``owner``, one of ``0 .. count - 1``, or raise naming ``name`` and the range.

    The one rule of every query that takes a sample id (``when``, ``skip_ids``): an id the sampler
    cannot draw is an error, never an empty answer and never an answer about another sample.
    """
    index = check_int(name, value)
    if not 0 <= index < count:
        accepted = f"in [0, {count - 1}] ({owner} draws from {count} sample ids)" if count else f"({owner} has none)"
        raise ValueError(f"{name} should be a sample id {accepted}, but got {shown(name, value)}")
    return index


def check_ranges(name: str, values: object) -> Any:
    """``values`` as a ``(k, 2)`` int64 array of ``[first, stop)`` rows (``k`` may be 0), or raise naming ``name``.

    The shape and type are checked here; what the numbers may be (``first <= stop``, in the plan)
    is for the caller to say.
    """
    import numpy as np  # _core is numpy-only; imported here to keep this module light

    wanted = f"{name} should be [first, stop) rows: a (k, 2) array or list of [first, stop] integer pairs"
    if isinstance(values, (str, bytes)) or not isinstance(values, (Iterable, np.ndarray)):
        raise TypeError(f"{wanted}, but got {shown(name, values)} ({type(values).__name__})")
    try:
        array = np.asarray(values) if not isinstance(values, np.ndarray) else values
    except (TypeError, ValueError):  # ragged rows: numpy cannot make an array of them
        raise ValueError(f"{wanted}, but got rows of different lengths ({type(values).__name__})") from None
    if array.size == 0:
        return np.empty((0, 2), dtype=np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{wanted}, but got {name} of dtype {array.dtype} ({type(values).__name__})")
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"{wanted}, but got {name} with shape {array.shape}; e.g. {name}=[[10, 20], [35, 40]]")
    if array.min() < 0 or (array[:, 1] < array[:, 0]).any():
        bad = array[(array[:, 0] < 0) | (array[:, 1] < array[:, 0])][:3].tolist()
        raise ValueError(f"{wanted} with 0 <= first <= stop, but got {name} with rows {bad}")
    return array.astype(np.int64, copy=False)


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(MalformedStateError, StateMismatchError)
