"""How samplers take their inputs: a dataset's size, an array of lengths (numpy, memory map or Arrow)."""

from __future__ import annotations

from collections.abc import Sized

import numpy as np

from .._core.arrays import check_non_negative_integers, one_dimensional
from .._core.errors import check_int
from .._core.permutation import MAX_SIZE
from ..index.arrow import resolve


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
    """
    values = resolve("lengths", values)  # a pyarrow Array/ChunkedArray: its row lengths, from the offsets
    array = one_dimensional("lengths", values, sequence_of="integers", one="length")
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"lengths should hold integers (token counts), but got lengths of dtype {array.dtype}")
    return array  # a numpy.memmap stays one: its key is then O(1) (shardwise.index.key_of)


def as_lengths(values: object) -> np.ndarray:
    """``values`` as a compact private copy of non-negative lengths (the ``sort_window`` path), or raise.

    The dtype is the narrowest of uint16, uint32, int64 that holds every length.
    """
    array = lengths_array(values)
    _, high = check_non_negative_integers("lengths", array, holds="integers (token counts)", noun="integers")
    dtype = np.uint16 if high < 2**16 else np.uint32 if high < 2**32 else np.int64
    return np.array(array, dtype=dtype)
