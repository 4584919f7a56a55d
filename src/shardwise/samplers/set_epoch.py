"""``set_epoch(obj, epoch)``: reach every sampler, batch sampler and dataset behind a loader, once each.

Frameworks set the epoch in different places: PyTorch's recipe on ``loader.sampler``, Lightning on
``loader.sampler`` and ``loader.batch_sampler.sampler``, Composer on whichever of the two is a
``DistributedSampler``, Accelerate on its own loader. A batch sampler, a sampler nested in a
wrapper or a dataset that shuffles by epoch is easily missed; this walks all of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._core.errors import check_int
from .base import PlanSampler
from .frameworks import EpochRelay

_NESTED = ("sampler", "batch_sampler", "dataset")
_DEPTH = 4


def epoch_target(obj: object) -> object:
    """The object whose ``set_epoch`` a framework's call on ``obj`` reaches (a relay stands for its owner)."""
    return obj.owner if isinstance(obj, EpochRelay) else obj


def set_epoch(obj: Any, epoch: int) -> list[Any]:
    """Set ``epoch`` on ``obj`` and on every sampler, batch sampler and dataset it holds, once each.

    Walks ``sampler``, ``batch_sampler`` and ``dataset`` attributes (a few levels deep, so a
    ``BatchSampler`` over a ``ShardedSampler``, or a ``Subset`` of a dataset with ``set_epoch``, is
    reached) and calls ``set_epoch(epoch)`` on each distinct object that has one. A loader that has
    its own ``set_epoch`` (Accelerate's) is called first, since it keeps its own counter.

    Args:
        obj: a DataLoader (torch, torchdata's ``StatefulDataLoader``, Accelerate's), a sampler or a
            batch sampler.
        epoch: the epoch about to start, a non-negative integer.

    Returns:
        The objects whose ``set_epoch`` was called, in call order.

    Raises:
        TypeError: ``obj`` is ``None``, a number, a string or a container such as a list
            (nothing that holds a sampler), or ``epoch`` is not an integer.

    Example:
        >>> from torch.utils.data import BatchSampler, DataLoader
        >>> from shardwise import ShardedSampler
        >>> sampler = ShardedSampler(8, num_replicas=2, rank=0)
        >>> loader = DataLoader(range(8), batch_sampler=BatchSampler(sampler, 2, False))
        >>> [type(o).__name__ for o in set_epoch(loader, 3)], sampler.epoch
        (['ShardedSampler'], 3)
    """
    if obj is None or isinstance(obj, (str, bytes, int, float, complex)):
        raise TypeError(
            "obj should be a DataLoader, a sampler or a batch sampler (what holds the samplers to set), but got "
            f"obj={obj!r} ({type(obj).__name__}); pass the loader itself, e.g. set_epoch(loader, {epoch!r})"
        )
    if isinstance(obj, (list, tuple, set, frozenset, dict)):
        raise TypeError(
            f"obj should be one DataLoader, sampler or batch sampler, but got a {type(obj).__name__}, whose items "
            f"set_epoch does not walk; call set_epoch on each: for o in objs: set_epoch(o, {epoch!r})"
        )
    epoch = check_int("epoch", epoch, minimum=0)
    return call_set_epoch([obj], epoch, depth=_DEPTH)


def call_set_epoch(objects: Iterable[object], epoch: int, *, depth: int = 1) -> list[Any]:
    """Call ``set_epoch(epoch)`` once on each distinct object among ``objects`` (the one walk).

    ``depth=1`` reaches exactly ``objects`` (``None`` skipped; a relay stands for its owner), as a
    framework does on the paths it knows (``shardwise verify`` replays them with this); a larger
    ``depth`` also walks their ``sampler``, ``batch_sampler`` and ``dataset`` attributes, that many
    levels in all (:func:`set_epoch`). No argument checks: :func:`set_epoch` is the public entry.
    Cost: O(objects reached), independent of the dataset size.

    Returns:
        The objects whose ``set_epoch`` was called, in call order.
    """
    called: list[Any] = []
    seen: set[int] = set()
    level: list[object] = list(objects)
    for remaining in range(depth - 1, -1, -1):
        nested: list[object] = []
        for item in level:
            target = epoch_target(item)
            if target is None or id(target) in seen:
                continue
            seen.add(id(target))
            method = getattr(target, "set_epoch", None)
            if callable(method):
                method(epoch)
                called.append(target)
            if remaining:
                nested += _held(target)
        level = nested
    return called


def _held(target: object) -> list[object]:
    """The sampler, batch sampler and dataset ``target`` holds (a shardwise sampler: only its dataset)."""
    found: list[object] = []
    # A shardwise sampler forwards its epoch to what it wraps; only its dataset is left to reach.
    for name in ("dataset",) if isinstance(target, PlanSampler) else _NESTED:
        try:
            value = getattr(target, name, None)
        except (AttributeError, TypeError, ValueError, RuntimeError):
            continue  # a property that cannot answer here has nothing to walk
        if value is not None and not isinstance(value, (str, bytes, int, float)):
            found.append(value)
    return found
