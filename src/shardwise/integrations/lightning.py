"""PyTorch Lightning: shardwise samplers work with the default ``Trainer`` settings.

What Lightning does, and why nothing is needed (Lightning 2.x, ``use_distributed_sampler=True``):

- an index sampler (``ShardedSampler``, ``WeightedSampler``, ``shard(...)``) is a
  ``DistributedSampler``, so Lightning leaves the DataLoader as it is and calls ``set_epoch``;
- a loader built with ``batch_sampler=<shardwise batch sampler>`` is rebuilt by Lightning, which
  re-creates the batch sampler through the record shardwise exposes: the rebuild returns the same
  object, already distributed (see ``shardwise.samplers.frameworks``);
- Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler``: on a shardwise batch sampler
  that attribute relays the epoch to it, also through the copy of its attributes that
  ``trainer.predict`` wraps it in (``_IndexBatchSamplerWrapper``); prediction keeps the sampler's
  own ``drop_last``, and one built with ``drop_last=True`` warns that it drops units;
- on resume with workers the first pass adopts the epoch Lightning will set once its loop has read
  the checkpoint, a step checkpoint at an epoch's last batch included;
- with ``use_distributed_sampler=False`` Lightning touches nothing and shardwise resolves rank and
  world size from the process group itself.

For mid-epoch resume use a torchdata ``StatefulDataLoader``: Lightning saves rank 0's loader state
and loads it on every rank, which is right for shardwise because its state is global.

:class:`FollowEpochLength` is needed when the number of batches changes from one epoch to the
next (a :class:`shardwise.BatchSizeSchedule`, or ``BucketBatchSampler(max_tokens=...)``, whose
batch count varies a little between epochs): Lightning reads the count once, when the loader is
set up, and would cut a longer later epoch short on every rank alike, skipping its last batches.

:class:`AdaptiveMixtureCallback` reports per-sample losses to a ``MixtureSampler`` with adaptive
weights and updates them when an interval ends (docs/mixture.md, "Adaptive weights").

:class:`ShardwiseEpochCallback` is only for a shardwise sampler nested where Lightning does not
look (inside your own batch sampler or loader wrapper).
"""

from __future__ import annotations

from typing import Any

from .._core.foreign import check, private
from ..samplers import set_epoch as _set_epoch
from ..samplers.adaptive import AdaptiveMixture, PackedAdaptiveMixture
from . import require

_lightning = require("lightning.pytorch", "lightning", "lightning", "lightning")
check("lightning")

__all__ = ["AdaptiveMixtureCallback", "FollowEpochLength", "ShardwiseEpochCallback"]

_Callback: Any = _lightning.Callback
_COMBINED_LOADER = private("lightning", "_combined_loader")  # FitLoop's
_TIME_INTERVAL = private("lightning", "_val_check_time_interval")  # Trainer's


class ShardwiseEpochCallback(_Callback):  # type: ignore[misc]
    """Calls :func:`shardwise.set_epoch` on every training loader at the start of each epoch.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[ShardwiseEpochCallback()], logger=False)  # doctest: +SKIP
    """

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        loaders = trainer.train_dataloader
        flattened = getattr(loaders, "flattened", None)
        for loader in flattened if flattened is not None else [loaders]:
            _set_epoch.set_epoch(loader, trainer.current_epoch)


class FollowEpochLength(_Callback):  # type: ignore[misc]
    """Re-reads the number of training batches at the start of every epoch.

    Lightning caps every epoch at the batch count it read when the training loader was set up
    (the combined loader's ``limits`` and ``fit_loop.max_batches``, and the validation step derived
    from them). When ``on_train_epoch_start`` runs, ``set_epoch`` has reached the sampler and the
    epoch's iterator is not made yet, so the exact ``len()`` of this epoch, equal on every rank,
    replaces those figures. It acts only with ``limit_train_batches=1.0`` (the default): a limit
    you set is kept. Uses Lightning's private loop attributes (listed in ``shardwise._core.foreign``).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[FollowEpochLength()], logger=False)  # doctest: +SKIP
    """

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        loop = trainer.fit_loop
        combined = getattr(loop, _COMBINED_LOADER, None)
        if combined is None or trainer.limit_train_batches != 1.0:
            return
        lengths = [len(loader) for loader in combined.flattened]
        combined.limits = lengths
        loop.max_batches = max(lengths)
        interval = trainer.val_check_interval
        if isinstance(interval, float) and getattr(trainer, _TIME_INTERVAL, None) is None:
            trainer.val_check_batch = max(1, int(loop.max_batches * interval))


class AdaptiveMixtureCallback(_Callback):  # type: ignore[misc]
    """Records each trained batch's losses in an adaptive mixture sampler; updates when due.

    ``training_step`` returns ``{"loss": loss, "sample_losses": (B,) losses, "sources": (B,) source
    numbers}`` (``sources`` may instead be in the batch, as ``Mixture(..., source_key="source")``
    puts it: ``batch["source"]``, or the last element of a tuple batch). After every batch the losses
    are recorded (local); when the interval ends every rank calls ``sampler.adaptive.update()`` (one all_reduce).
    Lightning runs checkpoint callbacks after this one, so a checkpoint at that step holds the update.

    With a ``PackedMixtureSampler`` (packed rows, weights in tokens), ``training_step`` returns
    ``{"loss": loss, "token_losses": (R, L - 1)}``, the loss of each predicted token (position ``t``
    predicting label ``t + 1``); each goes to its document's source, read from the batch's
    ``sample_ids``, and tokens labelled ``-100`` are left out.

    A ``ScheduledBatchSampler`` over such a ``MixtureSampler`` (progressive batch sizes, the loader's
    ``batch_sampler``) is reported to on its own ``adaptive``, whose clock is the steps it handed out.

    Args:
        sampler: the ``MixtureSampler`` or ``PackedMixtureSampler`` built with ``weights=AdaptiveWeights(...)``,
            or a ``ScheduledBatchSampler`` over such a ``MixtureSampler``.
        losses: the key of the per-sample losses in ``training_step``'s output.
        sources: the key of the sources in the output, else in a dict batch.
        tokens: the key of a packed batch's per-token losses in the output.

    Example:
        >>> trainer = Trainer(callbacks=[AdaptiveMixtureCallback(sampler)])  # doctest: +SKIP
    """

    def __init__(
        self, sampler: Any, *, losses: str = "sample_losses", sources: str = "source", tokens: str = "token_losses"
    ) -> None:
        super().__init__()
        self.sampler, self.losses, self.sources, self.tokens = sampler, losses, sources, tokens
        self._weights()  # a sampler of fixed weights is refused here, not at the first batch

    def _weights(self) -> AdaptiveMixture:
        """``sampler.adaptive``, read at each use: it is bound to the sampler (a resume replaces its plan)."""
        adaptive = getattr(self.sampler, "adaptive", None)
        if not isinstance(adaptive, AdaptiveMixture):
            raise ValueError(
                "AdaptiveMixtureCallback needs a MixtureSampler or PackedMixtureSampler built with "
                "weights=AdaptiveWeights(policy, interval=...), or a ScheduledBatchSampler over such a MixtureSampler, "
                f"but got sampler={self.sampler!r}"
            )
        return adaptive

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        adaptive = self._weights()
        if isinstance(outputs, dict) and self.tokens in outputs and isinstance(adaptive, PackedAdaptiveMixture):
            self._record_tokens(adaptive, outputs[self.tokens].detach(), batch)
        else:
            self._record_samples(adaptive, outputs, batch)
        if adaptive.update_due():
            adaptive.update()

    def _record_tokens(self, adaptive: PackedAdaptiveMixture, losses: Any, batch: Any) -> None:
        """A packed batch (``PackedMixtureSampler``): each predicted token's loss to its document's source."""
        labels = batch["labels"] if isinstance(batch, dict) and "labels" in batch else None
        sample_ids = getattr(batch, "sample_ids", None)
        if labels is None or sample_ids is None or losses.shape != labels[:, 1:].shape:
            raise ValueError(
                f"AdaptiveMixtureCallback reads {self.tokens!r} as the loss of each predicted token of a packed batch "
                "(rows, length - 1: position t predicts label t + 1) beside the batch's labels and sample_ids (a "
                f"PackCollate batch), but got {self.tokens} of shape {tuple(losses.shape)}"
            )
        adaptive.record_predictions(losses, labels, sample_ids)

    def _record_samples(self, adaptive: AdaptiveMixture, outputs: Any, batch: Any) -> None:
        if not isinstance(outputs, dict) or self.losses not in outputs:
            raise ValueError(
                f"AdaptiveMixtureCallback needs training_step to return a dict with {self.losses!r} (a loss per "
                f"sample), but it returned {type(outputs).__name__}"
            )
        if self.sources in outputs:
            sources = outputs[self.sources]
        elif isinstance(batch, dict) and self.sources in batch:
            sources = batch[self.sources]
        elif isinstance(batch, (list, tuple)) and batch:
            sources = batch[-1]
        else:
            raise ValueError(
                f"AdaptiveMixtureCallback found no sources: return them from training_step as {self.sources!r}, "
                'or build the data with shardwise.Mixture(..., source_key="source")'
            )
        adaptive.record(outputs[self.losses].detach(), sources)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._weights().warn_if_pending()  # a checkpoint between updates misses this rank's recorded losses
