"""shardwise: correct, fast data sampling for distributed PyTorch training.

Every sampler is one global plan, the same on every rank and independent of the world size,
dealt out to ranks by position, with O(1)-memory shuffles and an O(1) resume state.
"""

import functools
import importlib
from typing import TYPE_CHECKING, Any

from ._core.version import __version__ as __version__

# NOTE [ A light import shardwise ]
# ``import shardwise`` imports no torch: every public name is imported from its module on first use
# (PEP 562), so that ``shardwise --version``, whose entry point ``shardwise.tools.cli`` runs this file
# first, answers without importing torch (0.3 s instead of seconds). ``from shardwise import X`` works
# as before.
#
# NOTE [ The public names, listed once ]
# The imports below are the one list of public names: type checkers and IDEs read them (``X as X``
# marks a re-export for mypy's strict mode and pyright), and at runtime, where TYPE_CHECKING is false,
# :func:`_public` reads the same block from this file, once, at the first name asked for, to learn
# which module defines each name; ``__all__`` is those names and ``__version__``. A new public name
# is one line here. tests/contract/test_api.py checks that no second list appears.
#
# NOTE [ Public names, public modules ]
# A public name defined in a private module (``shardwise._core...``) says ``__module__ == "shardwise"``
# (set by ``_core.public.public`` at the end of its defining module, which resolves a class's string
# annotations there first, for typing.get_type_hints), so that help(), reprs, tracebacks and pickles
# name where a user imports it; pickle finds it here through __getattr__.
if TYPE_CHECKING:
    from ._core.adaptive import SourceStatistics as SourceStatistics
    from ._core.adaptive import WeightLedger as WeightLedger
    from ._core.adaptive_policies import AdaptiveWeights as AdaptiveWeights
    from ._core.adaptive_policies import Exp3 as Exp3
    from ._core.adaptive_policies import ExponentiatedGradient as ExponentiatedGradient
    from ._core.adaptive_policies import PolicyStep as PolicyStep
    from ._core.errors import MalformedStateError as MalformedStateError
    from ._core.errors import StateMismatchError as StateMismatchError
    from ._core.mixture import MixtureStop as MixtureStop
    from ._core.mixture import PendingWeightsError as PendingWeightsError
    from ._core.packing import PackedIndex as PackedIndex
    from ._core.packing import TooLong as TooLong
    from ._core.plan import Even as Even
    from ._core.schedule import BatchSizeSchedule as BatchSizeSchedule
    from ._core.weights import WeightSchedule as WeightSchedule
    from ._core.weights import temperature_weights as temperature_weights
    from .data.collate import PadCollate as PadCollate
    from .data.collate import PaddedBatch as PaddedBatch
    from .data.collate import pad_collate as pad_collate
    from .data.mixture import Mixture as Mixture
    from .data.packed_batch import PackedBatch as PackedBatch
    from .data.packed_dataset import PackedDataset as PackedDataset
    from .data.packed_dataset import PackedSample as PackedSample
    from .data.packing import PackCollate as PackCollate
    from .data.packing import pack_collate as pack_collate
    from .data.ragged import RaggedArray as RaggedArray
    from .data.ragged import RaggedStoreError as RaggedStoreError
    from .data.ragged import RaggedWriter as RaggedWriter
    from .data.sharded import ShardCache as ShardCache
    from .data.sharded import ShardedSource as ShardedSource
    from .data.sharded import ShardError as ShardError
    from .index.arrow import column as column
    from .samplers.bucket import BucketBatchSampler as BucketBatchSampler
    from .samplers.bucket_options import BatchOrder as BatchOrder
    from .samplers.bucket_options import Oversized as Oversized
    from .samplers.class_balanced import ClassBalancedBatchSampler as ClassBalancedBatchSampler
    from .samplers.class_balanced import SmallClasses as SmallClasses
    from .samplers.locality import LocalitySampler as LocalitySampler
    from .samplers.mixture import MixtureSampler as MixtureSampler
    from .samplers.packed import PackedBatchSampler as PackedBatchSampler
    from .samplers.packed_mixture import PackedMixtureSampler as PackedMixtureSampler
    from .samplers.provenance import ProvenanceUnsupported as ProvenanceUnsupported
    from .samplers.provenance import Trained as Trained
    from .samplers.provenance import TrainedBatch as TrainedBatch
    from .samplers.provenance import skip_steps as skip_steps
    from .samplers.provenance import when as when
    from .samplers.provenance import which as which
    from .samplers.rebase import rebase_state as rebase_state
    from .samplers.scheduled import ScheduledBatchSampler as ScheduledBatchSampler
    from .samplers.set_epoch import set_epoch as set_epoch
    from .samplers.sharded import ShardedSampler as ShardedSampler
    from .samplers.two_stream import TwoStreamBatchSampler as TwoStreamBatchSampler
    from .samplers.weighted import WeightedSampler as WeightedSampler
    from .samplers.worker_seeds import seed_worker as seed_worker
    from .samplers.worker_seeds import worker_seed as worker_seed
    from .samplers.worker_seeds import worker_seeds as worker_seeds
    from .samplers.wrappers import ShardedBatchWrapper as ShardedBatchWrapper
    from .samplers.wrappers import ShardedWrapper as ShardedWrapper
    from .samplers.wrappers import shard as shard
    from .samplers.wrappers import shard_batches as shard_batches
    from .tools.verify import VerifyReport as VerifyReport
    from .tools.verify import verify as verify

_SUBPACKAGES = frozenset({"_core", "data", "index", "integrations", "samplers", "tools"})


@functools.cache
def _public() -> dict[str, str]:
    """Each public name and the module (relative to this package) that defines it: the TYPE_CHECKING block."""
    import ast

    with open(__file__, encoding="utf-8") as file:
        tree = ast.parse(file.read())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.name: "." * node.level + (node.module or "") for node in block.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "__all__":
        value: Any = sorted([*_public(), "__version__"])
    elif name in _public():
        value = getattr(importlib.import_module(_public()[name], __name__), name)
    elif name in _SUBPACKAGES:  # ``import shardwise; shardwise.samplers...`` worked when this file imported them
        return importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'shardwise' has no attribute {name!r}")
    globals()[name] = value  # imported once: later reads do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_public()) | {"__all__"})
