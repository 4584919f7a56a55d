"""shardwise: correct, fast data sampling for distributed PyTorch training.

Every sampler is one global plan, the same on every rank and independent of the world size,
dealt out to ranks by position, with O(1)-memory shuffles and an O(1) resume state.
"""

from typing import Any

from ._core.errors import MalformedStateError, StateMismatchError
from ._core.mixture import MixtureStop
from ._core.packing import PackedIndex, TooLong
from ._core.plan import Even
from ._core.schedule import BatchSizeSchedule
from ._core.version import __version__
from ._core.weights import WeightSchedule, temperature_weights
from .data.collate import PadCollate, PaddedBatch, pad_collate
from .data.mixture import Mixture
from .data.packing import PackCollate, PackedBatch, PackedDataset, PackedSample, pack_collate
from .data.ragged import RaggedArray, RaggedStoreError, RaggedWriter
from .index.arrow import column
from .samplers.bucket import BucketBatchSampler, Oversized
from .samplers.class_balanced import ClassBalancedBatchSampler, SmallClasses
from .samplers.mixture import MixtureSampler
from .samplers.packed import PackedBatchSampler
from .samplers.scheduled import ScheduledBatchSampler
from .samplers.set_epoch import set_epoch
from .samplers.sharded import ShardedSampler
from .samplers.two_stream import TwoStreamBatchSampler
from .samplers.weighted import WeightedSampler
from .samplers.worker_seeds import seed_worker, worker_seed, worker_seeds
from .samplers.wrappers import ShardedBatchWrapper, ShardedWrapper, shard, shard_batches

_LAZY = {"verify": "verify", "VerifyReport": "VerifyReport"}
"""Names served from shardwise.tools.verify on first use, so ``import shardwise`` stays light."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from .tools import verify as _verify

        return getattr(_verify, _LAZY[name])
    raise AttributeError(f"module 'shardwise' has no attribute {name!r}")


__all__ = [
    "BatchSizeSchedule",
    "BucketBatchSampler",
    "ClassBalancedBatchSampler",
    "Even",
    "MalformedStateError",
    "Mixture",
    "MixtureSampler",
    "MixtureStop",
    "Oversized",
    "PackCollate",
    "PackedBatch",
    "PackedBatchSampler",
    "PackedDataset",
    "PackedIndex",
    "PackedSample",
    "PadCollate",
    "PaddedBatch",
    "RaggedArray",
    "RaggedStoreError",
    "RaggedWriter",
    "ScheduledBatchSampler",
    "ShardedBatchWrapper",
    "ShardedSampler",
    "ShardedWrapper",
    "SmallClasses",
    "StateMismatchError",
    "TooLong",
    "TwoStreamBatchSampler",
    "VerifyReport",
    "WeightSchedule",
    "WeightedSampler",
    "__version__",
    "column",
    "pack_collate",
    "pad_collate",
    "seed_worker",
    "set_epoch",
    "shard",
    "shard_batches",
    "temperature_weights",
    "verify",
    "worker_seed",
    "worker_seeds",
]
