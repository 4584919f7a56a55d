"""``PackedDataset``: a map-style dataset of token sequences read as the pieces a packed batch plans.

:class:`~shardwise.PackedBatchSampler` yields ``PackedIndex`` values (a sample index that also
carries its row and token range); :class:`PackedDataset` reads each one's tokens and passes the row
on as a :class:`PackedSample`, which :func:`~shardwise.pack_collate` lays out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Any, NamedTuple

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
