"""How samplers take their inputs: a dataset's size; lengths through :class:`~shardwise.index.lengths.LengthsInput`."""

from __future__ import annotations

from collections.abc import Sized

import numpy as np

from .._core.errors import check_int
from .._core.permutation import MAX_SIZE
from ..index.lengths import LengthsInput


def dataset_size(dataset: object, name: str = "dataset") -> int:
    """The number of samples of a sized dataset, or of an int given in its place."""
    if isinstance(dataset, Sized):
        return check_int(f"len({name})", len(dataset), minimum=0, maximum=MAX_SIZE)
    if isinstance(dataset, bool) or not isinstance(dataset, (int, np.integer)):
        raise TypeError(f"{name} should be a sized dataset or an int length, but got {name}={dataset!r}")
    return check_int(name, dataset, minimum=0, maximum=MAX_SIZE)


def as_lengths(values: object) -> np.ndarray:
    """``values`` as a compact private copy of non-negative lengths (the ``sort_window`` path), or raise.

    The dtype is the narrowest of uint16, uint32, int64 that holds every length
    (:meth:`LengthsInput.compact <shardwise.index.lengths.LengthsInput.compact>`).
    """
    return LengthsInput.of(values).compact()
