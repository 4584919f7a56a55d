"""Checks and digests for the arrays samplers hold (indices, labels), with the one message template.

Arrays are kept as compact numpy arrays, never Python lists; a digest of an array goes into a
sampler's fingerprint so that a state saved over other data is refused on load.
"""

from __future__ import annotations

import hashlib

import numpy as np

_INDEX_MAX = 2**62


def one_dimensional(name: str, values: object, *, sequence_of: str, one: str, allow_empty: bool = False) -> np.ndarray:
    """``values`` as a 1-D numpy array (no copy when it already is one), or raise naming ``name``.

    Args:
        name: the parameter, for messages.
        values: what the caller passed.
        sequence_of: what the sequence holds, e.g. ``"weights"`` (``"a 1-D sequence of weights"``).
        one: one element, e.g. ``"weight"`` (``"should hold at least one weight"``).
        allow_empty: accept an empty sequence.
    """
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} should be a 1-D sequence of {sequence_of}, but got {name} with shape {array.shape}")
    if array.size == 0 and not allow_empty:
        raise ValueError(f"{name} should hold at least one {one}, but got an empty {name}")
    return array


def check_non_negative_integers(name: str, array: np.ndarray, *, holds: str, noun: str) -> tuple[int, int]:
    """Raise unless ``array`` (1-D, non-empty) is integer-typed with every value in ``[0, 2**62)``.

    Args:
        name: the parameter, for messages.
        array: the values to check.
        holds: what the dtype message says it should hold, e.g. ``"integer indices"``.
        noun: the values' plural in range messages, e.g. ``"indices"``.

    Returns:
        The smallest and largest value.
    """
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} should hold {holds}, but got {name} of dtype {array.dtype}")
    low, high = int(array.min()), int(array.max())
    if low < 0:
        at = int(np.argmin(array))
        raise ValueError(f"{name} should hold non-negative {noun}, but got {name}[{at}]={low}")
    if high >= _INDEX_MAX:
        at = int(np.argmax(array))
        raise ValueError(f"{name} should hold {noun} below 2**62, but got {name}[{at}]={high}")
    return low, high


def as_index_array(name: str, values: object, *, allow_empty: bool = False) -> np.ndarray:
    """``values`` as a 1-D int64 array of non-negative indices, or raise naming ``name``.

    Accepts any 1-D integer sequence, numpy array or CPU tensor; rejects floats and bools (a
    float index is a bug, and a bool array is a mask, not indices).
    """
    array = one_dimensional(name, values, sequence_of="indices", one="index", allow_empty=allow_empty)
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    check_non_negative_integers(name, array, holds="integer indices", noun="indices")
    return np.ascontiguousarray(array, dtype=np.int64)


def digest(array: np.ndarray) -> str:
    """A short, stable hex digest of an array's dtype, shape and bytes (for fingerprints)."""
    array = np.ascontiguousarray(array)
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(f"{array.dtype.str}{array.shape}".encode())
    hasher.update(array.view(np.uint8).data if array.size else b"")
    return hasher.hexdigest()
