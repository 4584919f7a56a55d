"""What the factory returned, read as frameworks read it: the index source, the ``set_epoch`` paths, the graph.

:class:`Instance` wraps one rank's object (a sampler, a batch sampler or a DataLoader) with the
index source a training loop iterates and the objects at each of :data:`recipes.PATHS`. The other
functions read the object graph for the report: which object's state a checkpoint saves
(:func:`holder`), the dataset size and sample lengths the samplers know, and every object reachable
through instance attributes (:func:`walk`), to find a ``set_epoch`` no framework reaches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .target import TargetError


class IterationError(RuntimeError):
    """The sampler raised while being iterated (or never ended an epoch)."""


def is_loader(obj: object) -> bool:
    """Whether ``obj`` is a DataLoader (torch's, or anything with its three sampling attributes)."""
    from torch.utils.data import DataLoader

    return isinstance(obj, DataLoader) or all(hasattr(obj, a) for a in ("batch_sampler", "sampler", "dataset"))


def label(obj: object) -> str:
    return type(obj).__name__


class Instance:
    """One rank's object from one factory call, with its index source and ``set_epoch`` paths."""

    def __init__(self, obj: Any, kind: str | None) -> None:
        from torch.utils.data import BatchSampler, IterableDataset

        self.obj = obj
        self.loader = is_loader(obj)
        if self.loader:
            if isinstance(getattr(obj, "dataset", None), IterableDataset):
                raise TargetError(
                    "the factory returned a DataLoader over an IterableDataset, which has no sampler to verify; "
                    "return the sampler or batch sampler instead"
                )
            self.source = obj.batch_sampler if obj.batch_sampler is not None else obj.sampler
            self.kind = "batch" if obj.batch_sampler is not None else "index"
        elif hasattr(obj, "__iter__"):
            self.source = obj
            self.kind = kind or ("batch" if isinstance(obj, BatchSampler) else _peek_kind(obj))
        else:
            raise TargetError(
                f"the factory returned an object of type {label(obj)}; it should return a Sampler, a batch "
                "sampler or a DataLoader"
            )

    def view(self) -> dict[str, Any]:
        """The objects at each of ``recipes.PATHS``, as frameworks see them (None: nothing there)."""
        obj = self.obj
        if self.loader:
            batch_sampler = obj.batch_sampler
            return {
                "loader.sampler": obj.sampler,
                "loader.batch_sampler": batch_sampler,
                "loader.batch_sampler.sampler": getattr(batch_sampler, "sampler", None) if batch_sampler else None,
            }
        if self.kind == "index":  # DataLoader(dataset, sampler=obj): loader.batch_sampler is torch's BatchSampler
            return {"loader.sampler": obj, "loader.batch_sampler": None, "loader.batch_sampler.sampler": obj}
        # DataLoader(dataset, batch_sampler=obj): loader.sampler is a SequentialSampler with no set_epoch
        return {"loader.sampler": None, "loader.batch_sampler": obj, "loader.batch_sampler.sampler": attr(obj)}


def attr(obj: object, name: str = "sampler") -> Any:
    """``getattr(obj, name, None)``, also None when a property cannot answer."""
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that cannot answer has nothing there
        return None


def _peek_kind(obj: Any) -> str:
    try:
        first = next(iter(obj), None)
    except Exception as error:
        raise IterationError(f"iterating the sampler raised {type(error).__name__}: {error}") from None
    scalar = isinstance(first, (int, np.integer)) or getattr(first, "ndim", None) == 0
    return "index" if first is None or scalar else "batch"


def holder(view: dict[str, Any]) -> str | None:
    """The path of the object whose state a checkpoint saves: the batch sampler's, else the sampler's."""
    for path in ("loader.batch_sampler", "loader.sampler", "loader.batch_sampler.sampler"):
        obj = view[path]
        if (
            obj is not None
            and callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ):
            return path
    return None


def _size_of(value: Any) -> int | None:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    try:
        return len(value)
    except Exception:
        return None


def dataset_size(instance: Instance, view: dict[str, Any]) -> int | None:
    """The dataset size the loader or its samplers know (None: nothing says)."""
    if instance.loader:
        return _size_of(instance.obj.dataset)
    for obj in (view["loader.sampler"], view["loader.batch_sampler"], view["loader.batch_sampler.sampler"]):
        for name in ("dataset", "data_source"):
            value = attr(obj, name) if obj is not None else None
            if value is not None and (size := _size_of(value)) is not None:
                return size
    return None


def lengths(view: dict[str, Any]) -> np.ndarray | None:
    """The sample lengths a sampler on the paths holds (a 1-D integer array), else None."""
    for obj in view.values():
        value = attr(obj, "lengths") if obj is not None else None
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
            return value
    return None


_LEAVES = (str, bytes, int, float, bool, type(None), np.ndarray)


def walk(root: Any, name: str, depth: int = 3, limit: int = 300) -> list[tuple[str, Any]]:
    """Objects reachable from ``root`` through instance attributes (a few levels), with dotted names."""
    import torch

    found: list[tuple[str, Any]] = [(name, root)]
    seen = {id(root)}
    level = [(name, root)]
    for _ in range(depth):
        nested = []
        for prefix, obj in level:
            items = list(vars(obj).items()) if hasattr(obj, "__dict__") and not isinstance(obj, type) else []
            for key, value in items:
                if isinstance(value, (list, tuple)) and len(value) <= 16:
                    pairs = [(f"{prefix}.{key}[{i}]", v) for i, v in enumerate(value)]
                else:
                    pairs = [(f"{prefix}.{key}", value)]
                for child_name, child in pairs:
                    if isinstance(child, (_LEAVES, torch.Tensor)) or id(child) in seen:
                        continue
                    if callable(child) and not hasattr(child, "__iter__"):
                        continue
                    seen.add(id(child))
                    found.append((child_name, child))
                    nested.append((child_name, child))
                    if len(found) >= limit:
                        return found
        level = nested
    return found


def describe(obj: Any) -> str:
    """``repr(obj)``, cut to 200 characters."""
    text = repr(obj)
    return text if len(text) <= 200 else text[:197] + "..."
