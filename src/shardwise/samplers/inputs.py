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


def lengths_array(values: object) -> np.ndarray:
    """``values`` as a 1-D integer numpy array, used as is (arrays and memory maps are not copied).

    Checks the shape and dtype (O(1)); the values are checked where they are read in full (the
    index build, or :func:`as_lengths`), so a warm start never scans an input of 1e9 lengths.
    The array of :meth:`LengthsInput.of(values) <shardwise.index.lengths.LengthsInput.of>`, which
    samplers take directly.
    """
    array: np.ndarray = LengthsInput.of(values).values
    return array  # a numpy.memmap stays one: its key is then O(1) (shardwise.index.key_of)


def as_lengths(values: object) -> np.ndarray:
    """``values`` as a compact private copy of non-negative lengths (the ``sort_window`` path), or raise.

    The dtype is the narrowest of uint16, uint32, int64 that holds every length
    (:meth:`LengthsInput.compact <shardwise.index.lengths.LengthsInput.compact>`).
    """
    return LengthsInput.of(values).compact()
