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
from .data.packed_batch import PackedBatch
from .data.packed_dataset import PackedDataset, PackedSample
from .data.packing import PackCollate, pack_collate
from .data.ragged import RaggedArray, RaggedStoreError, RaggedWriter
from .data.sharded import ShardCache, ShardedSource, ShardError
from .index.arrow import column
from .samplers.bucket import BucketBatchSampler, Oversized
from .samplers.class_balanced import ClassBalancedBatchSampler, SmallClasses
from .samplers.locality import LocalitySampler
from .samplers.mixture import MixtureSampler
from .samplers.packed import PackedBatchSampler
from .samplers.provenance import ProvenanceUnsupported, Trained, TrainedBatch, skip_steps, when, which
from .samplers.rebase import rebase_state
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
    "LocalitySampler",
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
    "ProvenanceUnsupported",
    "RaggedArray",
    "RaggedStoreError",
    "RaggedWriter",
    "ScheduledBatchSampler",
    "ShardCache",
    "ShardError",
    "ShardedBatchWrapper",
    "ShardedSampler",
    "ShardedSource",
    "ShardedWrapper",
    "SmallClasses",
    "StateMismatchError",
    "TooLong",
    "Trained",
    "TrainedBatch",
    "TwoStreamBatchSampler",
    "VerifyReport",
    "WeightSchedule",
    "WeightedSampler",
    "__version__",
    "column",
    "pack_collate",
    "pad_collate",
    "rebase_state",
    "seed_worker",
    "set_epoch",
    "shard",
    "shard_batches",
    "skip_steps",
    "temperature_weights",
    "verify",
    "when",
    "which",
    "worker_seed",
    "worker_seeds",
]
