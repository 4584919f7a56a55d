"""``BucketBatchSampler``'s option enums and plan version."""

from __future__ import annotations

import enum


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
