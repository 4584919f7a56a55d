"""The keywords every sampler shares, declared and checked once (docs/design.md, "Constructor keywords").

Every public sampler takes its data argument(s), then its own keywords, then the shared ones in
one order: ``shuffle, seed, num_replicas, rank, drop_last, cache_dir, cache_timeout`` (each
sampler takes the ones that apply to it). A constructor declares them as
``**options: Unpack[<one of the TypedDicts below>]``: type checkers and IDEs read the names and
types from the TypedDict, and :func:`expand_signature` gives ``inspect.signature`` and ``help()``
the real keyword-only parameters with their defaults (``PlanMeta`` applies it to every sampler
class). :func:`read_keywords` checks them, once, for every sampler.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict, TypeVar

from .._core.errors import check_bool, check_cache_dir, check_choice, check_seconds
from .._core.plan import Even
from .._core.seeds import check_seed
from .._core.world import check_world_args
from ..index.cache import DEFAULT_TIMEOUT, CacheDir
from ..index.manifest import IndexCacheError
from .callers import warn_outside

F = TypeVar("F", bound=Callable[..., Any])


class _Shuffle(TypedDict, total=False):
    shuffle: bool


class PlanKeywords(TypedDict, total=False):
    """``seed, num_replicas, rank, drop_last``: what every sampler takes."""

    seed: int | None
    num_replicas: int | None
    rank: int | None
    drop_last: bool


class _Cache(TypedDict, total=False):
    cache_dir: CacheDir
    cache_timeout: float


class _DeprecatedEven(TypedDict, total=False):
    even: Even | str | None


class ShuffledKeywords(_Shuffle, PlanKeywords, total=False):
    """``shuffle`` and the :class:`PlanKeywords`."""


class CachedKeywords(PlanKeywords, _Cache, total=False):
    """The :class:`PlanKeywords` and the shared index cache's ``cache_dir, cache_timeout``."""


class ShuffledCachedKeywords(_Shuffle, PlanKeywords, _Cache, total=False):
    """``shuffle``, the :class:`PlanKeywords` and the cache's."""


class ShardKeywords(PlanKeywords, _DeprecatedEven, total=False):
    """``shard()``'s: the :class:`PlanKeywords` and ``even``, the deprecated alias of ``drop_last``."""


class MixtureKeywords(_Shuffle, PlanKeywords, _DeprecatedEven, total=False):
    """``MixtureSampler``'s: :class:`ShuffledKeywords` and ``even``, the deprecated alias of ``drop_last``."""


KINDS: dict[str, type] = {
    kind.__name__: kind
    for kind in (PlanKeywords, ShuffledKeywords, CachedKeywords, ShuffledCachedKeywords, ShardKeywords, MixtureKeywords)
}

DEFAULTS: dict[str, Any] = {
    "shuffle": True,
    "seed": 0,
    "num_replicas": None,
    "rank": None,
    "drop_last": False,
    "cache_dir": None,
    "cache_timeout": DEFAULT_TIMEOUT,
    "even": None,
}
"""The one default of each shared keyword (a sampler may override one, with a documented reason)."""

ORDER = tuple(DEFAULTS)
"""The order of the shared keywords in every signature."""

_UNPACK = re.compile(r"^(?:\w+\.)*Unpack\[(?:[\w.]+\.)?(\w+)\]$")


@dataclass(frozen=True)
class Keywords:
    """The shared keywords of one construction, checked (``seed`` and the world as given, not resolved)."""

    shuffle: bool
    seed: int | None
    num_replicas: int | None
    rank: int | None
    drop_last: bool
    cache_dir: str | bool | None
    cache_timeout: float
    seed_source: str = "argument"
    """Where ``seed`` came from, as ``describe()`` shows it: ``"argument"`` (passed), ``"default"`` (the
    constructor's default, not passed) or ``"index sampler"`` (taken from the sampler batched)."""

    @property
    def even(self) -> Even:
        """How ranks get equal lengths: ``Even.DROP`` with ``drop_last``, else ``Even.PAD``."""
        return Even.DROP if self.drop_last else Even.PAD

    def with_seed(self, seed: int | None) -> Keywords:
        """These keywords with the (checked) seed of the index sampler they batch."""
        return replace(self, seed=check_seed(seed), seed_source="index sampler")


def accepted_keywords(function: Callable[..., Any]) -> type | None:
    """The TypedDict of a function's ``**options: Unpack[...]`` parameter, if it has one."""
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            annotation = parameter.annotation
            text = annotation if isinstance(annotation, str) else str(annotation)  # evaluated: typing's repr
            match = _UNPACK.match(text.replace(" ", ""))
            if match is not None and match.group(1) in KINDS:
                return KINDS[match.group(1)]
    return None


def _annotation(kind: type, name: str) -> Any:
    annotation = kind.__annotations__[name]
    return getattr(annotation, "__forward_arg__", annotation)  # a string under postponed annotations


def expand_signature(function: Callable[..., Any], defaults: Mapping[str, Any] | None = None) -> inspect.Signature:
    """``function``'s signature with ``**options: Unpack[K]`` replaced by K's keyword-only parameters."""
    signature = inspect.signature(function)
    kind = accepted_keywords(function)
    if kind is None:
        return signature
    values = {**DEFAULTS, **(defaults or {})}
    parameters = []
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            parameters += [
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=values[name],
                                  annotation=_annotation(kind, name))
                for name in kind.__annotations__
            ]  # fmt: skip
        else:
            parameters.append(parameter)
    return signature.replace(parameters=parameters)


def positional_keywords(owner: str, data: str, names: tuple[str, ...], values: tuple[Any, ...],
                        options: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """``options`` with ``values``, given by position after the data argument ``data``, under ``names`` in order.

    For a constructor that also takes shared keywords positionally (``ShardedSampler`` takes
    torch's ``DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last)``).

    Raises:
        TypeError: more values than ``names``, or a value also given by keyword (Python's own wording).
    """
    if len(values) > len(names):
        raise TypeError(
            f"{owner}() takes at most {len(names) + 1} positional arguments ({', '.join((data, *names))}), but got "
            f"{len(values) + 1}; pass the rest by keyword"
        )
    given = dict(zip(names, values, strict=False))  # fewer values than names: the rest by keyword
    twice = [name for name in given if name in options]
    if twice:
        raise TypeError(f"{owner}() got multiple values for argument {twice[0]!r}")
    return {**given, **options}


def positional_signature(signature: inspect.Signature, names: tuple[str, ...]) -> inspect.Signature:
    """``signature`` (expanded, with a ``*values`` parameter) with ``names`` positional-or-keyword, in that order."""
    parameters = list(signature.parameters.values())
    by_name = {parameter.name: parameter for parameter in parameters}
    shown = [by_name[name].replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names]
    kept = [p for p in parameters if p.name not in names and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    first = [p for p in kept if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    return signature.replace(parameters=[*first, *shown, *(p for p in kept if p not in first)])


def with_keywords(function: F) -> F:
    """Give a function taking ``**options: Unpack[...]`` its expanded signature (``shard()``)."""
    function.__signature__ = expand_signature(function)  # type: ignore[attr-defined]
    return function


def read_keywords(owner: str, kind: type, options: Mapping[str, Any],
                  defaults: Mapping[str, Any] | None = None) -> Keywords:  # fmt: skip
    """Check the shared keywords ``options`` given to ``owner`` (which accepts those of ``kind``).

    Raises:
        TypeError: a keyword ``owner`` does not take, or a value of the wrong type.
        ValueError: a value out of range, or both ``drop_last`` and its deprecated alias ``even``.
    """
    accepted = kind.__annotations__
    unknown = [name for name in options if name not in accepted]
    if unknown:
        raise TypeError(
            f"{owner}() got an unexpected keyword argument {unknown[0]!r}; its shared keywords are "
            f"{', '.join(accepted)}"
        )
    values = {**DEFAULTS, **(defaults or {}), **options}
    drop_last = check_bool("drop_last", values["drop_last"])
    if "even" in options:
        drop_last = _even_alias(owner, options)
    num_replicas, rank = check_world_args(values["num_replicas"], values["rank"])
    cache_dir, timeout = values["cache_dir"], values["cache_timeout"]
    return Keywords(
        shuffle=check_bool("shuffle", values["shuffle"]),
        seed=check_seed(values["seed"]),
        num_replicas=num_replicas,
        rank=rank,
        drop_last=drop_last,
        cache_dir=check_cache_dir(cache_dir, file_error=IndexCacheError) if "cache_dir" in accepted else None,
        cache_timeout=check_seconds("cache_timeout", timeout) if "cache_timeout" in accepted else DEFAULT_TIMEOUT,
        seed_source="argument" if "seed" in options else "default",
    )


def _even_alias(owner: str, options: Mapping[str, Any]) -> bool:
    """``drop_last`` from the deprecated ``even=``: checked first, then a ``DeprecationWarning``."""
    even = check_choice("even", options["even"], Even)
    if "drop_last" in options:
        raise ValueError(
            f"{owner}() got both drop_last={options['drop_last']!r} and even={even.value!r}, its deprecated alias; "
            "pass drop_last only"
        )
    warn_outside(
        f"{owner}(even=...) is deprecated and will be removed; pass drop_last={even is Even.DROP} instead of "
        f"even={even.value!r}",
        DeprecationWarning,
    )
    return even is Even.DROP
