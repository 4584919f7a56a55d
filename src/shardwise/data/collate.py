"""``pad_collate``: pad a batch of variable-length arrays to its longest, with lengths and a mask."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .._core.arrays import check_fits, check_numeric_dtype
from .._core.errors import check_int, check_number


class PaddedBatch(NamedTuple):
    """A padded batch. A named tuple, so ``data, lengths, mask = batch`` works, and so do
    ``pin_memory=True`` and the device moves of Lightning and Accelerate, which map over named tuples.
    """

    data: torch.Tensor
    """``(B, max_rows, *feature_shape)``: sample ``b`` in ``data[b, :lengths[b]]``, padding after it."""
    lengths: torch.Tensor
    """``(B,)`` int64: the real row count of every sample."""
    mask: torch.Tensor
    """``(B, max_rows)`` bool: True on real rows, False on padding."""

    def to(self, *args: Any, **kwargs: Any) -> PaddedBatch:
        """Move or cast like ``Tensor.to`` (``data`` only is cast; lengths and mask keep their dtypes)."""
        device_args, device_kwargs = device_only(args, kwargs)
        return PaddedBatch(
            self.data.to(*args, **kwargs),
            self.lengths.to(*device_args, **device_kwargs),
            self.mask.to(*device_args, **device_kwargs),
        )


def device_only(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``Tensor.to``'s arguments without the dtype: what moves a tensor that must keep its dtype."""
    return [a for a in args if not isinstance(a, torch.dtype)], {k: v for k, v in kwargs.items() if k != "dtype"}


def _check_padding(padding_value: object) -> None:
    check_number("padding_value", padding_value, allow_bool=True)  # False pads a bool batch


def _check_multiple(pad_to_multiple_of: object) -> int:
    if pad_to_multiple_of is None:
        return 1
    return check_int("pad_to_multiple_of", pad_to_multiple_of, minimum=1)


def _torch_dtype(item: np.ndarray[Any, Any] | torch.Tensor, b: int) -> torch.dtype:
    if isinstance(item, torch.Tensor):
        return item.dtype
    check_numeric_dtype(f"batch item {b}'s dtype", str(item.dtype))
    return torch.from_numpy(np.empty(0, item.dtype)).dtype


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The numpy dtype with ``dtype``'s range (bfloat16, which numpy lacks, has float32's range)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.float32)
    return torch.empty(0, dtype=dtype).numpy().dtype


def pad_collate(
    batch: Sequence[np.ndarray[Any, Any] | torch.Tensor],
    *,
    padding_value: float = 0,
    pad_to_multiple_of: int | None = None,
) -> PaddedBatch:
    """Pad arrays or tensors of shapes ``(rows_b, *feature_shape)`` into one ``(B, max_rows, *feature_shape)``.

    Use as a DataLoader's ``collate_fn``; to change the defaults in worker processes use
    :class:`PadCollate` (or ``functools.partial(pad_collate, ...)``), both picklable. The output is
    always a new tensor: samples that are read-only views (a :class:`RaggedArray`'s) are copied once,
    straight into place.

    Args:
        batch: the samples; same dtype and feature shape, any number of rows (0 included).
        padding_value: the value of padded rows.
        pad_to_multiple_of: round ``max_rows`` up to a multiple of this (tensor cores, fewer shapes).

    Returns:
        A :class:`PaddedBatch` ``(data, lengths, mask)``.

    Raises:
        ValueError: an empty batch, a scalar sample, a feature shape that differs, or a
            ``padding_value`` the dtype cannot hold.
        TypeError: a sample that is not an array or tensor, or a dtype that differs.

    Example:
        >>> import numpy as np
        >>> batch = pad_collate([np.ones((2, 3), np.float32), np.ones((5, 3), np.float32)], pad_to_multiple_of=4)
        >>> batch.data.shape, batch.lengths.tolist(), batch.mask.sum().item()
        (torch.Size([2, 8, 3]), [2, 5], 7)
    """
    _check_padding(padding_value)
    return _pad(batch, padding_value, _check_multiple(pad_to_multiple_of))


class PadCollate:
    """:func:`pad_collate` with its options fixed, checked once at construction; picklable for workers.

    Args:
        padding_value: the value of padded rows.
        pad_to_multiple_of: round ``max_rows`` up to a multiple of this.

    Example:
        >>> import numpy as np
        >>> collate = PadCollate(padding_value=-1, pad_to_multiple_of=8)
        >>> collate([np.arange(3), np.arange(1)]).data.tolist()[1][:3]
        [0, -1, -1]
    """

    def __init__(self, *, padding_value: float = 0, pad_to_multiple_of: int | None = None) -> None:
        _check_padding(padding_value)
        self.padding_value = padding_value
        self.pad_to_multiple_of = pad_to_multiple_of
        self._multiple = _check_multiple(pad_to_multiple_of)

    def __call__(self, batch: Sequence[np.ndarray[Any, Any] | torch.Tensor]) -> PaddedBatch:
        return _pad(batch, self.padding_value, self._multiple)

    def __repr__(self) -> str:
        return f"PadCollate(padding_value={self.padding_value!r}, pad_to_multiple_of={self.pad_to_multiple_of!r})"


def _check_batch(batch: Sequence[np.ndarray[Any, Any] | torch.Tensor]) -> tuple[torch.dtype, tuple[int, ...]]:
    """The batch's common dtype and feature shape, or raise naming the item that differs."""
    given: object = batch  # typed as a sequence, but a collate_fn receives whatever the loader gives
    if isinstance(given, (str, bytes)) or not (hasattr(given, "__len__") and hasattr(given, "__getitem__")):
        raise TypeError(
            f"batch should be a sequence of numpy arrays or torch tensors, but got batch={batch!r} "
            f"({type(batch).__name__})"
        )
    if len(batch) == 0:
        raise ValueError("batch should hold at least one sample, but got an empty batch")
    for b, item in enumerate(batch):
        if not isinstance(item, (np.ndarray, torch.Tensor)):
            raise TypeError(
                f"batch item {b} should be a numpy array or torch tensor of shape (rows, *feature_shape), "
                f"but got a {type(item).__name__}"
            )
        if item.ndim == 0:
            raise ValueError(f"batch item {b} is a scalar, but pad_collate pads along a rows axis")
    first = batch[0]
    dtype = _torch_dtype(first, 0)
    feature_shape = tuple(first.shape[1:])
    for b, item in enumerate(batch):
        if _torch_dtype(item, b) != dtype:
            raise TypeError(f"batch item {b} has dtype {_torch_dtype(item, b)}, but item 0 has {dtype}")
        if tuple(item.shape[1:]) != feature_shape:
            raise ValueError(
                f"batch item {b} has feature shape {tuple(item.shape[1:])}, but item 0 has {feature_shape}"
            )
    return dtype, feature_shape


def _check_padding_fits(padding_value: float, dtype: torch.dtype) -> None:
    """Refuse a padding value the batch's dtype would change (-1 in uint8 is 255; NaN has no integer)."""
    if isinstance(padding_value, bool) and dtype != torch.bool:
        raise TypeError(
            f"padding_value should be a number for a batch of {dtype} (True and False pad bool batches only), "
            f"but got padding_value={padding_value!r}"
        )
    check_fits("padding_value", padding_value, _numpy_dtype(dtype), holder=f"the batch's dtype {dtype}")


def _pad(batch: Sequence[np.ndarray[Any, Any] | torch.Tensor], padding_value: float, multiple: int) -> PaddedBatch:
    dtype, feature_shape = _check_batch(batch)
    _check_padding_fits(padding_value, dtype)
    lengths = torch.tensor([item.shape[0] for item in batch], dtype=torch.int64)  # (B,)
    longest = int(lengths.max())
    max_rows = -(-longest // multiple) * multiple
    data = torch.full((len(batch), max_rows, *feature_shape), padding_value, dtype=dtype)  # (B, max_rows, *feat)
    as_numpy: np.ndarray[Any, Any] | None = None
    for b, item in enumerate(batch):
        rows = item.shape[0]
        if isinstance(item, torch.Tensor):
            data[b, :rows] = item
        else:
            if as_numpy is None:
                as_numpy = data.numpy()  # shares memory: copies read-only arrays without torch.from_numpy
            as_numpy[b, :rows] = item
    mask = torch.arange(max_rows) < lengths[:, None]  # (B, max_rows)
    return PaddedBatch(data, lengths, mask)
