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

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._core.errors import check_bool, check_int, shown
from .attention import OWN, PackLayout, pack_layout
from .packed_batch import PackedBatch
from .packed_dataset import PackedSample

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
    attn_implementation: str | None = None,
) -> PackedBatch:
    """Lay the documents of a packed batch out in rows: ids, labels, positions, ``cu_seqlens``, masks.

    Use as a DataLoader's ``collate_fn`` over a :class:`PackedDataset`; to fix options for
    worker processes, or to feed an HF model, use :class:`PackCollate` (picklable).

    Args:
        batch: :class:`PackedSample` items (their ``row`` says where each goes), or plain 1-D
            token sequences, which fill rows of ``max_len`` in order (all in one row without
            ``max_len``: the flattening of HF's ``DataCollatorWithFlattening``).
        max_len: columns ``L`` of the output (rows are padded to it); default: the longest row.
        rows: at least this many rows (empty rows are all padding): fixed shapes for
            ``rows_per_batch`` batches that are one row short.
        pad_id: the id of padding tokens.
        ignore_index: the label of tokens no loss is taken on.
        attention_mask: also build the ``(R, 1, L, L)`` block-diagonal causal mask for SDPA in
            your own model (memory ``R * L * L`` bytes). Not for HF models (see :class:`PackCollate`).
        attn_implementation: the HF attention implementation the batch feeds (``"sdpa"``,
            ``"eager"``, ``"flex_attention"``, ``"flash_attention_2"``...): the inputs that keep
            documents apart for it (see :class:`PackCollate`).

    Returns:
        A :class:`PackedBatch`: the model's keyword arguments, with the bookkeeping in attributes.

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
    layout = _layout(None, attn_implementation, check_bool("attention_mask", attention_mask))
    return _pack(batch, length, count, pad_id, ignore_index, attention_mask, layout)


def _layout(model: Any, attn_implementation: str | None, with_mask: bool) -> PackLayout:
    layout = pack_layout(model, attn_implementation)
    if with_mask and layout.hf:
        raise ValueError(
            f"attention_mask=True builds a 4-D bool mask, which transformers passes to attention as it is and only "
            f"sdpa reads right; for an HF model ({layout.name!r}) leave attention_mask=False: the batch carries "
            "position_ids and use_cache=False, from which the model builds the mask its attention reads"
        )
    return layout


class PackCollate:
    """:func:`pack_collate` with its options fixed, checked once; picklable for DataLoader workers.

    Give it the model the batches feed, and each batch is exactly that model's keyword arguments
    (``model(**batch)``), with the inputs that keep documents apart for its attention
    implementation (:mod:`shardwise.data.attention` has the table):

    - no model (your own module): ``input_ids``, ``labels``, ``position_ids`` in ``(R, L)`` rows,
      and ``attention_mask`` (4-D bool, SDPA's form) with ``attention_mask=True``;
    - an HF model with ``sdpa``, ``eager`` or ``flex_attention``: ``input_ids``, ``labels``,
      ``position_ids`` in rows and ``use_cache=False`` (the model then builds a per-document mask);
    - an HF model with flash-attention (``flash_attention_2``/``_3``, a ``...flash...`` kernel):
      one flattened row ``(1, R * L)`` of each, ``use_cache=False`` and ``cu_seq_lens_q/k``,
      ``max_length_q/k`` (varlen).

    Only the model's config and ``forward`` signature are read at construction; the model is not
    kept (workers get the options, not the model).

    Args:
        max_len, rows, pad_id, ignore_index, attention_mask: as :func:`pack_collate`.
        model: the model the batches feed (an HF ``PreTrainedModel``, wrapped or not, or any module).
        attn_implementation: an HF attention implementation, instead of the model's.

    Raises:
        ValueError: documents cannot be kept apart for ``model`` (an unknown or paged attention
            implementation, a ``forward`` without ``position_ids``), or ``attention_mask=True`` for an
            HF model (the model builds its own mask from ``position_ids``).

    Example:
        >>> collate = PackCollate(max_len=4, attention_mask=True)
        >>> collate([[1, 2], [3]]).attention_mask.shape
        torch.Size([1, 1, 4, 4])
        >>> sorted(PackCollate(max_len=4, attn_implementation="sdpa")([[1, 2], [3]]))
        ['input_ids', 'labels', 'position_ids', 'use_cache']
    """

    def __init__(
        self,
        *,
        max_len: int | None = None,
        rows: int | None = None,
        pad_id: int = 0,
        ignore_index: int = -100,
        attention_mask: bool = False,
        model: Any = None,
        attn_implementation: str | None = None,
    ) -> None:
        self._length, self._rows = _check_options(max_len, rows, pad_id, ignore_index)
        self.max_len, self.rows, self.pad_id, self.ignore_index = max_len, rows, pad_id, ignore_index
        self.attention_mask = check_bool("attention_mask", attention_mask)
        self.layout = _layout(model, attn_implementation, self.attention_mask)

    def for_model(self, model: Any) -> PackCollate:
        """The same options, for ``model`` (what ``ShardwiseTrainer`` uses when the collate names no model)."""
        return PackCollate(max_len=self.max_len, rows=self.rows, pad_id=self.pad_id, ignore_index=self.ignore_index,
                           attention_mask=self.attention_mask, model=model)  # fmt: skip

    def __call__(self, batch: Sequence[Any]) -> PackedBatch:
        return _pack(batch, self._length, self._rows, self.pad_id, self.ignore_index, self.attention_mask, self.layout)

    def __repr__(self) -> str:
        target = "" if not self.layout.hf else f", attn_implementation={self.layout.name!r}"
        return (
            f"PackCollate(max_len={self.max_len!r}, rows={self.rows!r}, pad_id={self.pad_id!r}, "
            f"ignore_index={self.ignore_index!r}, attention_mask={self.attention_mask!r}{target})"
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
    batch: Sequence[Any],
    max_len: int | None,
    rows: int | None,
    pad_id: int,
    ignore_index: int,
    with_mask: bool,
    layout: PackLayout = OWN,
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
    return _batch(
        {"input_ids": input_ids, "labels": labels, "position_ids": positions},
        {"document_ids": document_ids, "sample_ids": sample_ids},
        mask, cu_seqlens, int(max(segments)) if segments else 0, int(row_tokens.sum()), layout,
    )  # fmt: skip


def _batch(
    tensors: dict[str, np.ndarray],
    kept: dict[str, np.ndarray],
    mask: torch.Tensor | None,
    cu_seqlens: np.ndarray,
    longest: int,
    num_tokens: int,
    layout: PackLayout,
) -> PackedBatch:
    """The model's keyword arguments for ``layout``, the bookkeeping (``kept``...) in attributes."""
    if layout.flatten:  # one row of R * L tokens: flash-attention's varlen layout
        tensors = {k: v.reshape(1, -1) for k, v in tensors.items()}
        kept = {k: v.reshape(1, -1) for k, v in kept.items()}
    out = PackedBatch({k: torch.from_numpy(v) for k, v in tensors.items()})
    if mask is not None:
        out["attention_mask"] = mask
    if layout.use_cache:
        out["use_cache"] = False
    cu = torch.from_numpy(cu_seqlens)
    if layout.varlen:
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    out.document_ids = torch.from_numpy(kept["document_ids"])
    out.sample_ids = torch.from_numpy(kept["sample_ids"])
    out.cu_seqlens, out.max_seqlen, out.num_tokens = cu, longest, num_tokens
    return out
