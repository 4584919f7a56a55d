"""Which inputs keep packed documents apart, for the model a packed batch feeds.

A packed row holds several documents; the model must not attend from one to another. What keeps
them apart depends on the attention implementation, and HF transformers models (5.x) read it from
different inputs:

=====================================  ==================  ==========================================
``attn_implementation``                layout              inputs that keep documents apart
=====================================  ==================  ==========================================
``sdpa``, ``eager``, ``flex_attention``  rows ``(R, L)``     ``position_ids`` (restarting per document)
                                                           and ``use_cache=False``: the model builds
                                                           its own mask, in its own form, from them
``flash_attention_2``/``_3``, any      one row             ``position_ids``, ``cu_seq_lens_q/k`` and
``...flash...`` kernel                 ``(1, R * L)``      ``max_length_q/k`` (varlen; no mask)
no model (your own)                    rows ``(R, L)``     ``position_ids``; a 4-D bool mask on request
=====================================  ==================  ==========================================

Why ``use_cache=False``: transformers detects packed documents from ``position_ids`` only when no
attention mask is given *and* there is no KV cache, and a config's default ``use_cache=True`` makes
``forward`` create a cache even in training: documents then attend to each other silently.
The batch carries ``use_cache=False``; the model's config is never changed.

Why no 4-D mask for HF models: transformers passes a 4-D mask through as it is, and only ``sdpa``
reads a bool mask as "may attend"; ``eager`` adds it to the scores and ``flex_attention`` expects a
``BlockMask``. The mask the model builds from ``position_ids`` is always in the right form.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._core.errors import check_str
from .._core.foreign import check_loaded, private

ROW_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")
"""HF attention implementations that build a per-document mask from ``position_ids`` (with no cache)."""


@dataclass(frozen=True)
class PackLayout:
    """What a packed batch holds for the model it feeds (resolved once, by :func:`pack_layout`)."""

    name: str
    """``"own"`` (no model given), or the HF ``attn_implementation`` it was resolved from."""
    flatten: bool = False
    """One row of ``R * L`` tokens (flash-attention's varlen path) instead of ``R`` rows."""
    use_cache: bool = False
    """Add ``use_cache=False`` to the inputs (the model takes it)."""
    varlen: bool = False
    """Add ``cu_seq_lens_q/k`` and ``max_length_q/k`` (the model takes them)."""

    @property
    def hf(self) -> bool:
        return self.name != "own"


OWN = PackLayout("own")


def _unwrap(model: Any) -> Any:
    """The model under DDP/FSDP-style ``.module``, ``torch.compile``'s ``_orig_mod`` and PEFT's base model."""
    check_loaded("torch._dynamo")  # a compiled model has loaded it; nothing is imported here
    for _ in range(8):
        inner = getattr(model, private("torch._dynamo", "_orig_mod"), None) or getattr(model, "module", None)
        if inner is None and callable(getattr(model, "get_base_model", None)):
            inner = model.get_base_model()
        if inner is None or inner is model:
            return model
        model = inner
    return model


def _takes(model: Any) -> tuple[set[str], bool]:
    """The keyword arguments ``model.forward`` names, and whether it takes ``**kwargs``."""
    parameters = inspect.signature(model.forward).parameters.values()
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind == p.VAR_KEYWORD for p in parameters)


def model_implementation(model: Any) -> str | None:
    """The HF ``attn_implementation`` of ``model`` (unwrapped), or ``None`` for a model that is not an HF one."""
    config = getattr(_unwrap(model), "config", None)
    implementation = getattr(config, private("transformers", "_attn_implementation"), None)
    return implementation if isinstance(implementation, str) else None


def pack_layout(model: Any = None, attn_implementation: str | None = None) -> PackLayout:
    """Resolve what a packed batch must hold for ``model`` (an HF model, or any ``nn.Module``), or raise.

    Args:
        model: the model the batches feed (unwrapped from DDP, ``torch.compile``, PEFT); only its
            config and ``forward`` signature are read, nothing is kept.
        attn_implementation: an HF attention implementation, to use instead of the model's (a
            custom kernel that behaves like one of the known ones).

    Raises:
        ValueError: documents cannot be kept apart for this model: an attention implementation
            shardwise does not know, a paged (inference) one, or a ``forward`` without ``position_ids``.
    """
    if attn_implementation is not None:
        check_str("attn_implementation", attn_implementation)
    implementation = attn_implementation or (None if model is None else model_implementation(model))
    if implementation is None:
        return OWN
    names: set[str] = {"position_ids", "use_cache"}
    any_keyword = True
    if model is not None:
        names, any_keyword = _takes(_unwrap(model))
    known = ", ".join(map(repr, (*ROW_IMPLEMENTATIONS, "flash_attention_2", "flash_attention_3")))
    if "paged" in implementation:
        raise ValueError(
            f"attn_implementation={implementation!r} is for generation with a paged cache, not training on packed "
            f"batches; load the model with one of {known}"
        )
    if "position_ids" not in names and not any_keyword:
        raise ValueError(
            f"{type(_unwrap(model)).__name__}.forward takes no position_ids, so packed documents cannot be kept "
            "apart (they would attend to each other); train it on unpacked batches (shardwise.BucketBatchSampler)"
        )
    use_cache = "use_cache" in names or any_keyword
    if "flash" in implementation:
        return PackLayout(implementation, flatten=True, use_cache=use_cache, varlen=any_keyword)
    if implementation in ROW_IMPLEMENTATIONS:
        return PackLayout(implementation, use_cache=use_cache)
    raise ValueError(
        f"attn_implementation={implementation!r}: shardwise cannot tell whether it keeps packed documents apart; "
        f"load the model with one of {known}, or pass PackCollate(attn_implementation=...) naming the one your "
        "kernel behaves like"
    )


def _restarts(position_ids: torch.Tensor) -> bool:
    """Whether positions restart inside a row (several documents in one row)."""
    return bool((position_ids[..., 1:] - position_ids[..., :-1] != 1).any())


def _flash_leak(inputs: Mapping[str, Any], position_ids: torch.Tensor) -> str | None:
    if "cu_seq_lens_q" in inputs:
        return None
    if inputs.get("attention_mask") is not None:
        return "flash-attention reads the attention_mask (padding) and ignores position_ids; drop attention_mask"
    if position_ids.shape[0] != 1:
        return (
            f"flash-attention finds packed documents from position_ids only in a batch of one row, but got "
            f"{position_ids.shape[0]} rows; flatten the rows (PackCollate(model=model) does)"
        )
    return None


def _mask_leak(implementation: str, mask: Any) -> str | None:
    if not (isinstance(mask, torch.Tensor) and mask.ndim == 4):
        return (
            "transformers finds packed documents from position_ids only when attention_mask is None; a padding "
            "mask makes every document of a row attend to the earlier ones; drop attention_mask"
        )
    read_right = {"sdpa": mask.dtype == torch.bool, "eager": mask.is_floating_point()}
    if read_right.get(implementation, False):
        return None
    return (
        f"a 4-D {mask.dtype} attention_mask is passed to attention as it is, and {implementation!r} does not read "
        "it as a mask of who may attend (only sdpa reads a bool mask so); drop it and let the model build its "
        "own from position_ids (PackCollate(model=model) does)"
    )


def packing_leak(model: Any, inputs: Mapping[str, Any]) -> str | None:
    """Why ``model(**inputs)`` would attend across the packed documents of ``inputs``, or ``None``.

    Reads the inputs as transformers 5.x reads them. Inputs that are not packed (positions that
    never restart within a row) and models that are not HF models give ``None``.
    """
    implementation = model_implementation(model)
    position_ids = inputs.get("position_ids")
    if implementation is None or not isinstance(position_ids, torch.Tensor) or not _restarts(position_ids):
        return None
    if "flash" in implementation:
        return _flash_leak(inputs, position_ids)
    if inputs.get("attention_mask") is not None:
        return _mask_leak(implementation, inputs["attention_mask"])
    use_cache = inputs.get("use_cache")
    if use_cache is None:
        use_cache = getattr(_unwrap(model).config, "use_cache", False)
    if use_cache and inputs.get("past_key_values") is None:
        return (
            "the model's config has use_cache=True, so forward creates a KV cache and transformers does not look for "
            "packed documents in position_ids; pass use_cache=False with the batch (PackCollate(model=model) does)"
        )
    return None
