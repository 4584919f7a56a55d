"""shardwise: correct, fast data sampling for distributed PyTorch training.

Every sampler is one global plan, the same on every rank and independent of the world size,
dealt out to ranks by position, with O(1)-memory shuffles and an O(1) resume state.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._core.version import __version__

# NOTE [ A light import shardwise ]
# ``import shardwise`` imports no torch: every public name is imported from its module on first use
# (PEP 562), so that ``shardwise --version``, whose entry point ``shardwise.tools.cli`` runs this file
# first, answers without importing torch (0.3 s instead of seconds). ``from shardwise import X`` works
# as before; type checkers and IDEs read the imports below. tests/contract/test_api.py checks that
# the table and the imports name the same modules, and __all__ the same names.
_SOURCES: dict[str, str] = {
    "AdaptiveWeights": "._core.adaptive_policies",
    "BatchOrder": ".samplers.bucket_options",
    "BatchSizeSchedule": "._core.schedule",
    "BucketBatchSampler": ".samplers.bucket",
    "ClassBalancedBatchSampler": ".samplers.class_balanced",
    "Even": "._core.plan",
    "Exp3": "._core.adaptive_policies",
    "ExponentiatedGradient": "._core.adaptive_policies",
    "LocalitySampler": ".samplers.locality",
    "MalformedStateError": "._core.errors",
    "Mixture": ".data.mixture",
    "MixtureSampler": ".samplers.mixture",
    "MixtureStop": "._core.mixture",
    "Oversized": ".samplers.bucket_options",
    "PackCollate": ".data.packing",
    "PackedBatch": ".data.packed_batch",
    "PackedBatchSampler": ".samplers.packed",
    "PackedDataset": ".data.packed_dataset",
    "PackedIndex": "._core.packing",
    "PackedMixtureSampler": ".samplers.packed_mixture",
    "PackedSample": ".data.packed_dataset",
    "PadCollate": ".data.collate",
    "PendingWeightsError": "._core.mixture",
    "PolicyStep": "._core.adaptive_policies",
    "PaddedBatch": ".data.collate",
    "ProvenanceUnsupported": ".samplers.provenance",
    "RaggedArray": ".data.ragged",
    "RaggedStoreError": ".data.ragged",
    "RaggedWriter": ".data.ragged",
    "ScheduledBatchSampler": ".samplers.scheduled",
    "ShardCache": ".data.sharded",
    "ShardError": ".data.sharded",
    "ShardedBatchWrapper": ".samplers.wrappers",
    "ShardedSampler": ".samplers.sharded",
    "ShardedSource": ".data.sharded",
    "ShardedWrapper": ".samplers.wrappers",
    "SmallClasses": ".samplers.class_balanced",
    "SourceStatistics": "._core.adaptive",
    "StateMismatchError": "._core.errors",
    "TooLong": "._core.packing",
    "Trained": ".samplers.provenance",
    "TrainedBatch": ".samplers.provenance",
    "TwoStreamBatchSampler": ".samplers.two_stream",
    "WeightLedger": "._core.adaptive",
    "WeightSchedule": "._core.weights",
    "WeightedSampler": ".samplers.weighted",
    "column": ".index.arrow",
    "pack_collate": ".data.packing",
    "pad_collate": ".data.collate",
    "rebase_state": ".samplers.rebase",
    "seed_worker": ".samplers.worker_seeds",
    "set_epoch": ".samplers.set_epoch",
    "shard": ".samplers.wrappers",
    "shard_batches": ".samplers.wrappers",
    "skip_steps": ".samplers.provenance",
    "temperature_weights": "._core.weights",
    "when": ".samplers.provenance",
    "which": ".samplers.provenance",
    "worker_seed": ".samplers.worker_seeds",
    "worker_seeds": ".samplers.worker_seeds",
    "VerifyReport": ".tools.verify",
    "verify": ".tools.verify",
}
"""Each public name and the module (relative to this package) that defines it."""

_SUBPACKAGES = frozenset({"_core", "data", "index", "integrations", "samplers", "tools"})

if TYPE_CHECKING:
    from ._core.adaptive import SourceStatistics, WeightLedger
    from ._core.adaptive_policies import AdaptiveWeights, Exp3, ExponentiatedGradient, PolicyStep
    from ._core.errors import MalformedStateError, StateMismatchError
    from ._core.mixture import MixtureStop, PendingWeightsError
    from ._core.packing import PackedIndex, TooLong
    from ._core.plan import Even
    from ._core.schedule import BatchSizeSchedule
    from ._core.weights import WeightSchedule, temperature_weights
    from .data.collate import PadCollate, PaddedBatch, pad_collate
    from .data.mixture import Mixture
    from .data.packed_batch import PackedBatch
    from .data.packed_dataset import PackedDataset, PackedSample
    from .data.packing import PackCollate, pack_collate
    from .data.ragged import RaggedArray, RaggedStoreError, RaggedWriter
    from .data.sharded import ShardCache, ShardedSource, ShardError
    from .index.arrow import column
    from .samplers.bucket import BucketBatchSampler
    from .samplers.bucket_options import BatchOrder, Oversized
    from .samplers.class_balanced import ClassBalancedBatchSampler, SmallClasses
    from .samplers.locality import LocalitySampler
    from .samplers.mixture import MixtureSampler
    from .samplers.packed import PackedBatchSampler
    from .samplers.packed_mixture import PackedMixtureSampler
    from .samplers.provenance import ProvenanceUnsupported, Trained, TrainedBatch, skip_steps, when, which
    from .samplers.rebase import rebase_state
    from .samplers.scheduled import ScheduledBatchSampler
    from .samplers.set_epoch import set_epoch
    from .samplers.sharded import ShardedSampler
    from .samplers.two_stream import TwoStreamBatchSampler
    from .samplers.weighted import WeightedSampler
    from .samplers.worker_seeds import seed_worker, worker_seed, worker_seeds
    from .samplers.wrappers import ShardedBatchWrapper, ShardedWrapper, shard, shard_batches
    from .tools.verify import VerifyReport, verify


def __getattr__(name: str) -> Any:
    if name in _SOURCES:
        value = getattr(importlib.import_module(_SOURCES[name], __name__), name)
        globals()[name] = value  # imported once: later reads do not come here
        return value
    if name in _SUBPACKAGES:  # ``import shardwise; shardwise.samplers...`` worked when this file imported them
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'shardwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AdaptiveWeights",
    "BatchOrder",
    "BatchSizeSchedule",
    "BucketBatchSampler",
    "ClassBalancedBatchSampler",
    "Even",
    "Exp3",
    "ExponentiatedGradient",
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
    "PackedMixtureSampler",
    "PackedSample",
    "PadCollate",
    "PaddedBatch",
    "PendingWeightsError",
    "PolicyStep",
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
    "SourceStatistics",
    "StateMismatchError",
    "TooLong",
    "Trained",
    "TrainedBatch",
    "TwoStreamBatchSampler",
    "VerifyReport",
    "WeightLedger",
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
