"""The length index: samples grouped by length, shared by every rank (``BucketBatchSampler``, packing).

Kind ``"length-order"``: ``order.npy`` holds the sample indices sorted by length (stable: equal
lengths in increasing index order), ``order_offsets.npy`` the ``(max_length + 2,)`` offsets of
every length value, so the samples of length ``L`` are ``order[offsets[L]:offsets[L + 1]]``.
About 4 bytes a sample (8 above 2**32 samples) plus 8 bytes a length value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .._core.errors import check_integer_array, check_path
from .builders import OffsetLengths, order_by_key
from .cache import DEFAULT_TIMEOUT, CacheDir, build_or_open
from .grouped import GroupedIndex
from .keys import key_of, ragged_key

LENGTH_KIND = "length-order"
STORE_INDEX = "index"
"""The directory inside a ragged store that holds its indexes (written by ``RaggedWriter``)."""


def is_ragged_store(values: Any) -> bool:
    """Whether ``values`` looks like a ``RaggedArray`` (``offsets``, ``manifest`` and ``path``)."""
    return all(hasattr(values, name) for name in ("offsets", "manifest", "path")) and isinstance(
        getattr(values, "manifest", None), dict
    )


def store_index_dir(store_path: str | os.PathLike[str]) -> Path:
    """Where a ragged store keeps its indexes: ``<store>/index``."""
    return Path(check_path("store_path", store_path)) / STORE_INDEX


def _store_cache_dir(store: Any) -> Path | None:
    """The store's own index directory if it exists or can be created there, else ``None`` (default cache)."""
    directory = store_index_dir(store.path)
    if directory.is_dir() or os.access(store.path, os.W_OK | os.X_OK):
        return directory
    return None


def length_index(lengths: Any, *, cache_dir: CacheDir = None, timeout: float = DEFAULT_TIMEOUT) -> GroupedIndex:
    """The shared :class:`GroupedIndex` of samples grouped by length (built once, then mapped).

    Args:
        lengths: ``(n,)`` non-negative integer lengths (an array or memory map, used as is), or a
            ragged store (``RaggedArray``: lengths read from its offsets a slice at a time).
        cache_dir: see :func:`~shardwise.index.build_or_open`; for a ragged store ``None`` means
            the store's own ``index/`` directory (the default cache if the store is read-only
            and has none).
        timeout: seconds to wait for another process building the same index.

    Raises:
        TypeError, ValueError: lengths that are not non-negative integers (naming ``lengths``).
    """
    if is_ragged_store(lengths):
        keys: Any = OffsetLengths(lengths.offsets)
        key = ragged_key(lengths.manifest)
        if cache_dir is None:
            cache_dir = _store_cache_dir(lengths)
    else:
        keys = check_integer_array("lengths", lengths)
        key = key_of(lengths)

    def build(directory: Path) -> None:
        order_by_key(keys, directory, name="order", param="lengths")

    arrays = build_or_open(LENGTH_KIND, key, build, cache_dir=cache_dir, timeout=timeout)
    return GroupedIndex(arrays["order"], arrays["order_offsets"])


def prebuild_store_index(store_path: str | os.PathLike[str], offsets: np.ndarray, manifest: dict[str, Any]) -> None:
    """Write a ragged store's length index into ``<store_path>/index`` (``RaggedWriter`` calls it)."""

    def build(directory: Path) -> None:
        order_by_key(OffsetLengths(offsets), directory, name="order", param="lengths")

    build_or_open(LENGTH_KIND, ragged_key(manifest), build, cache_dir=store_index_dir(store_path))
