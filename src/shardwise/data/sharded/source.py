"""``ShardedSource``: a map-style dataset of global sample ids over shard files, local or remote.

Global ids number the samples shard by shard, in the order of the URLs: shard ``s`` holds ids
``[starts[s], starts[s] + shard_sizes[s])``. Because the source is an ordinary sized dataset,
every shardwise sampler works over it (``ShardedSampler``, ``BucketBatchSampler`` over
``source.lengths``, ``ClassBalancedBatchSampler`` over ``source.labels``, ``MixtureSampler`` over
several sources); :class:`~shardwise.samplers.locality.LocalitySampler` also reads few shards at a
time and tells the source which shards come next, so the node cache prefetches them.

The per-shard counts (and the length and label columns, if asked) are read from the shards'
metadata once per node and kept in the shared index cache (``metadata``), keyed by every shard's
URL, size and ETag or modification time: a changed shard is read again, and a shard changed after
indexing is refused when it is fetched or opened (``fetch``).

Cost at 1e9 samples in 1e5 shards: shard counts and offsets, ~1.6 MB memory-mapped and shared by
the node; a length or label column is 8 bytes a sample, memory-mapped (shared, not private).
"""

from __future__ import annotations

import copy
import enum
import functools
import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from ..._core.errors import check_cache_dir, check_choice, check_int, check_iterable, check_str
from ..._core.locality import split_wrap
from ..._core.streams import Mixing
from ...index.cache import CacheDir
from . import early
from . import head as heads
from .cache import Derived, Head, ShardCache
from .fetch import is_local, version_of
from .formats import Format, ShardError, ShardReader, decode_parquet, format_of, missing_columns, pyarrow
from .metadata import expand_urls, read_metadata, stat_shards
from .rows import NumericColumns, OutputFormat, UnconvertedTable, cut_rows, numeric_columns, table_rows, tables_rows

OPEN_SHARDS = 16  # shards kept decoded per process by default: a window of the plan, bounded memory
_PREFETCH_AHEAD = 1  # windows prefetched after the ones being read
_OPEN_ATTEMPTS = 3  # fetches of a shard that other processes evict before it is opened


class Decode(enum.Enum):
    """Where a Parquet shard is decoded: once per node into the cache, or by each worker that reads it."""

    NODE = "node"
    WORKER = "worker"


class ShardedSource(Dataset[dict[str, Any]]):
    """A map-style dataset over Parquet, Arrow IPC or WebDataset tar shards, on disk or object storage.

    Args:
        urls: shard URLs (local paths or fsspec URLs such as ``s3://bucket/a.parquet``), a glob, or a
            folder (an HF ``datasets`` ``save_to_disk`` folder: its ``.arrow`` files).
        format: ``"parquet"``, ``"arrow"`` or ``"webdataset"``; default: from the URLs' suffix.
        columns: the columns a sample holds (Parquet, Arrow); ``None``: all.
        length_column: a column giving each sample's length (integers, or strings/lists whose
            lengths are taken), served as ``lengths`` for bucketing and packing.
        label_column: an integer column served as ``labels`` for class-balanced batches.
        cache: the node cache of remote shards and of decoded Parquet shards (:class:`ShardCache`);
            default: one in the default directory, without a byte budget.
        storage_options: fsspec options for the URLs (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``).
        index_dir: where the metadata index lives (``shardwise.index`` cache); ``False``: in memory.
        open_shards: shards kept open (decoded) per process; raised to ``window + 1`` when a
            ``LocalitySampler`` drives the source. Private memory grows with it, not with n.
        output_format: what a sample's values are, as HF ``datasets``' ``with_format`` types:
            ``"python"`` (default: ints, floats, strings, lists), ``"numpy"`` (numbers as numpy
            scalars, lists of numbers as 1-D arrays) or ``"torch"`` (the same as tensors).
            Strings, binaries, nested lists and columns with missing values stay Python values;
            WebDataset rows are bytes in every format. Arrays cross from DataLoader workers as
            one buffer each, where lists pickle element by element (a batch of 32 samples of 300
            ints: 0.35 ms to convert, pickle and unpickle as numpy, 0.62 ms as lists).
            :meth:`with_format` gives a copy in another format.
        decode: where Parquet shards are decoded: ``"node"`` (default: once per node, by
            whichever process needs the shard first, usually a prefetch thread, into an
            uncompressed Arrow IPC file the cache keeps and every worker memory-maps; local
            shards too, read where they lie; the cache's ``budget_bytes`` counts these files,
            which are larger than the Parquet they come from) or ``"worker"`` (each DataLoader
            worker decodes each shard it opens, each epoch: the cache keeps a remote Parquet
            file as fetched, and a local one is read in place, nothing written).

    Example:
        >>> source = ShardedSource(["s3://bucket/train-0.parquet", "s3://bucket/train-1.parquet"])  # doctest: +SKIP
        >>> sampler = LocalitySampler(source, window=8)  # doctest: +SKIP
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str],
        *,
        format: str | Format | None = None,  # the name users know from datasets.load_dataset
        columns: Sequence[str] | None = None,
        length_column: str | None = None,
        label_column: str | None = None,
        cache: ShardCache | None = None,
        storage_options: dict[str, Any] | None = None,
        index_dir: CacheDir = None,
        open_shards: int = OPEN_SHARDS,
        output_format: str | OutputFormat = "python",
        decode: str | Decode = "node",
    ) -> None:
        # Every argument is checked before any I/O (listing the URLs, reading metadata).
        self.open_shards = check_int("open_shards", open_shards, minimum=1)
        self.output_format = check_choice("output_format", output_format, OutputFormat)
        self.decode = check_choice("decode", decode, Decode)
        given_format = None if format is None else check_choice("format", format, Format)
        self.columns = None if columns is None else [
            check_str("columns[]", c) for c in check_iterable("columns", columns, of="column names (str)")
        ]
        self.length_column = None if length_column is None else check_str("length_column", length_column)
        self.label_column = None if label_column is None else check_str("label_column", label_column)
        if cache is not None and not isinstance(cache, ShardCache):
            raise TypeError(f"cache should be a ShardCache or None, but got cache={cache!r} ({type(cache).__name__})")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError("storage_options should be a dict of fsspec options or None, but got "
                            f"storage_options={storage_options!r} ({type(storage_options).__name__})")
        index_dir = check_cache_dir(index_dir, name="index_dir")
        self.storage_options = dict(storage_options or (cache.storage_options if cache is not None else {}))
        self.cache = cache if cache is not None else ShardCache(storage_options=self.storage_options)
        self.urls = expand_urls(urls, self.storage_options, shared=self.cache.directory)  # a folder: listed once a node
        if given_format is None:
            found = {format_of(u) for u in self.urls}
            if len(found) != 1 or None in found:
                raise ValueError(
                    "format should be given when the URLs' suffixes do not name one format, but got "
                    f"urls={self.urls[:3]!r}...; pass format='parquet', 'arrow' or 'webdataset'"
                )
            given_format = found.pop()
        self.format = check_choice("format", given_format, Format)
        if self.format is not Format.WEBDATASET:
            # Imported here, in the process that builds the DataLoader, so that forked workers
            # inherit it: imported in each worker instead, it cost ~0.13 s of CPU per worker per
            # epoch (workers are forked anew each epoch), most of a warm epoch's start-up.
            pyarrow()
        arrays = self._metadata(index_dir)
        self.shard_sizes: np.ndarray = arrays["counts"]
        self.file_sizes: np.ndarray = arrays["bytes"]
        self._starts = np.concatenate([[0], np.cumsum(self.shard_sizes, dtype=np.int64)])
        self.lengths: np.ndarray | None = arrays.get("lengths")
        self.labels: np.ndarray | None = arrays.get("labels")
        if self.columns is not None and self.format is not Format.WEBDATASET:  # a tar's members: read as they come
            # Refused now rather than at the first read.
            missing = missing_columns(self.columns, names := arrays["names"].tolist())
            if missing:
                raise ValueError(f"columns should name columns of the shards, but got columns={self.columns!r}, and "
                                 f"no column {missing[0]!r} is in every shard; the columns every shard has are {names}")
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._pass: Any = None  # the plan of the pass followed (follow_plan): a new one fetches its first rows first
        self._decoded: Derived | None = None  # what the cache keeps of a shard instead of it
        if self.format is Format.PARQUET and self.decode is Decode.NODE:
            # The cache names it by the shard's URL and version; the tag adds how it is made (the columns).
            tag = hashlib.blake2b(json.dumps(["parquet-to-arrow", self.columns]).encode(), digest_size=8).hexdigest()
            self._decoded = Derived(f"{tag}.arrow", functools.partial(decode_parquet, columns=self.columns))

    # -- metadata ------------------------------------------------------------------------------
    def _metadata(self, index_dir: CacheDir) -> dict[str, np.ndarray]:
        stats = stat_shards(self.urls, self.cache.filesystem, shared=self.cache.directory)  # once a node
        # What a sampler's state records of this data (shardwise.samplers.identity): every shard's URL, size, version.
        self.data_fingerprint = hashlib.blake2b(json.dumps(stats).encode(), digest_size=8).hexdigest()
        # Each shard's URL, size and version as 8 bytes (0.8 MB at 1e5 shards): the cache names its
        # copy by it, so a shard rewritten in place, even at the same size, is fetched again, and a
        # fetch or open of the shard is checked against it (fetch.check_unchanged).
        self._versions = np.asarray([int(version_of(stat), 16) for stat in stats], dtype=np.uint64)
        return read_metadata(stats, self.format, self.length_column, self.label_column, self.cache.filesystem,
                             index_dir)

    # -- samples -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._starts[-1])

    def shard_of(self, index: int) -> int:
        """The shard holding global sample ``index``."""
        return int(np.searchsorted(self._starts, index, side="right")) - 1

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = check_int("index", index, minimum=0, maximum=len(self) - 1)
        shard = self.shard_of(index)
        reader = self._reader(shard, index)
        try:
            if reader.numeric is not None:
                return cut_rows([reader.numeric], [index - int(self._starts[shard])], self.output_format)[0]
            return reader.row(index - int(self._starts[shard]))
        except (OSError, ValueError) as error:
            raise self._unreadable(shard, index, error) from error

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The samples ``indices``, in that order: what ``[self[i] for i in indices]`` returns.

        The DataLoader's fetcher calls it with a batch's indices (in every worker). Rows of open
        shards of numbers and lists of numbers (numpy, torch) are cut from numpy views in one loop
        over the batch (``rows.cut_rows``); the other shards, taken in the order they first appear,
        give their rows with one ``take`` each, and those are converted at once (Parquet, Arrow: one
        conversion a column, not one a shard). Errors name the same sample and shard as reading one
        by one would (the first index of the first shard that fails: open numeric shards cannot).
        Cost: O(batch) per call; ~1 us a row of two columns from open numeric shards.
        """
        try:
            ids = np.asarray(indices)
        except (TypeError, ValueError):
            ids = np.asarray([-1])
        if ids.ndim == 1 and ids.size == 0:
            return []
        wanted = ids.tolist() if ids.ndim == 1 and ids.dtype.kind in "iu" else [-1]
        if min(wanted) < 0 or max(wanted) >= len(self):  # read one by one, for the very error __getitem__ raises
            return [self[i] for i in indices]
        shards, local = self._locate(ids.astype(np.int64, copy=False))
        numeric = self._open_numeric(shards)
        if len(numeric) == len(set(shards)):  # every shard open (a warm batch): one loop over the rows
            return cut_rows([numeric[shard] for shard in shards], local, self.output_format)
        rows = self._read_apart(shards, local, wanted, numeric)
        if numeric:
            # Views of shards evicted meanwhile (open_shards) stay valid: Arrow unmaps a file when no view is left.
            cut = [p for p, shard in enumerate(shards) if shard in numeric]
            for position, row in zip(cut, cut_rows([numeric[shards[p]] for p in cut], [local[p] for p in cut],
                                                   self.output_format), strict=True):
                rows[position] = row
        return rows

    def _locate(self, ids: np.ndarray) -> tuple[list[int], list[int]]:
        """The shard of each global sample id, and its row in the shard."""
        found = np.searchsorted(self._starts, ids, side="right") - 1
        return found.tolist(), (ids - self._starts[found]).tolist()

    def _open_numeric(self, shards: list[int]) -> dict[int, NumericColumns]:
        """The numeric columns of the open shards among ``shards`` (numpy, torch), each marked as just used."""
        numeric: dict[int, NumericColumns] = {}
        if self.output_format is not OutputFormat.PYTHON:
            for shard in dict.fromkeys(shards):
                reader = self._readers.get(shard)
                if reader is not None and reader.numeric is not None:
                    self._readers.move_to_end(shard)
                    numeric[shard] = reader.numeric
        return numeric

    def _read_apart(self, shards: list[int], local: list[int], wanted: list[int],
                    numeric: dict[int, NumericColumns]) -> list[dict[str, Any]]:
        """The rows of the shards not in ``numeric``, shard by shard in order of first appearance (``{}`` elsewhere);
        a shard opened now whose rows are cut from numpy views is added to ``numeric`` instead."""
        groups = _by_shard(shards, numeric)
        rows: list[dict[str, Any]] = [{}] * len(wanted)
        tables: list[tuple[int, Any]] = []  # (shard, its rows unconverted), in order of first appearance
        for shard, positions in groups.items():
            taken = self._rows_of(shard, [local[p] for p in positions], wanted[positions[0]])
            if isinstance(taken, NumericColumns):  # opened now: cut with the others
                numeric[shard] = taken
            elif isinstance(taken, list):
                for position, row in zip(positions, taken, strict=True):
                    rows[position] = row
            else:
                tables.append((shard, taken))
        if tables:
            try:
                converted = tables_rows([table for _, table in tables], self.output_format)
            except UnconvertedTable as error:
                shard = tables[error.index][0]
                raise self._unreadable(shard, wanted[groups[shard][0]], error.error) from error.error
            for position, row in zip([p for shard, _ in tables for p in groups[shard]], converted, strict=True):
                rows[position] = row
        return rows

    def _rows_of(self, shard: int, indices: list[int], sample: int) -> Any:
        """Rows ``indices`` of ``shard`` (``sample``: the first asked, for errors): the shard's numeric columns to
        cut them from, the rows (WebDataset), or an Arrow table of them (converted with the batch's other shards)."""
        early = self._early(shard, indices, sample)
        if early is not None:  # the rows from the shard's first pieces, before it is whole
            return early
        reader = self._reader(shard, sample)
        if reader.numeric is not None:
            return reader.numeric
        try:
            if self.format is Format.WEBDATASET:
                return reader.rows(indices)
            return reader.take(indices)
        except (OSError, ValueError) as error:
            raise self._unreadable(shard, sample, error) from error

    def _early(self, shard: int, rows: list[int], sample: int) -> Any:
        """Rows of a remote Parquet shard not yet whole in the cache, from the pieces fetched first (NOTE [ Head
        first ] in ``head.py``), as an Arrow table; ``None``: open the shard whole (the usual way)."""
        if shard in self._readers or self.format is not Format.PARQUET or is_local(self.urls[shard]):
            return None
        url, version = self.urls[shard], self._version(shard)
        derived = None if self._decoded is None else self.cache.kept(url, self._decoded, version)
        try:
            return early.early_rows(self.cache.kept(url, None, version), derived, rows, self.columns,
                                    int(self.shard_sizes[shard]), self.cache.timeout)
        except (OSError, ValueError) as error:
            raise ShardError(f"shard {url} (needed for sample {sample}) is not a readable {self.format.value} "
                             f"file: {error}") from error

    def _unreadable(self, shard: int, sample: int, error: Exception) -> ShardError:
        """The error for a sample of an open shard that could not be read or converted."""
        return ShardError(f"could not read sample {sample} from shard {self.urls[shard]}: {error}")

    def _reader(self, shard: int, sample: int) -> ShardReader:
        reader = self._readers.get(shard)
        if reader is not None:
            self._readers.move_to_end(shard)
            return reader
        url = self.urls[shard]
        fmt, columns = (Format.ARROW, None) if self._decoded is not None else (self.format, self.columns)
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                with self.cache.pinned(url):
                    path = self.cache.path(url, int(self.file_sizes[shard]), sample=sample, derived=self._decoded,
                                           version=self._version(shard))
                    reader = ShardReader(path, fmt, columns, functools.partial(table_rows, output=self.output_format))
                break
            except FileNotFoundError as error:  # evicted by another process of the node between download and open
                if attempt == _OPEN_ATTEMPTS - 1:
                    raise ShardError(
                        f"shard {url} (needed for sample {sample}) was evicted by another process before it could be "
                        f"opened, {_OPEN_ATTEMPTS} times: give ShardCache(budget_bytes=...) room for the shards the "
                        f"node's ranks read at once (the window + 6 largest shards)") from error
            except (OSError, ValueError) as error:
                raise ShardError(f"shard {url} (needed for sample {sample}) is not a readable "
                                 f"{self.format.value} file: {error}") from error
        if reader is None:  # pragma: no cover - the loop either breaks with a reader or raises
            raise ShardError(f"shard {url} (needed for sample {sample}) could not be opened")
        if len(reader) != int(self.shard_sizes[shard]):
            reader.close()
            raise ShardError(f"shard {url} (needed for sample {sample}) now has {len(reader)} samples, but its "
                             f"metadata says {int(self.shard_sizes[shard])}: it changed since the index was built")
        if self.output_format is not OutputFormat.PYTHON and self.format is not Format.WEBDATASET:
            # A shard of numbers and lists of numbers: rows cut from numpy views of it, no take per batch
            # (an Arrow file of several record batches stays mapped, read with take: not copied).
            reader.compact()
            reader.numeric = numeric_columns(reader.table)
        self._readers[shard] = reader
        while len(self._readers) > self.open_shards:
            self._readers.popitem(last=False)[1].close()
        return reader

    # -- the plan ------------------------------------------------------------------------------
    def follow_plan(self, permutation: Any, positions: np.ndarray) -> None:
        """Prefetch the shards the plan reads from ``positions`` on, in order (``LocalitySampler`` calls it).

        ``positions`` are this rank's: only the shards they read (with partitions, only their
        partitions' shards) and the window after each are prefetched.
        """
        # read by workers pickled after this
        self.open_shards = max(self.open_shards, permutation.mixed_shards(positions) + 1)
        if positions.size == 0 or (is_local(self.urls[0]) and self._decoded is None):
            return  # local shards read in place: nothing to fetch or make ahead
        # Staggered streams under a budget: nothing fetched for beyond the positions given (about two windows).
        # The next shard of each stream, listed after them, took room that shards entering the list later but
        # read sooner then needed: evicted, fetched again (4 ranks a node, 24 shards, window 4: 1.23-1.49x the
        # dataset; 1.08 without it). The window plan's budget holds the next window by design (two windows).
        streams = permutation.mixing == Mixing.STREAMS  # (a str enum: the window plan says "windows")
        ahead = 0 if streams and self.cache.budget_bytes is not None else _PREFETCH_AHEAD
        order = permutation.upcoming_shards(positions, ahead)
        head: list[Head] = []
        if permutation is not self._pass and self.format is Format.PARQUET:  # a pass starts: its first rows first
            head = self._head(permutation(split_wrap(positions)[0][: heads.HEAD_ROWS]))
        self._pass = permutation
        self.cache.follow([(self.urls[s], int(self.file_sizes[s]), self._version(s)) for s in order.tolist()],
                          self._decoded, head)

    def _head(self, ids: np.ndarray) -> list[Head]:
        """``(url, size, version, rows)`` of each shard of ``ids`` (a pass's first), in order of first appearance."""
        shards, local = self._locate(ids)
        return [(self.urls[s], int(self.file_sizes[s]), self._version(s), sorted(local[p] for p in positions))
                for s, positions in _by_shard(shards).items()]

    def _version(self, shard: int) -> str:
        """Shard ``shard``'s version as the cache names it (a hash of its URL, size and ETag or mtime)."""
        return f"{int(self._versions[shard]):016x}"

    def with_format(self, type: str | OutputFormat) -> ShardedSource:  # HF's name for it
        """A copy of this source whose samples are in output format ``type`` (``"python"``, ``"numpy"``, ``"torch"``).

        Like HF ``datasets``' ``Dataset.with_format``: the shards, index and cache are shared, no
        I/O is done. Cost: O(1).
        """
        output = check_choice("type", type, OutputFormat)
        other = copy.copy(self)
        other.output_format = output
        other._readers = OrderedDict()  # readers convert to their source's format
        return other

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"] = OrderedDict()  # open files stay with their process
        state["_pass"] = None
        return state

    def __repr__(self) -> str:
        shown = "" if self.output_format is OutputFormat.PYTHON else f", output_format={self.output_format.value!r}"
        return f"ShardedSource(samples={len(self)}, shards={len(self.urls)}, format={self.format.value!r}{shown})"


def _by_shard(shards: list[int], skip: Any = ()) -> dict[int, list[int]]:
    """``{shard: its positions in shards}``, shards in order of first appearance, those in ``skip`` left out."""
    groups: dict[int, list[int]] = {}
    for position, shard in enumerate(shards):
        if shard not in skip:
            groups.setdefault(shard, []).append(position)
    return groups
