"""PyTorch Lightning: shardwise samplers work with the default ``Trainer`` settings.

What Lightning does, and why nothing is needed (Lightning 2.x, ``use_distributed_sampler=True``):

- an index sampler (``ShardedSampler``, ``WeightedSampler``, ``shard(...)``) is a
  ``DistributedSampler``, so Lightning leaves the DataLoader as it is and calls ``set_epoch``;
- a loader built with ``batch_sampler=<shardwise batch sampler>`` is rebuilt by Lightning, which
  re-creates the batch sampler through the record shardwise exposes: the rebuild returns the same
  object, already distributed (see ``shardwise._frameworks``);
- Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler``: on a shardwise batch sampler
  that attribute relays the epoch to it;
- with ``use_distributed_sampler=False`` Lightning touches nothing and shardwise resolves rank and
  world size from the process group itself.

For mid-epoch resume use a torchdata ``StatefulDataLoader``: Lightning saves rank 0's loader state
and loads it on every rank, which is right for shardwise because its state is global.

:class:`ShardwiseEpochCallback` is only for a shardwise sampler nested where Lightning does not
look (inside your own batch sampler or loader wrapper).
"""

from __future__ import annotations

from typing import Any

from .. import _set_epoch
from . import require

_lightning = require("lightning.pytorch", "lightning", "lightning", "lightning")

__all__ = ["ShardwiseEpochCallback"]

_Callback: Any = _lightning.Callback


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
