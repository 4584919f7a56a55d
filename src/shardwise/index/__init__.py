"""The shared index layer: what a plan needs in O(n) is built once per node and memory-mapped.

Samplers keep O(1) private memory per rank at any n by reading O(n) structures (indices sorted by
length, indices grouped by label, weight tables) from files that every rank and DataLoader worker
of a node maps read-only, instead of building them per rank and per epoch. This layer sits
between ``_core`` (pure numpy) and ``samplers``: it imports ``_core``, numpy and filelock.

API (stable; samplers and other layers build on it):

- :func:`build_or_open(kind, key, build, *, cache_dir=None, timeout=600) <build_or_open>`:
  ``{name: read-only numpy.memmap}`` of every ``<name>.npy`` that ``build(directory)`` wrote.
  Content-addressed by ``(kind, key, FORMAT_VERSION)``; written atomically (temporary directory,
  fsync, rename); concurrent starters: one builds under a file lock, the others wait up to
  ``timeout`` seconds (then :class:`IndexCacheTimeout`, never a hang; they say once what they wait
  for); a truncated, corrupt or foreign entry is detected (manifest: sizes, headers, sampled and
  full CRC-32, value ranges; see :mod:`shardwise.index.integrity`) and rebuilt; a disabled
  (``SHARDWISE_CACHE=off``, ``cache_dir=False``) or read-only cache builds in private memory with
  one warning stating the cost; a ``cache_dir`` that is a file or cannot be created raises
  :class:`IndexCacheError` (a ``ValueError``) naming ``cache_dir``. Default directory:
  ``$SHARDWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardwise``, else ``~/.cache/shardwise``
  (:func:`default_cache_dir`). ``replaces=`` (a predicate on keys of the same kind) lets the
  process that builds an entry remove the entries it supersedes, e.g. earlier epochs' plans.
- :func:`remove_entries(root, kind, stale) <remove_entries>`: remove the entries of ``kind`` in a
  cache directory whose manifest key satisfies ``stale``; tolerant of concurrent removal.
- :func:`key_of(values) <key_of>`: a content key that is O(1) for memory-mapped arrays (file
  identity + sampled blocks) and ragged stores (their offsets checksum), a full BLAKE2b for
  in-memory arrays (see :mod:`shardwise.index.keys` for the trade-off).
- :func:`order_by_key(keys, directory, *, name="order", param="keys", num_keys=None)
  <order_by_key>`: a chunked stable counting sort writing ``<name>.npy`` (indices sorted by key;
  uint32 below 2**32 samples, else int64) and ``<name>_offsets.npy`` (``(K + 1,)`` int64), with
  O(chunk + K) private memory; :func:`key_counts` is its first pass; :class:`OffsetLengths` reads
  a ragged store's lengths from its offsets a slice at a time.
- :class:`GroupedIndex(order, offsets) <GroupedIndex>`: ``members(groups, ranks, key=...)`` is
  the ``ranks``-th sample of each group in the keyed per-epoch order (:func:`permute_within`, a
  Feistel bijection per group; :func:`group_keys` derives per-group keys): per-epoch randomness
  inside groups, O(1) per lookup, never a per-epoch argsort.
- :func:`length_index(lengths, *, cache_dir=None, timeout=600) <length_index>`: the
  :class:`GroupedIndex` of samples grouped by length (kind ``"length-order"``), from an array, a
  memory map or a ragged store (whose own ``index/`` directory is used, and which
  ``RaggedWriter`` fills at write time).
- :class:`~shardwise.index.labels.LabelsInput` / :class:`~shardwise.index.weights.WeightsInput`:
  ``LabelsInput.of(labels, cache_dir=..., timeout=...)`` resolves and checks labels once and holds
  their class index (``classes``, ``counts``, ``members``, ``digest``; kind ``"class-index-v1"``),
  ``WeightsInput.of(weights, ...)`` likewise the weight table (kind ``"weight-table-v1"``), each
  built on first read; the three inputs (with ``LengthsInput``) read an array through one step,
  :func:`~shardwise.index.inputs.input_array`; the other O(n) tables a sampler needs are built here too, through
  :func:`~shardwise.index.tables.shared_arrays` (the cache for large inputs, private memory below
  65,536 entries): ``PackedBatchSampler``'s item index and strata layouts (:mod:`.packing`).
- :func:`column(source, name, *, kind="values", cache_dir=None) <column>`: a column of an HF
  ``datasets.Dataset``, a ``pyarrow`` Table/Array or Parquet files as a read-only numpy array (row
  lengths from the Arrow offsets, or values), cached per node (kind ``"arrow-column"``) when the
  source has a file identity; ``pyarrow`` is the optional ``arrow`` extra (:mod:`shardwise.index.arrow`).
- :func:`read_checked(source, values) <read_checked>`: ``values`` just read from an index array
  ``source``, checked against the range its builder recorded and the entry's verification state
  (:class:`IndexCorruptError` if damaged): what every sampler calls on the values a batch takes.
- :func:`set_progress` / ``SHARDWISE_PROGRESS=off``: the one switch of build progress and waiting lines.
"""

from .arrow import column
from .builders import OffsetLengths, index_dtype, key_counts, order_by_key
from .cache import (
    DEFAULT_TIMEOUT,
    IndexCacheTimeout,
    build_or_open,
    cache_enabled,
    default_cache_dir,
    entry_name,
    remove_entries,
)
from .grouped import GroupedIndex, group_keys, permute_within
from .integrity import IndexCorruptError, read_checked
from .keys import key_of
from .lengths import LENGTH_KIND, length_index, store_index_dir
from .manifest import FORMAT_VERSION, IndexCacheError
from .progress import progress_enabled, set_progress

__all__ = [
    "DEFAULT_TIMEOUT",
    "FORMAT_VERSION",
    "LENGTH_KIND",
    "GroupedIndex",
    "IndexCacheError",
    "IndexCacheTimeout",
    "IndexCorruptError",
    "OffsetLengths",
    "build_or_open",
    "cache_enabled",
    "column",
    "default_cache_dir",
    "entry_name",
    "group_keys",
    "index_dtype",
    "key_counts",
    "key_of",
    "length_index",
    "order_by_key",
    "permute_within",
    "progress_enabled",
    "read_checked",
    "remove_entries",
    "set_progress",
    "store_index_dir",
]
