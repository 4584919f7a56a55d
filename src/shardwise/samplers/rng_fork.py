"""A forked RNG state: what ``shard()`` runs a wrapped sampler under, so every rank draws the same sequence.

:class:`RngFork` swaps in a private state, seeded from ``(seed, epoch)`` and the same on every rank,
for the process-wide generators (``random``, ``numpy.random``, ``torch``) and for the generators a
sampler owns (:func:`owned_generators`, found in its attributes and those of the samplers it
holds), and puts the caller's states back whenever control returns to the caller.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from .._core.seeds import derive_seed

SEARCH_DEPTH = 3  # how deep to look through .sampler/.batch_sampler chains for generators


def _seeded_state(obj: object, seed: int) -> object:
    """A fresh state, seeded with ``seed``, of the same kind as generator ``obj``'s."""
    if isinstance(obj, torch.Generator):
        return torch.Generator().manual_seed(seed).get_state()
    if isinstance(obj, np.random.Generator):
        return type(obj.bit_generator)(seed).state
    if isinstance(obj, np.random.RandomState):
        return np.random.RandomState(np.random.MT19937(seed)).get_state()
    if isinstance(obj, random.Random):
        return random.Random(seed).getstate()
    raise TypeError(f"not a generator: {obj!r}")


def _get_state(obj: object) -> object:
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, np.random.Generator):
        return obj.bit_generator.state
    if isinstance(obj, np.random.RandomState):
        return obj.get_state()
    return obj.getstate()  # type: ignore[attr-defined]


def _set_state(obj: object, state: Any) -> None:
    if isinstance(obj, torch.Generator):
        obj.set_state(state)
    elif isinstance(obj, np.random.Generator):
        obj.bit_generator.state = state
    elif isinstance(obj, np.random.RandomState):
        obj.set_state(state)
    else:
        obj.setstate(state)  # type: ignore[attr-defined]


def _is_generator(value: object) -> bool:
    if isinstance(value, torch.Generator):
        return value.device.type == "cpu"
    return isinstance(value, (np.random.Generator, np.random.RandomState, random.Random))


def attribute_values(sampler: object, depth: int = SEARCH_DEPTH) -> Iterator[object]:
    """Attribute values of ``sampler`` and of the samplers it holds, breadth-first, each once."""
    seen: set[int] = set()
    level: list[object] = [sampler]
    for _ in range(depth):
        nested: list[object] = []
        for obj in level:
            for value in getattr(obj, "__dict__", {}).values():
                if id(value) in seen:
                    continue
                seen.add(id(value))
                yield value
                if isinstance(value, Sampler):
                    nested.append(value)
        level = nested


def owned_generators(sampler: object, depth: int = SEARCH_DEPTH) -> list[object]:
    """Generators held in the attributes of ``sampler`` and of samplers it holds."""
    return [value for value in attribute_values(sampler, depth) if _is_generator(value)]


class _GlobalRng:
    """The process-wide generators a sampler may draw from: ``random``, ``numpy.random``, ``torch``."""

    @staticmethod
    def get() -> tuple[object, object, torch.Tensor]:
        # The legacy global numpy RNG is what user samplers call; it must be swapped, not avoided.
        return random.getstate(), np.random.get_state(), torch.get_rng_state()  # noqa: NPY002

    @staticmethod
    def set(states: tuple[Any, Any, torch.Tensor]) -> None:
        random.setstate(states[0])
        np.random.set_state(states[1])  # noqa: NPY002
        torch.set_rng_state(states[2])

    @staticmethod
    def seeded(seed: int) -> tuple[object, object, torch.Tensor]:
        return (
            random.Random(seed).getstate(),
            np.random.RandomState(np.random.MT19937(seed)).get_state(),
            torch.Generator().manual_seed(seed).get_state(),
        )


class RngFork:
    """A context in which the global RNGs and ``owned`` generators run on a private, seeded state.

    Entering swaps the private states in (saving the caller's); leaving saves the private states
    (so the inner sampler's stream continues next time) and restores the caller's.
    """

    def __init__(self, seed: int, owned: list[object]) -> None:
        self._owned = owned
        self._global = _GlobalRng.seeded(derive_seed(seed, "global"))
        self._private = [_seeded_state(g, derive_seed(seed, "owned", i)) for i, g in enumerate(owned)]
        self._saved_global: tuple[Any, Any, torch.Tensor] | None = None
        self._saved_owned: list[object] = []

    def __enter__(self) -> RngFork:
        self._saved_global = _GlobalRng.get()
        self._saved_owned = [_get_state(g) for g in self._owned]
        _GlobalRng.set(self._global)
        for generator, state in zip(self._owned, self._private, strict=True):
            _set_state(generator, state)
        return self

    def __exit__(self, *exc: object) -> None:
        self._global = _GlobalRng.get()
        self._private = [_get_state(g) for g in self._owned]
        assert self._saved_global is not None
        _GlobalRng.set(self._saved_global)
        for generator, state in zip(self._owned, self._saved_owned, strict=True):
            _set_state(generator, state)
