"""HF ``Trainer``: adaptive mixture weights from the loss the Trainer computes, per sample where it can.

:class:`AdaptiveMixtureMixin` goes before ``ShardwiseTrainer``'s base (or before TRL's trainers,
as ``ShardwiseTrainerMixin`` does) with ``train_sampler=MixtureSampler(..., weights=AdaptiveWeights(...))``
(or a ``PackedMixtureSampler`` with adaptive weights):

- ``compute_loss`` asks the model's outputs back and turns them into one loss per sample: for
  logits ``(B, T, V)`` with ``labels`` ``(B, T)`` (a causal LM; labels shifted as HF's models shift
  them, ``-100`` ignored) the mean token loss of each sequence, for logits ``(B, C)`` with labels
  ``(B,)`` each sample's cross-entropy; any other model reports the batch loss for every sample.
- With a ``PackedMixtureSampler`` (packed rows, weights in tokens) each token's loss goes to its
  document's source, read from the packed batch's ``sample_ids`` (``PackCollate``'s bookkeeping).
- Each sample's source comes from the plan, not the batch: the batch being trained is the next
  one the mixin counts (``ShardwiseTrainerMixin`` counts trained batches for its checkpoints), so
  its plan positions, and their sources, follow by arithmetic; the dataset needs no source column.
- ``training_step`` updates the weights when the interval ends, at the position the Trainer
  trained through (its loader and Accelerate prefetch ahead of it), on every rank at the same
  step. Checkpoints carry the ledger in ``shardwise_sampler.json`` with the position.

Example:
    >>> class Trainer(AdaptiveMixtureMixin, transformers.Trainer): ...  # doctest: +SKIP
    >>> sampler = MixtureSampler(data, AdaptiveWeights(Exp3(), interval=4096), num_samples=10**6)  # doctest: +SKIP
    >>> Trainer(model=model, args=args, train_dataset=data, train_sampler=sampler).train()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data.packed_batch import PackedBatch
from ..samplers.adaptive import AdaptiveMixture, PackedAdaptiveMixture
from ..samplers.mixture import MixtureSampler
from ..samplers.packed_mixture import PackedMixtureSampler
from . import require
from .transformers import ShardwiseTrainerMixin

_transformers = require("transformers", "transformers", "transformers", "adaptive_mixture")
_Trainer: Any = _transformers.Trainer

__all__ = ["AdaptiveMixtureMixin", "AdaptiveMixtureTrainer", "per_sample_losses", "per_token_losses"]


def per_sample_losses(outputs: Any, inputs: Any, loss: Any) -> np.ndarray:
    """One loss per sample from a model's outputs and inputs (float64); the batch loss for each where unknown."""
    import torch

    logits = getattr(outputs, "logits", None) if not isinstance(outputs, dict) else outputs.get("logits")
    labels = inputs.get("labels") if isinstance(inputs, dict) else None
    tokens = per_token_losses(outputs, inputs)
    with torch.no_grad():
        if tokens is not None:
            counted = (inputs["labels"][:, 1:] != -100).sum(dim=1).clamp(min=1)  # per_token_losses found them
            values = tokens.sum(dim=1) / counted
        elif logits is not None and labels is not None and logits.dim() == 2 and labels.dim() == 1:
            values = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
        else:
            rows = len(next(iter(inputs.values()))) if isinstance(inputs, dict) and inputs else 1
            values = loss.detach().float().reshape(1).expand(rows)
    return np.asarray(values.detach().cpu().double().numpy())


def per_token_losses(outputs: Any, inputs: Any) -> Any:
    """A causal LM's loss of predicting each token, ``(B, T - 1)``: position ``t`` predicts label ``t + 1``.

    As HF's models shift them; labels of ``-100`` (padding, a packed document's first token) have
    loss 0 here and are left out by the caller. ``None`` when the outputs hold no ``(B, T, V)``
    logits beside ``(B, T)`` labels.
    """
    import torch

    logits = getattr(outputs, "logits", None) if not isinstance(outputs, dict) else outputs.get("logits")
    labels = inputs.get("labels") if isinstance(inputs, dict) else None
    if logits is None or labels is None or logits.dim() != 3 or labels.dim() != 2:
        return None
    with torch.no_grad():
        targets = labels[:, 1:]
        shifted = logits[:, :-1].float().transpose(1, 2)  # (R, V, L - 1): cross_entropy's class dimension
        return torch.nn.functional.cross_entropy(shifted, targets, ignore_index=-100, reduction="none")


class AdaptiveMixtureMixin(ShardwiseTrainerMixin):
    """``ShardwiseTrainerMixin`` that reports each trained sample's loss to an adaptive ``MixtureSampler``.

    With any other sampler it behaves as ``ShardwiseTrainerMixin``. See the module docstring.
    """

    _packed_sample_ids: Any = None  # the packed batch being trained: each token's document (its bookkeeping)

    def _adaptive_sampler(self, model: Any) -> tuple[MixtureSampler | PackedMixtureSampler, AdaptiveMixture] | None:
        """The training sampler and its adaptive weights (``sampler.adaptive``) while the model trains, else None."""
        sampler = self.train_sampler
        if not getattr(model, "training", True) or not isinstance(sampler, (MixtureSampler, PackedMixtureSampler)):
            return None
        adaptive = sampler.adaptive
        return None if adaptive is None else (sampler, adaptive)

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        found = self._adaptive_sampler(model)
        if found is None or self._shardwise_position is None:
            return super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        sampler, adaptive = found
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        if isinstance(adaptive, PackedAdaptiveMixture):
            self._record_packed(adaptive, outputs, inputs)
        elif isinstance(sampler, MixtureSampler):
            values = per_sample_losses(outputs, inputs, loss)
            adaptive.record(values, self._batch_sources(sampler, len(values)))
        return (loss, outputs) if return_outputs else loss

    def _record_packed(self, adaptive: PackedAdaptiveMixture, outputs: Any, inputs: Any) -> None:
        """Each token's loss to its document's source, from the packed batch's ``sample_ids``."""
        found = per_token_losses(outputs, inputs)
        sample_ids = self._packed_sample_ids
        if found is None or sample_ids is None:
            raise ValueError(
                "AdaptiveMixtureTrainer with a PackedMixtureSampler reports each token's loss to its source: it needs "
                "(rows, length, vocabulary) logits beside (rows, length) labels from the model, and the packed batch "
                "of PackCollate(model=...) in rows (a flash-attention model's single flattened row works too)"
            )
        adaptive.record_predictions(found, inputs["labels"], sample_ids)

    def _batch_sources(self, sampler: MixtureSampler, count: int) -> np.ndarray:
        """The sources of the batch being trained: the next ``count`` units of this rank's pass."""
        position = self._shardwise_position
        if position is None or position.batch_size is None:
            raise RuntimeError("AdaptiveMixtureMixin needs the training loader ShardwiseTrainerMixin builds")
        plan = sampler.plan
        positions = plan.step_positions(position.epoch, position.start, sampler.world, position.trained,
                                        position.batch_size)[:count]  # fmt: skip
        return sampler.sources_at(position.epoch, plan.uncompacted(position.epoch, positions))

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        found = self._adaptive_sampler(model)
        if found is not None and isinstance(found[0], MixtureSampler) and isinstance(inputs, PackedBatch):
            # Rows are not samples: a loss per row, tagged with the first rows' sources, would be wrong silently.
            raise ValueError(
                "AdaptiveMixtureTrainer reads one loss per sample from a MixtureSampler's batches, but got packed "
                "batches (PackCollate): several documents share a row. Use shardwise.PackedMixtureSampler (weights "
                "in tokens, each token's loss reported to its source), or collate without packing"
            )
        # Trainer's _prepare_inputs keeps a packed batch's model inputs only: take its bookkeeping here.
        self._packed_sample_ids = getattr(inputs, "sample_ids", None) if isinstance(inputs, PackedBatch) else None
        loss = super().training_step(model, inputs, *args, **kwargs)  # counts the batch as trained
        position = self._shardwise_position
        if found is not None and position is not None:
            adaptive = found[1]
            trained = adaptive.trained_position(position.epoch, position.consumed())
            if adaptive.update_due(trained):
                adaptive.update(position=trained)
        return loss

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        found = self._adaptive_sampler(model)
        if found is not None:
            found[1].warn_if_pending()  # a checkpoint between updates misses this rank's recorded losses
        super()._save_checkpoint(model, trial)


class AdaptiveMixtureTrainer(AdaptiveMixtureMixin, _Trainer):  # type: ignore[misc]
    """``ShardwiseTrainer`` with adaptive mixture weights (``train_sampler=`` an adaptive ``MixtureSampler``).

    Example:
        >>> trainer = AdaptiveMixtureTrainer(model=model, args=args, train_dataset=data,  # doctest: +SKIP
        ...                                  train_sampler=sampler)
    """
