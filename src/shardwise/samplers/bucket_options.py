"""``BucketBatchSampler``'s option enums, plan version and the lengths' digest its state is checked against."""

from __future__ import annotations

import enum
import hashlib

import numpy as np

from ..index import GroupedIndex
from ..index.lengths import LengthsInput


class Oversized(str, enum.Enum):
    """What ``BucketBatchSampler`` does with a sample longer than ``max_tokens``."""

    ERROR = "error"
    """Refuse at construction, naming the first such sample (the default)."""
    SINGLE = "single"
    """Give each such sample a batch of its own (that batch exceeds the budget)."""
    SKIP = "skip"
    """Leave such samples out of every epoch; their indices are in ``sampler.skipped``."""


class BatchOrder(str, enum.Enum):
    """How ``BucketBatchSampler`` orders the batches of a balancing group, and cuts fixed-size batches."""

    MIXED = "mixed"
    """The default: batches of a group in a keyed tree order (random at every scale; every aligned
    power-of-two block of a group a run of cost-neighbours, so steps stay balanced), and fixed-size
    batches cut with samples shuffled among neighbours in length: new contents every epoch."""
    ASCENDING = "ascending"
    """The plan before 0.1 (plan 1): the batches of each group ascend in cost, and fixed-size
    batches over distinct lengths are the same every epoch. States saved before plan 2 load with it."""


PLAN_VERSION = 2
"""``batch_order="mixed"`` plans (1: the ascending order, which states without a plan field hold)."""

SMALL = 1 << 20
"""Below this many samples, in-memory lengths (not a memory map, without an explicit
``cache_dir``) are indexed in private memory (at most 8 MiB, milliseconds), not in the cache."""
_DIGEST_BLOCKS, _DIGEST_BLOCK = 16, 256  # lengths read for the fingerprint: 16 runs of 256


def lengths_digest(lengths: LengthsInput, index: GroupedIndex) -> str:
    """A short digest of the lengths for the state fingerprint, O(distinct lengths), whatever n.

    It covers the number of samples, how many have each length (the index's offsets) and the
    lengths in 16 evenly spaced blocks of 256: other data is refused on resume, without a pass
    over 1e9 lengths at every start (the index key already tracks the input's identity).
    """
    n = len(index)
    hasher = hashlib.blake2b(f"lengths:{n}".encode(), digest_size=8)
    hasher.update(np.ascontiguousarray(index.offsets, dtype=np.int64).tobytes())
    span = min(n, _DIGEST_BLOCK)
    for first in sorted({(n - span) * k // (_DIGEST_BLOCKS - 1) for k in range(_DIGEST_BLOCKS)}):
        block = lengths.read(first, first + span)  # a few pages each, wherever the lengths live
        hasher.update(np.ascontiguousarray(block, dtype=np.int64).tobytes())
    return hasher.hexdigest()
