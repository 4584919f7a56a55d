"""shardwise: correct, fast data sampling for distributed PyTorch training.

Every sampler is one global plan, the same on every rank and independent of the world size,
dealt out to ranks by position, with O(1)-memory shuffles and an O(1) resume state.
"""

from ._bucket import BucketBatchSampler, Oversized
from ._class_balanced import ClassBalancedBatchSampler, SmallClasses
from ._collate import PadCollate, PaddedBatch, pad_collate
from ._errors import MalformedStateError, StateMismatchError
from ._plan import Even
from ._ragged import RaggedArray, RaggedStoreError, RaggedWriter
from ._schedule import BatchSizeSchedule
from ._scheduled import ScheduledBatchSampler
from ._set_epoch import set_epoch
from ._sharded import ShardedSampler
from ._two_stream import TwoStreamBatchSampler
from ._weighted import WeightedSampler
from ._worker_seeds import seed_worker, worker_seed, worker_seeds
from ._wrappers import ShardedBatchWrapper, ShardedWrapper, shard, shard_batches

__version__ = "0.1.0"

__all__ = [
    "BatchSizeSchedule",
    "BucketBatchSampler",
    "ClassBalancedBatchSampler",
    "Even",
    "MalformedStateError",
    "Oversized",
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
    "TwoStreamBatchSampler",
    "WeightedSampler",
    "__version__",
    "pad_collate",
    "seed_worker",
    "set_epoch",
    "shard",
    "shard_batches",
    "worker_seed",
    "worker_seeds",
]
