"""``PackedBatch``: a packed batch that is the model's keyword arguments, with its bookkeeping beside them.

A packed batch goes through every framework's device move and into ``model(**batch)`` unchanged:

- it is a ``dict`` of exactly the keyword arguments the model takes (``input_ids``, ``labels``,
  ``position_ids``, and what the attention implementation needs: ``use_cache=False``,
  flash-attention's ``cu_seq_lens_q``/``max_length_q``..., or a 4-D ``attention_mask``), readable
  as attributes too (``batch.input_ids``);
- the bookkeeping (``document_ids``, ``sample_ids``, ``cu_seqlens``, ``max_seqlen``, ``num_tokens``)
  is held in attributes, never keys, so ``model(**batch)`` does not receive it;
- ``batch.to(device)`` and ``batch.pin_memory()`` move both. Accelerate's ``send_to_device``,
  Lightning's and Fabric's ``move_data_to_device`` and the DataLoader's ``pin_memory=True`` call
  them, so the bookkeeping travels with the batch. ``Trainer._prepare_input`` rebuilds mappings
  from their items (``type(batch)({...})``): the model inputs arrive, the bookkeeping does not, and
  reading it then raises an ``AttributeError`` that says so (never a silent ``None``).
"""

from __future__ import annotations

from typing import Any

import torch

from .collate import device_only

_BOOKKEEPING = ("document_ids", "sample_ids", "cu_seqlens", "max_seqlen", "num_tokens")
_OPTIONAL_INPUTS = ("attention_mask",)  # read as None when the batch has no such key (no mask asked for)


class PackedBatch(dict[str, Any]):
    """A packed batch: a mapping of the model's keyword arguments, bookkeeping in attributes.

    See :mod:`shardwise.data.packing` for which token goes where and
    :class:`~shardwise.PackCollate` for which keys a model gets. ``model(**batch)`` passes exactly the
    model inputs; the fields below are attributes only.

    Attributes:
        document_ids: ``(R, L)`` int64 document number in the batch (0, 1, ... in row order), -1 on
            padding (``(1, R * L)`` when the batch is flattened for flash-attention).
        sample_ids: dataset index each token came from, -1 on padding (same shape).
        cu_seqlens: ``(segments + 1,)`` int32 segment boundaries in the flattened ``(R * L,)`` stream
            (documents, and each row's padding tail).
        max_seqlen: the longest segment.
        num_tokens: real (non-padding) tokens in the batch.

    Example:
        >>> import shardwise
        >>> batch = shardwise.pack_collate([[5, 6, 7], [8, 9]], max_len=6)
        >>> sorted(batch), batch.num_tokens, batch.document_ids.tolist()
        (['input_ids', 'labels', 'position_ids'], 5, [[0, 0, 0, 1, 1, -1]])
    """

    document_ids: torch.Tensor
    sample_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    num_tokens: int

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self:
            return self[name]
        if name in _OPTIONAL_INPUTS:
            return None
        if name in _BOOKKEEPING:
            raise AttributeError(
                f"this PackedBatch has no {name!r}: it was rebuilt from its model inputs alone (a framework that "
                "rebuilds mappings from their items, such as Trainer._prepare_input, keeps the keys only); read the "
                "bookkeeping from the batch the DataLoader yields, and move it with batch.to(device)"
            )
        raise AttributeError(f"PackedBatch has no key or attribute {name!r}; its keys are {sorted(self)}")

    def _with(self, move: Any) -> PackedBatch:
        """A new batch with ``move`` applied to every tensor, keys and bookkeeping alike."""
        out = PackedBatch({k: move(v) if isinstance(v, torch.Tensor) else v for k, v in self.items()})
        for name, value in vars(self).items():
            setattr(out, name, move(value) if isinstance(value, torch.Tensor) else value)
        return out

    def to(self, *args: Any, **kwargs: Any) -> PackedBatch:
        """Move like ``Tensor.to``: every tensor to the device; a dtype casts floating-point tensors only
        (token ids, positions and labels keep their integer dtypes)."""
        device_args, device_kwargs = device_only(args, kwargs)

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.is_floating_point():
                return tensor.to(*args, **kwargs)
            return tensor.to(*device_args, **device_kwargs)

        return self._with(move)

    def pin_memory(self, *args: Any) -> PackedBatch:
        """Pinned copies of every tensor (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._with(lambda tensor: tensor.pin_memory(*args))

    def __copy__(self) -> PackedBatch:
        return self._with(lambda tensor: tensor)

    def __reduce__(self) -> Any:  # pickled by DataLoader workers: the keys and the bookkeeping
        return (_rebuild, (dict(self), dict(vars(self))))

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{k}={tuple(v.shape) if isinstance(v, torch.Tensor) else v!r}" for k, v in self.items()
        )
        return f"PackedBatch({shapes}; num_tokens={vars(self).get('num_tokens')!r})"


def _rebuild(inputs: dict[str, Any], bookkeeping: dict[str, Any]) -> PackedBatch:
    batch = PackedBatch(inputs)
    for name, value in bookkeeping.items():
        setattr(batch, name, value)
    return batch
