"""A packed mixture's sources as lengths, and each source's chunk totals in the node's shared index.

:func:`mixture_lengths` resolves ``PackedMixtureSampler``'s ``lengths`` (one input per source, a
``{name: lengths}`` mapping, a ``ShardedSource`` standing for its index's lengths) in one step;
:func:`chunk_table` gives a source's checked lengths and its chunk totals
(:func:`shardwise._core.token_mixture.streams.chunk_tokens`), from :data:`~shardwise.index.cache.SHARED_FROM`
documents on built once per node and memory-mapped by every rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._core.arrays import check_non_negative_integers
from .._core.token_mixture.streams import chunk_count, chunk_tokens
from .cache import SHARED_FROM, CacheDir, build_or_open
from .integrity import read_checked
from .lengths import LengthsInput

CHUNKS_KIND = "token-mixture-chunks"
"""The shared index of a source's chunk totals (and its lengths' range), one entry per lengths input."""


def mixture_lengths(lengths: object) -> tuple[list[str], list[LengthsInput]]:
    """Source names and one resolved lengths input per source."""
    names = [str(name) for name in lengths] if isinstance(lengths, Mapping) else None
    values_of = list(lengths.values()) if isinstance(lengths, Mapping) else lengths
    if isinstance(values_of, (str, bytes, np.ndarray)) or not isinstance(values_of, Sequence) or not values_of:
        raise TypeError(
            "lengths should be a non-empty sequence (or {name: lengths} mapping) with one lengths input per source "
            "(each a 1-D sequence of token counts, an array, a memory map or an HF column), but got "
            f"lengths={type(lengths).__name__}"
        )
    inputs = [LengthsInput.of(_lengths_of(values, source)) for source, values in enumerate(values_of)]
    return names or [str(i) for i in range(len(inputs))], inputs


def _lengths_of(values: Any, source: int) -> Any:
    """A ``ShardedSource`` stands for its lengths (from the shards' index, ``length_column``); anything else is one."""
    if not hasattr(values, "length_column") or not hasattr(values, "shard_sizes"):
        return values
    if values.lengths is None:
        raise ValueError(
            f"lengths[{source}] is a ShardedSource without lengths: build it with length_column=... (the column of "
            "token ids or token counts) so that its index holds every document's length"
        )
    return values.lengths


def chunk_table(lengths: LengthsInput, *, shuffle: bool, cache_dir: CacheDir, timeout: float) -> tuple[Any, np.ndarray]:
    """One source's lengths (checked) and chunk totals: from the node's shared index from ``SHARED_FROM`` on.

    The check and the totals read every length once per node: another rank maps two small files
    (its start does not grow with n); small sources are read privately, a compact copy.
    """
    chunks = chunk_count(lengths.size)
    if lengths.size < SHARED_FROM or not isinstance(lengths.values, np.ndarray):
        array = lengths.compact()  # checks every value
        return array, chunk_tokens(array, chunks, strided=shuffle)
    values = lengths.values

    def build(directory: Path) -> None:
        check_non_negative_integers("lengths", values, holds="integers (token counts)", noun="integers")
        np.save(directory / "totals.npy", chunk_tokens(values, chunks, strided=shuffle))

    key = f"{lengths.key}|{chunks}|{'strided' if shuffle else 'contiguous'}"
    arrays = build_or_open(CHUNKS_KIND, key, build, cache_dir=cache_dir, timeout=timeout)
    return values, np.asarray(read_checked(arrays["totals"], arrays["totals"][:]), dtype=np.int64)
