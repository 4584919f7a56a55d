"""Sharded datasets on disk or object storage: Parquet, Arrow IPC and WebDataset tar shards.

- :class:`ShardedSource` (``source``): a map-style dataset of global sample ids over shard URLs,
  with per-shard counts (and length/label columns) read from metadata once per node.
- :class:`ShardCache` (``cache``): the node cache that downloads each remote shard once per node,
  prefetches in plan order and stays within a byte budget.
- ``rows``: a sample's values as Python objects, numpy arrays or tensors (``output_format``).
- ``formats``: the readers (pyarrow is an optional extra: ``pip install 'shardwise[sharded]'``).

Sample them with :class:`shardwise.samplers.locality.LocalitySampler` (reads ``window`` shards at a
time) or any other shardwise sampler. See docs/sharded.md.
"""

from .cache import ShardCache
from .formats import Format, ShardError
from .rows import OutputFormat
from .source import ShardedSource

__all__ = ["Format", "OutputFormat", "ShardCache", "ShardError", "ShardedSource"]
