"""The construction-time checks of ``TwoStreamBatchSampler``'s two index lists: values, overlap, digests.

Run once per pair of lists and node (the sampler's ``two-stream-check`` cache entry): the values
checked and the shared indices counted by bounded bitmap scans (:func:`stream_overlap`), while a
background thread hashes the lists for the sampler's fingerprint (:class:`ListDigests`).
"""

from __future__ import annotations

import numpy as np

from .._core.arrays import digest
from .._core.indices import Arange, IndexList, check_values, shared_indices
from ..index.keys import BackgroundDigest
from ..index.tables import input_key


def stream_overlap(primary: IndexList, secondary: IndexList) -> tuple[int, int]:
    """Check both index lists' values and count the indices they share: ``(count, smallest shared or -1)``.

    O(n) time with bounded private memory (see :func:`shardwise._core.indices.shared_indices`);
    two ranges cost nothing.

    Raises:
        ValueError: a negative index, or one of ``2**62`` or more, naming the list.
    """
    primary_bounds = check_values("primary_indices", primary)
    if len(secondary) == 0:
        return 0, -1
    secondary_bounds = check_values("secondary_indices", secondary)
    return shared_indices(primary, primary_bounds, secondary, secondary_bounds)


def list_key(values: IndexList) -> str:
    """The cache key part of an index list: a range's repr, an array's ``input_key``."""
    return repr(values) if isinstance(values, Arange) else input_key(values)


class ListDigests:
    """``list_digest`` of each list, one after the other; the arrays hashed by a background thread."""

    def __init__(self, *lists: IndexList) -> None:
        self._lists = lists
        hashed = [v for v in lists if isinstance(v, np.ndarray) and len(v)]
        self._hashing = BackgroundDigest(*hashed) if hashed else None

    def result(self) -> str:
        found = self._hashing.result() if self._hashing is not None else ""
        parts, at = [], 0
        for values in self._lists:
            if isinstance(values, np.ndarray) and len(values):
                parts.append(found[at : at + 16])
                at += 16
            else:
                parts.append(list_digest(values))
        return "".join(parts)

    def __enter__(self) -> ListDigests:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hashing is not None:
            self._hashing.__exit__(*exc)


def list_digest(values: IndexList) -> str:
    """The digest of an index list for the fingerprint (a range by its three integers)."""
    if len(values) == 0:
        return digest(np.empty(0, dtype=np.int64))
    if isinstance(values, Arange):
        return digest(np.array([values.start, values.stop, values.step], dtype=np.int64))
    return digest(values)
