"""``pack_collate``: the tensors packed-sequence kernels want, from the documents of a packed batch.

A :class:`~shardwise.PackedBatchSampler` batch is a list of sample indices that also carry their
row and token range (``PackedIndex``); :class:`PackedDataset` reads each one's tokens (the piece
``[start, stop)`` of the sample) and passes the row on; :func:`pack_collate` lays the documents
out row by row. Which token goes where, for a batch of ``R`` rows of ``L`` columns:

- ``input_ids[r]`` is row ``r``'s documents one after another, in batch order, then ``pad_id``;
- ``position_ids`` restart at 0 at every document (and at the padding tail of a row, which
  counts as one more segment): what HF models take for padding-free packing;
- ``cu_seqlens`` (int32) are the segment boundaries in the flattened ``(R * L,)`` token stream
  (documents and each row's padding tail), ``max_seqlen`` the longest segment: flash-attn's
  ``flash_attn_varlen_func`` and PyTorch's varlen/nested attention take these;
- ``attention_mask`` (optional, ``(R, 1, L, L)`` bool, True = may attend) is block diagonal
  and causal: a token attends to the earlier tokens of its own document only (plain SDPA);
- ``labels`` are ``input_ids`` with ``ignore_index`` on the first token of every document and on
  padding, so that after the usual one-token shift no document predicts another's first token;
- ``document_ids`` (document number in the batch, -1 on padding) and ``sample_ids`` (the dataset
  index each token came from, -1 on padding) say which sample each token came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from .._core.errors import check_bool, check_int, shown
from .._core.packing import PackedIndex


class PackedSample(NamedTuple):
    """One document of a packed batch, as :class:`PackedDataset` returns it."""

    tokens: Any
    """The document's tokens: a 1-D array, tensor or list (a piece of the sample when split)."""
    sample: int
    """The sample's index in the dataset."""
    row: int | None
    """The row of the batch it goes to (``None``: not known; :func:`pack_collate` fills rows in order)."""
    start: int = 0
    """Its first token's position in the sample (nonzero for the later pieces of a split sample)."""


def _check_key(key: object) -> None:
    """A dataset index: a PackedIndex (checked when made) or a non-negative int, never -1 (the padding's id)."""
    if not isinstance(key, PackedIndex):
        check_int("index", key, minimum=0)


class PackedDataset(Dataset[PackedSample]):
    """Wraps a map-style dataset of token sequences so that packed batches keep their rows and pieces.

    ``dataset[i]`` must be a 1-D sequence of token ids (array, tensor, list; a
    :class:`~shardwise.RaggedArray` item), or a mapping holding one under ``field`` (e.g. an HF
    dataset row ``{"input_ids": [...]}``). Indexed with a ``PackedIndex`` it returns the piece
    ``[start, stop)`` and the row; with a plain int, the whole sample and ``row=None``.
    Picklable when the wrapped dataset is (DataLoader workers).

    Args:
        dataset: the map-style dataset.
        field: the key of the token ids when items are mappings.
        check_lengths: raise if a sample's length differs from the one the sampler planned
            with (the ``stop`` it was given), instead of silently packing past ``max_len``.

    Raises:
        TypeError: ``dataset`` is iterable-style or has no ``len()``; ``dataset[0]`` is a mapping
            and ``field`` is ``None``, or is not a mapping and ``field`` is given.
        ValueError: ``dataset`` is empty, or ``dataset[0]`` has no key ``field``.

    Construction reads ``dataset[0]`` (one sample, at any dataset size) to check ``field``.

    Example:
        >>> import numpy as np
        >>> from shardwise import PackedBatchSampler, pack_collate
        >>> docs = [np.arange(n) for n in (5, 3, 8, 2)]
        >>> sampler = PackedBatchSampler([len(d) for d in docs], max_len=8, rows_per_batch=3, num_replicas=1, rank=0)
        >>> data = PackedDataset(docs)
        >>> batch = pack_collate([data[i] for i in next(iter(sampler))], max_len=8)
        >>> batch.input_ids.shape, int(batch.cu_seqlens[-1])
        (torch.Size([3, 8]), 24)
    """

    def __init__(self, dataset: Any, *, field: str | None = None, check_lengths: bool = True) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError(
                f"dataset should be a map-style dataset (with __getitem__ and __len__), but got "
                f"{type(dataset).__name__}, an IterableDataset, which a batch sampler cannot index"
            )
        if not hasattr(dataset, "__getitem__") or not isinstance(dataset, Sized):
            raise TypeError(
                f"dataset should be a map-style dataset (with __getitem__ and __len__), but got "
                f"{type(dataset).__name__}"
            )
        if field is not None and not isinstance(field, str):
            raise TypeError(f"field should be a string key or None, but got field={field!r}")
        self.dataset: Any = dataset
        self.field = field
        self.check_lengths = check_bool("check_lengths", check_lengths)
        self._check_first_sample()

    def _check_first_sample(self) -> None:
        """Read ``dataset[0]`` (one sample, whatever the dataset's size) so that a wrong ``field`` fails now."""
        if len(self.dataset) == 0:
            raise ValueError(f"dataset should hold at least one sample, but {type(self.dataset).__name__} is empty")
        item = self.dataset[0]
        if isinstance(item, Mapping):
            if self.field is not None and self.field not in item:
                raise ValueError(
                    f"field={self.field!r} should be a key of the dataset's items, but dataset[0] has keys "
                    f"{sorted(map(str, item))!r}; pass the key of the token ids"
                )
            tokens = self._tokens(item, 0)[0]
        elif self.field is not None:
            raise TypeError(
                f"field={self.field!r} is for items that are mappings, but dataset[0] is a {type(item).__name__}; "
                "leave field=None"
            )
        else:
            tokens = item
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sized) or getattr(tokens, "ndim", 1) != 1:
            raise TypeError(
                f"dataset items should be 1-D sequences of token ids{'' if self.field is None else ' under field'}, "
                f"but dataset[0] holds {shown('tokens', tokens)} ({type(tokens).__name__})"
            )

    def __len__(self) -> int:
        return len(self.dataset)

    def _tokens(self, item: Any, key: Any) -> Any:
        if isinstance(item, Mapping):
            if self.field is None:
                raise TypeError(
                    f"dataset[{int(key)}] is a mapping with keys {sorted(item)!r}; pass PackedDataset(dataset, "
                    "field=<the key of the token ids>), e.g. field='input_ids'"
                )
            item = item[self.field]
        if not isinstance(key, PackedIndex):
            return item, None, 0
        start, stop = key.start, key.stop
        if self.check_lengths and stop >= 0 and len(item) < stop:
            raise ValueError(
                f"sample {int(key)} has {len(item)} tokens, but the sampler planned with a length of at least {stop}; "
                "pass the sampler the lengths of exactly these token sequences"
            )
        return item[start:stop] if (start or stop != len(item)) else item, key.row, start

    def __getitem__(self, key: int) -> PackedSample:
        if type(key) is not int or key < 0:  # the common case (a plain int, a PackedIndex) costs one compare
            _check_key(key)
        tokens, row, start = self._tokens(self.dataset[key], key)
        return PackedSample(tokens, int(key), row, start)

    def __getitems__(self, keys: Sequence[int]) -> list[PackedSample]:
        # A dataset's batched read (RaggedArray's) gets the plain indices; rows and pieces follow.
        for key in keys:
            if type(key) is not int or key < 0:
                _check_key(key)
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems([int(k) for k in keys]) if getitems is not None else [self.dataset[k] for k in keys]
        out = []
        for key, item in zip(keys, items, strict=True):
            tokens, row, start = self._tokens(item, key)
            out.append(PackedSample(tokens, int(key), row, start))
        return out

    def __repr__(self) -> str:
        return f"PackedDataset({type(self.dataset).__name__}, field={self.field!r})"


class PackedBatch(NamedTuple):
    """A packed batch (see the module docstring for which token goes where). A named tuple, so
    ``pin_memory`` and the device moves of Lightning and Accelerate map over it."""

    input_ids: torch.Tensor
    """``(R, L)`` int64 token ids, rows of concatenated documents, then ``pad_id``."""
    labels: torch.Tensor
    """``(R, L)`` int64 ``input_ids`` with ``ignore_index`` on each document's first token and on padding."""
    position_ids: torch.Tensor
    """``(R, L)`` int64 position of each token in its document (padding tails count from 0 too)."""
    cu_seqlens: torch.Tensor
    """``(segments + 1,)`` int32 segment boundaries in the flattened ``(R * L,)`` stream (documents, padding tails)."""
    max_seqlen: int
    """The longest segment."""
    document_ids: torch.Tensor
    """``(R, L)`` int64 document number in the batch (0, 1, ... in row order), -1 on padding."""
    sample_ids: torch.Tensor
    """``(R, L)`` int64 dataset index each token came from, -1 on padding."""
    attention_mask: torch.Tensor | None
    """``(R, 1, L, L)`` bool block-diagonal causal mask (True: may attend), or ``None`` unless asked for."""
    num_tokens: int
    """Real (non-padding) tokens in the batch."""


_ID_MAX = int(np.iinfo(np.int64).max)


def _as_array(tokens: Any, where: int) -> np.ndarray:
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.numpy()
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise ValueError(f"batch item {where} should be a 1-D sequence of token ids, but got shape {array.shape}")
    if array.size and (array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"batch item {where} should hold integer token ids, but got dtype {array.dtype}")
    if array.size and array.dtype == np.uint64 and int(array.max()) > _ID_MAX:
        at = int(np.argmax(array))
        raise ValueError(
            f"batch item {where} should hold token ids that int64 tensors hold (<= 2**63 - 1), but got "
            f"{int(array[at])} at position {at}"
        )
    return array


def _check_options(
    max_len: object, rows: object, pad_id: object, ignore_index: object
) -> tuple[int | None, int | None]:
    length = None if max_len is None else check_int("max_len", max_len, minimum=1)
    count = None if rows is None else check_int("rows", rows, minimum=1)
    check_int("pad_id", pad_id)
    check_int("ignore_index", ignore_index)
    return length, count


def pack_collate(
    batch: Sequence[Any],
    *,
    max_len: int | None = None,
    rows: int | None = None,
    pad_id: int = 0,
    ignore_index: int = -100,
    attention_mask: bool = False,
) -> PackedBatch:
    """Lay the documents of a packed batch out in rows: ids, labels, positions, ``cu_seqlens``, masks.

    Use as a DataLoader's ``collate_fn`` over a :class:`PackedDataset`; to fix options for
    worker processes use :class:`PackCollate` (picklable).

    Args:
        batch: :class:`PackedSample` items (their ``row`` says where each goes), or plain 1-D
            token sequences, which fill rows of ``max_len`` in order (all in one row without
            ``max_len``: the flattening of HF's ``DataCollatorWithFlattening``).
        max_len: columns ``L`` of the output (rows are padded to it); default: the longest row.
        rows: at least this many rows (empty rows are all padding): fixed shapes for
            ``rows_per_batch`` batches that are one row short.
        pad_id: the id of padding tokens.
        ignore_index: the label of tokens no loss is taken on.
        attention_mask: also build the ``(R, 1, L, L)`` block-diagonal causal mask for SDPA
            (memory ``R * L * L`` bytes).

    Returns:
        A :class:`PackedBatch`.

    Raises:
        ValueError: an empty batch, a row longer than ``max_len``, a non-1-D item.
        TypeError: an item that is not a sequence of integer token ids.

    Example:
        >>> batch = pack_collate([PackedSample([5, 6, 7], 0, 0), PackedSample([8, 9], 1, 0), PackedSample([4], 2, 1)],
        ...                      max_len=6)
        >>> batch.input_ids.tolist()
        [[5, 6, 7, 8, 9, 0], [4, 0, 0, 0, 0, 0]]
        >>> batch.position_ids.tolist()
        [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]]
        >>> batch.cu_seqlens.tolist(), batch.max_seqlen
        ([0, 3, 5, 6, 7, 12], 5)
        >>> batch.labels.tolist()[0]
        [-100, 6, 7, -100, 9, -100]
    """
    length, count = _check_options(max_len, rows, pad_id, ignore_index)
    return _pack(batch, length, count, pad_id, ignore_index, check_bool("attention_mask", attention_mask))


class PackCollate:
    """:func:`pack_collate` with its options fixed, checked once; picklable for DataLoader workers.

    Example:
        >>> collate = PackCollate(max_len=4, attention_mask=True)
        >>> collate([[1, 2], [3]]).attention_mask.shape
        torch.Size([1, 1, 4, 4])
    """

    def __init__(
        self,
        *,
        max_len: int | None = None,
        rows: int | None = None,
        pad_id: int = 0,
        ignore_index: int = -100,
        attention_mask: bool = False,
    ) -> None:
        self._length, self._rows = _check_options(max_len, rows, pad_id, ignore_index)
        self.max_len, self.rows, self.pad_id, self.ignore_index = max_len, rows, pad_id, ignore_index
        self.attention_mask = check_bool("attention_mask", attention_mask)

    def __call__(self, batch: Sequence[Any]) -> PackedBatch:
        return _pack(batch, self._length, self._rows, self.pad_id, self.ignore_index, self.attention_mask)

    def __repr__(self) -> str:
        return (
            f"PackCollate(max_len={self.max_len!r}, rows={self.rows!r}, pad_id={self.pad_id!r}, "
            f"ignore_index={self.ignore_index!r}, attention_mask={self.attention_mask!r})"
        )


def _documents(batch: Sequence[Any], max_len: int | None) -> tuple[list[np.ndarray], list[int], list[int]]:
    """Each document's tokens, row and sample index (plain items fill rows of ``max_len`` in order)."""
    tokens: list[np.ndarray] = []
    row_of: list[int] = []
    sample_of: list[int] = []
    row, used = 0, 0
    for where, item in enumerate(batch):
        if isinstance(item, PackedSample):
            # sample_ids use -1 for padding, so a negative sample index would pass for padding
            index = check_int(f"batch[{where}].sample", item.sample, minimum=0)
            given = None if item.row is None else check_int(f"batch[{where}].row", item.row, minimum=0)
            check_int(f"batch[{where}].start", item.start, minimum=0)
            array = _as_array(item.tokens, where)
        else:
            array, index, given = _as_array(item, where), where, None
        if given is None:
            if max_len is not None and used and used + array.size > max_len:
                row, used = row + 1, 0
            given = row
            used += array.size
        tokens.append(array)
        row_of.append(int(given))
        sample_of.append(index)
    return tokens, row_of, sample_of


def _pack(
    batch: Sequence[Any], max_len: int | None, rows: int | None, pad_id: int, ignore_index: int, with_mask: bool
) -> PackedBatch:
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence):
        raise TypeError(
            f"batch should be a sequence of PackedSample items or 1-D token sequences, but got {shown('batch', batch)} "
            f"({type(batch).__name__})"
        )
    if len(batch) == 0:
        raise ValueError("batch should hold at least one document, but got an empty batch")
    tokens, row_of, sample_of = _documents(batch, max_len)
    num_rows = max(max(row_of) + 1, rows or 0)
    row_tokens = np.bincount(np.asarray(row_of), weights=[t.size for t in tokens], minlength=num_rows).astype(np.int64)
    longest = int(row_tokens.max())
    if max_len is not None and longest > max_len:
        row = int(np.argmax(row_tokens))
        raise ValueError(
            f"row {row} of the batch holds {longest} tokens, but max_len={max_len}; pack with the same max_len "
            "as the sampler (and the sampler with the lengths of exactly these sequences)"
        )
    width = max_len if max_len is not None else max(longest, 1)
    input_ids = np.full((num_rows, width), pad_id, dtype=np.int64)
    labels = np.full((num_rows, width), ignore_index, dtype=np.int64)
    positions = np.zeros((num_rows, width), dtype=np.int64)
    document_ids = np.full((num_rows, width), -1, dtype=np.int64)
    sample_ids = np.full((num_rows, width), -1, dtype=np.int64)
    fill = np.zeros(num_rows, dtype=np.int64)
    # segments: (row, start, length) of every document, in row order, then each row's padding tail.
    starts_in_row: list[tuple[int, int, int]] = []
    order = sorted(range(len(tokens)), key=row_of.__getitem__)  # stable: batch order within a row
    doc = -1
    for d in order:
        row, array = row_of[d], tokens[d]
        size = array.size
        if size == 0:
            continue
        doc += 1
        at = int(fill[row])
        input_ids[row, at : at + size] = array
        labels[row, at + 1 : at + size] = array[1:]
        positions[row, at : at + size] = np.arange(size)
        document_ids[row, at : at + size] = doc
        sample_ids[row, at : at + size] = sample_of[d]
        starts_in_row.append((row, at, size))
        fill[row] = at + size
    segments = []
    by_row: list[list[int]] = [[] for _ in range(num_rows)]
    for row, _, size in starts_in_row:
        by_row[row].append(size)
    for row in range(num_rows):
        tail = width - int(fill[row])
        if tail:
            positions[row, int(fill[row]) :] = np.arange(tail)
            by_row[row].append(tail)
        segments.extend(by_row[row])
    cu_seqlens = np.zeros(len(segments) + 1, dtype=np.int32)
    np.cumsum(segments, out=cu_seqlens[1:])
    mask = None
    if with_mask:
        # segment id per token: documents and padding tails alike, distinct across the batch.
        segment = np.repeat(np.arange(len(segments)), segments).reshape(num_rows, width)
        same = segment[:, :, None] == segment[:, None, :]
        mask = torch.from_numpy(same & np.tri(width, dtype=bool)[None]).unsqueeze(1)
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids),
        labels=torch.from_numpy(labels),
        position_ids=torch.from_numpy(positions),
        cu_seqlens=torch.from_numpy(cu_seqlens),
        max_seqlen=int(max(segments)) if segments else 0,
        document_ids=torch.from_numpy(document_ids),
        sample_ids=torch.from_numpy(sample_ids),
        attention_mask=mask,
        num_tokens=int(row_tokens.sum()),
    )
